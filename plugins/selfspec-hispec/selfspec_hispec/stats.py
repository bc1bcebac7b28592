"""HiSpec's own counters of one decode and the rates derived from them."""

from __future__ import annotations

COUNTERS = (
    "steps",
    "drafted",
    "li_accepted",
    "li_corrections",
    "buffered",
    "full_accepted",
    "fallbacks",
)


def rates(counters: dict[str, int]) -> dict[str, float | None]:
    """Intermediate acceptance (drafts L_i agrees with / drafts), full acceptance (buffer tokens
    the full model accepts / buffer tokens), and buffer tokens per full verification."""
    c = counters
    return {
        "intermediate_acceptance": c["li_accepted"] / c["drafted"] if c["drafted"] else None,
        "full_acceptance": c["full_accepted"] / c["buffered"] if c["buffered"] else None,
        "buffer_per_step": c["buffered"] / c["steps"] if c["steps"] else None,
    }
