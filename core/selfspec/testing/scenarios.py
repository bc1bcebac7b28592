"""One losslessness example (:class:`Scenario`), a strategy for them, and the reach set.

A scenario is an architecture, a prompt, a token budget, optionally an EOS token picked
from the reference output (``eos_at``: its index there) so that EOS shows up mid-output and,
with drafts that get accepted, mid-draft, and how tokens are picked (``sampling``: ``None`` for
greedy decoding, else a :class:`selfspec.Sampling`; the reference is then plain sampling with
the same seed). :func:`scenarios` draws sampling settings for about half the examples and
:func:`sampled` is one fixed sampling example per architecture.

:func:`scenarios` draws prompt and output lengths over a wide range weighted toward the
boundaries of :data:`~selfspec.testing.strategies.BOUNDARIES` (plus a plugin's own), most of
them short so that examples stay cheap. :func:`reach` is the fixed set every
:class:`~selfspec.testing.PluginSuite` runs as explicit examples under any profile: a long
prompt (257 tokens), a long output (129), a prompt just past 128, a window edge with EOS
mid-output, and a repetitive prompt that makes drafts be accepted deep, spread over the
architectures; it is what makes the coverage check pass whatever the random draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import strategies as st

from ..sampling import Sampling
from .archs import ARCHS
from .strategies import TINY_VOCAB, boundary_lengths, prompt_ids, samplings

#: Longest prompt and output the strategies draw (the tiny models have 1024 positions); longer
#: outputs are the reach set's (129 tokens), as drawn ones cost the most.
MAX_PROMPT = 300
MAX_NEW = 72


@dataclass(frozen=True)
class Scenario:
    """One example: ``arch``, ``prompt`` ids, ``max_new_tokens``, and ``eos_at``: None, or
    the index in the reference output of the token to use as EOS."""

    arch: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    eos_at: int | None = None
    label: str = ""
    sampling: Sampling | None = None

    def __repr__(self) -> str:  # short enough to read in a falsifying example
        p = list(self.prompt)
        shown = p if len(p) <= 12 else f"{p[:6]}...+{len(p) - 6}"
        return (f"Scenario(arch={self.arch!r}, prompt={shown} ({len(p)} tokens), "
                f"max_new_tokens={self.max_new_tokens}, eos_at={self.eos_at}"
                f"{f', sampling={self.sampling}' if self.sampling else ''}"
                f"{f', label={self.label!r}' if self.label else ''})")


@st.composite
def scenarios(draw: st.DrawFn, archs: Sequence[str] = ARCHS, *, vocab_size: int = TINY_VOCAB,
              max_prompt: int = MAX_PROMPT, max_new: int = MAX_NEW,
              boundaries: Sequence[int] = ()) -> Scenario:
    """A :class:`Scenario`; ``boundaries`` adds lengths that matter to a plugin (its buffer
    size, depth limit, cache capacity), each drawn with +-1."""
    arch = draw(st.sampled_from(list(archs)))
    n_prompt = draw(boundary_lengths(1, max_prompt, boundaries))
    prompt = draw(prompt_ids(n_prompt, vocab_size))
    n_new = draw(boundary_lengths(1, max_new, boundaries))
    # EOS from the reference output costs one more reference decode: only for short outputs
    eos_at = draw(st.one_of(st.none(), st.integers(0, n_new - 1))) if n_new <= 48 else None
    sampling = draw(st.one_of(st.none(), samplings()))
    return Scenario(arch, tuple(prompt), n_new, eos_at, sampling=sampling)


def _motif(n: int, motif: Sequence[int]) -> tuple[int, ...]:
    return tuple((list(motif) * (n // len(motif) + 1))[:n])


def reach(archs: Sequence[str] = ARCHS) -> list[Scenario]:
    """The fixed examples of every suite; one architecture each, in turn over ``archs``."""
    base = [
        ("long prompt", 257, 33, None, (5, 9, 17, 3)),
        ("long output", 17, 129, None, (3, 4, 5)),
        ("prompt past 128", 129, 17, None, (11, 2, 7, 2, 30)),
        ("window edge, eos mid-output", 5, 24, 9, (3, 4, 5)),
        ("repetitive, deep drafts", 64, 40, None, (1, 2)),
    ]
    out = []
    for i, (label, n_prompt, n_new, eos_at, motif) in enumerate(base):
        out.append(Scenario(archs[(i + 1) % len(archs)], _motif(n_prompt, motif), n_new, eos_at, label))
    return out


def sampled(arch: str) -> Scenario:
    """The fixed sampling example of ``arch`` every suite runs: a repetitive 40-token prompt,
    40 new tokens at temperature 0.3, top-p 0.9, so that drafts are accepted under sampling
    (on most architectures: the tiny models repeat themselves less when they sample)."""
    import zlib

    return Scenario(arch, _motif(40, (7, 3, 9, 3, 1)), 40, None, "sampled",
                    Sampling(0.3, 0, 0.9, zlib.crc32(arch.encode())))
