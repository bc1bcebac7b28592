"""The counters of one decode (:class:`Stats`), filled by the host and carried by its result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Stats:
    """Counters of one decode. ``tau`` = committed tokens per full-model forward.

    ``extra``: the plugin's own counters (``state.stats.extra["pool_hits"] += 1``; numbers,
    under names of its choice), carried by :meth:`as_dict` (``specdec --json``) and by
    ``specdec bench`` (each record's ``extra``, summed per task and method in the summary;
    [where a plugin's counters go](docs/faq.md#where-do-a-plugins-own-counters-go)).
    """

    #: tokens the decode committed after the prompt
    new_tokens: int = 0
    #: decode steps (propose -> verify -> commit)
    steps: int = 0
    #: draft nodes proposed (after the host's cut), every sibling of a tree included
    drafted: int = 0
    #: draft tokens accepted
    accepted: int = 0
    #: the sum over steps of each draft's depth (its deepest node; a chain's length): the
    #: denominator of :attr:`path_acceptance`
    drafted_depth: int = 0
    #: full-model forwards the verifications cost (the denominator of :attr:`tau`)
    forwards: float = 0.0
    #: drafts the host cut to the depth or cache limits
    truncated_drafts: int = 0
    #: the decode's wall time, prefill included, in seconds
    wall_time_s: float = 0.0
    #: the prefill's wall time, in seconds
    prefill_s: float = 0.0
    #: seconds per phase of a step (each hook, and each ``state.timed`` block under its key)
    phase_s: dict[str, float] = field(default_factory=dict)
    #: the accepted draft tokens of every step
    accept_lengths: list[int] = field(default_factory=list)
    #: the runner's weight layout this decode ran with (``"packed"``, ``"model"``, ...: what
    #: ``"auto"`` resolved to on this device, dtype and CPU)
    weight_layout: str = ""
    #: how each ``auto`` of this decode was decided: ``{"weight_layout": {...},
    #: "draft_weights": {...}}``, each with ``chosen``, ``how`` (``measured``, ``cached, ...`` or
    #: ``static: <why>``) and every candidate's measured ``seconds`` per block width
    #: (:mod:`selfspec._engine.tuning.calibration`)
    choices: dict[str, Any] = field(default_factory=dict)
    #: bytes of product weights the decode's forwards read after the prefill (the model's own
    #: per full forward, the draft weights' per draft pass): what bounds it on a CPU
    #: ([performance.md](docs/performance.md), "The machine's limit")
    weight_bytes: int = 0
    #: a composed decode's members (``lookup+selfsd``): per member, steps it ``proposed`` in and was
    #: ``skipped`` by the cheap-first rule, nodes it ``drafted`` into the verified tree, its tokens
    #: ``accepted`` (what its own draft alone would have had accepted), steps its accepted path was
    #: the ``longest``; empty for one plugin ([composition.md](docs/composition.md))
    members: dict[str, dict[str, int]] = field(default_factory=dict)
    #: the plugin's own counters (numbers), see the class docstring
    extra: dict[str, float] = field(default_factory=dict)
    #: the model's placement when accelerate dispatched it (:attr:`selfspec.Runner.placement`:
    #: layers per device, offloaded layers), else ``None`` (one device)
    placement: dict[str, Any] | None = None

    @property
    def tau(self) -> float:
        """Committed tokens per full-model forward (τ): comparable between any two methods."""
        # Prefill caches the prompt but the pending token; every output token comes from a step.
        return self.new_tokens / self.forwards if self.forwards else 0.0

    @property
    def acceptance(self) -> float:
        """Accepted draft tokens over drafted nodes. A tree's siblings are all counted as drafted
        though at most one per depth can be accepted, so it is comparable only between chain
        drafters; :attr:`path_acceptance` compares chains with trees ([acceptance of a
        tree](docs/faq.md#acceptance-of-a-tree-beside-a-chains-acceptance-path_acceptance))."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def path_acceptance(self) -> float:
        """Accepted draft tokens over the drafts' depths: the share of each draft's depth the
        accepted path reached. Equal to :attr:`acceptance` for chains, and comparable between
        chains and trees (a tree counts one node per depth, as its accepted path does)."""
        return self.accepted / self.drafted_depth if self.drafted_depth else 0.0

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second of wall time."""
        return self.new_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (``specdec --json``'s ``stats``), ``extra`` included."""
        return {
            "new_tokens": self.new_tokens,
            "wall_time_s": self.wall_time_s,
            "tokens_per_s": self.tokens_per_s,
            "steps": self.steps,
            "tau": self.tau,
            "acceptance": self.acceptance,
            "path_acceptance": self.path_acceptance,
            "drafted": self.drafted,
            "drafted_depth": self.drafted_depth,
            "accepted": self.accepted,
            "forwards": self.forwards,
            "truncated_drafts": self.truncated_drafts,
            "prefill_s": self.prefill_s,
            "phase_s": dict(self.phase_s),
            "accept_lengths": list(self.accept_lengths),
            "weight_layout": self.weight_layout,
            "choices": dict(self.choices),
            "weight_bytes": self.weight_bytes,
            **({"members": {k: dict(v) for k, v in self.members.items()}} if self.members else {}),
            "extra": dict(self.extra),
            **({"placement": self.placement} if self.placement is not None else {}),
        }
