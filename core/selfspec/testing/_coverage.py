"""What a losslessness property test exercised, counted per example, and the buckets it must hit.

Every example a :class:`~selfspec.testing.PluginSuite` runs is recorded from its scenario and the
decode's audit log (:class:`selfspec._engine.contract.audit.Auditor`): the architecture, prompt and
output length buckets (closed ranges up to ``>512``), how many steps the decode ran, the deepest
draft, steps with accepted drafts, chain or tree drafts, a step at the sliding window's edge, EOS
inside the accepted tokens, drafts cut at the depth limit, sampling (``sampled``, and
``sampled-accepted`` when a draft was accepted under sampling), and per architecture whether it saw
a long prompt (``prompt>512@<arch>``) and a long output (``output>256@<arch>``). Each bucket is also
a Hypothesis ``event`` (``--hypothesis-show-statistics`` shows them).

:data:`REQUIRED` are the buckets a suite fails without, plus :data:`REQUIRED_PER_ARCH` for
every architecture it tests; a suite drops one with a reason (``coverage_exempt``), never
silently. ``pytest --selfspec-coverage`` prints every suite's report at the end of the run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

#: Length buckets, closed except the last: (lowest length, name).
LENGTHS: tuple[tuple[int, str], ...] = (
    (513, ">512"),
    (257, "257-512"),
    (129, "129-256"),
    (33, "33-128"),
    (9, "9-32"),
    (1, "1-8"),
    (0, "0"),
)
#: Buckets every plugin's property test must reach (besides :data:`REQUIRED_PER_ARCH`).
REQUIRED: tuple[str, ...] = (
    "prompt:129-256",
    "prompt:257-512",
    "prompt:>512",
    "output:129-256",
    "output:257-512",
    "output:>512",
    "steps>=128",
    "steps>=256",
    "late>=64",
    "accepted>=1",
    "depth>=4",
    "window-edge",
    "sampled",
)
#: Buckets every architecture of a suite must reach (``{arch}`` is its name).
REQUIRED_PER_ARCH: tuple[str, ...] = ("arch:{arch}", "prompt>512@{arch}", "output>256@{arch}")


def length_bucket(n: int) -> str:
    return next(name for lo, name in LENGTHS if n >= lo)


class Coverage:
    """Counts of examples per bucket for one suite (one plugin, one class)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.examples = 0
        self.counts: Counter[str] = Counter()
        self.accepting = 0  # examples with at least one accepted draft token
        self.accepted_steps = 0
        self.steps = 0
        self.done: set[str] = set()  # architectures whose property test ran to the end

    def record(
        self,
        arch: str,
        prompt_len: int,
        result: Any,
        auditor: Any,
        window: int | None,
        eos: Iterable[int] = (),
        sampled: bool = False,
    ) -> list[str]:
        """Count one example; returns its buckets (also sent as Hypothesis events)."""
        eos = set(eos)
        steps = list(auditor.steps)
        out = len(result.output_ids)
        buckets = {
            f"arch:{arch}",
            f"prompt:{length_bucket(prompt_len)}",
            f"output:{length_bucket(out)}",
        }
        if prompt_len > 512:
            buckets.add(f"prompt>512@{arch}")
        if out > 256:
            buckets.add(f"output>256@{arch}")
        for n in (128, 256):
            if len(steps) >= n:
                buckets.add(f"steps>={n}")
        depth = max((s.depth for s in steps), default=0)
        buckets.add(f"depth:{depth if depth < 4 else '4-7' if depth < 8 else '8+'}")
        if depth >= 4:
            buckets.add("depth>=4")
        if any(s.accepted >= 1 for s in steps):
            buckets.add("accepted>=1")
        if any(s.accepted >= 4 for s in steps):
            buckets.add("accepted>=4")
        for n in (64, 200):
            if any(s.generated >= n and s.drafted for s in steps):
                buckets.add(f"late>={n}")
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
        self.accepting += any(s.accepted for s in steps)
        self.counts.update(buckets)
        return sorted(buckets)

    def missing(self, archs: Sequence[str], exempt: Iterable[str] = ()) -> list[str]:
        """Required buckets (:data:`REQUIRED_PER_ARCH` of every one of ``archs``, and
        :data:`REQUIRED`) never hit, but those in ``exempt``."""
        skip = set(exempt)
        need = [b.format(arch=a) for a in archs for b in REQUIRED_PER_ARCH] + list(REQUIRED)
        return [b for b in need if not self.counts[b] and b not in skip]

    def report(self) -> str:
        """The counts (examples per bucket), one bucket per line, in name order."""
        lines = [
            f"selfspec coverage of {self.name}: {self.examples} examples ({self.accepting} with "
            f"an accepted draft token); {self.steps} decode steps ({self.accepted_steps} accepted "
            f"a draft token); examples per bucket:"
        ]
        for b in sorted(self.counts):
            lines.append(f"  {b:<20} {self.counts[b]:>4}")
        return "\n".join(lines)


#: Every suite's coverage in this process, by suite name (what ``--selfspec-coverage`` prints).
REGISTRY: dict[str, Coverage] = {}


def coverage_for(name: str) -> Coverage:
    if name not in REGISTRY:
        REGISTRY[name] = Coverage(name)
    return REGISTRY[name]
