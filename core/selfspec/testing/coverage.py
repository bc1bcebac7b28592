"""What a losslessness property test exercised, counted per example, and the buckets it must hit.

Every example a :class:`~selfspec.testing.PluginSuite` runs is recorded from its scenario and
the decode's audit log (:class:`selfspec.audit.Auditor`): the architecture, prompt and output
length buckets, the deepest draft, steps with accepted drafts, chain or tree drafts, a step at
the sliding window's edge, EOS inside the accepted tokens, drafts cut at the depth limit,
sampling (``sampled``, and ``sampled-accepted`` when a draft was accepted under sampling). Each
bucket is also a Hypothesis ``event`` (``--hypothesis-show-statistics`` shows them).

:data:`REQUIRED` are the buckets a suite fails without (plus one ``arch:`` bucket per
architecture it tests); a suite drops one with a reason (``coverage_exempt``), never silently.
``pytest --selfspec-coverage`` prints every suite's report at the end of the run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

#: Buckets every plugin's property test must reach (besides every architecture).
REQUIRED: tuple[str, ...] = ("prompt>=129", "output>=129", "late>=64", "accepted>=1", "depth>=4",
                             "window-edge", "sampled")

_LENGTHS = ((129, ">=129"), (33, " 33-128"), (9, "  9-32"), (1, "  1-8"), (0, "  0"))


def length_bucket(n: int) -> str:
    return next(name for lo, name in _LENGTHS if n >= lo).strip()


class Coverage:
    """Counts of examples per bucket for one suite (one plugin, one class)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.examples = 0
        self.counts: Counter[str] = Counter()
        self.accepted_steps = 0
        self.steps = 0
        self.done: set[str] = set()  # architectures whose property test ran to the end

    def record(self, arch: str, prompt_len: int, result: Any, auditor: Any, window: int | None,
               eos: Iterable[int] = (), sampled: bool = False) -> list[str]:
        """Count one example; returns its buckets (also sent as Hypothesis events)."""
        eos = set(eos)
        steps = list(auditor.steps)
        out = len(result.output_ids)
        buckets = {f"arch:{arch}", f"prompt:{length_bucket(prompt_len)}", f"output:{length_bucket(out)}"}
        depth = max((s.depth for s in steps), default=0)
        buckets.add(f"depth:{depth if depth < 4 else '4-7' if depth < 8 else '8+'}")
        if prompt_len >= 129:
            buckets.add("prompt>=129")
        if out >= 129:
            buckets.add("output>=129")
        if depth >= 4:
            buckets.add("depth>=4")
        if any(s.accepted >= 1 for s in steps):
            buckets.add("accepted>=1")
        if any(s.accepted >= 4 for s in steps):
            buckets.add("accepted>=4")
        if any(s.generated >= 64 and s.drafted for s in steps):
            buckets.add("late>=64")
        for s in steps:
            if s.drafted:
                buckets.add("tree" if s.tree else "chain")
            if window is not None and abs((s.length - 1) - window) <= 1:
                buckets.add("window-edge")
            if eos and any(t in eos for t in s.committed[:-1]):
                buckets.add("eos-mid-draft")
        if eos and result.output_ids and result.output_ids[-1] in eos:
            buckets.add("eos")
        if sampled:
            buckets.add("sampled")
            if any(s.accepted >= 1 for s in steps):
                buckets.add("sampled-accepted")
        if result.stats.truncated_drafts:
            buckets.add("draft-cut")
        self.examples += 1
        self.steps += len(steps)
        self.accepted_steps += sum(1 for s in steps if s.accepted)
        self.counts.update(buckets)
        return sorted(buckets)

    def missing(self, archs: Sequence[str], exempt: Iterable[str] = ()) -> list[str]:
        """Required buckets (every ``arch:`` of ``archs`` and :data:`REQUIRED`) never hit."""
        skip = set(exempt)
        need = [f"arch:{a}" for a in archs] + [b for b in REQUIRED if b not in skip]
        return [b for b in need if not self.counts[b]]

    def report(self) -> str:
        """The counts, one bucket per line, grouped by kind."""
        lines = [f"selfspec coverage of {self.name}: {self.examples} examples, {self.steps} steps, "
                 f"{self.accepted_steps} with accepted drafts"]
        for b in sorted(self.counts):
            lines.append(f"  {b:<16} {self.counts[b]:>4}")
        return "\n".join(lines)


#: Every suite's coverage in this process, by suite name (what ``--selfspec-coverage`` prints).
REGISTRY: dict[str, Coverage] = {}


def coverage_for(name: str) -> Coverage:
    if name not in REGISTRY:
        REGISTRY[name] = Coverage(name)
    return REGISTRY[name]
