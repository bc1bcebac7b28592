"""One losslessness example (:class:`Scenario`), a strategy for them, and the reach set.

A scenario is an architecture, a prompt, a token budget, optionally an EOS token picked
from the reference output (``eos_at``: its index there) so that EOS shows up mid-output and,
with drafts that get accepted, mid-draft, and how tokens are picked (``sampling``: ``None`` for
greedy decoding, else a :class:`selfspec.Sampling`; the reference is then plain sampling with
the same seed). :func:`scenarios` draws sampling settings for about half the examples and
:func:`sampled` is one fixed sampling example per architecture. A new dimension of the
examples (a dtype, say) is a field of :class:`Scenario` with a default, drawn in
:func:`scenarios`.

:func:`scenarios` draws prompt and output lengths over a wide range (:class:`Limits`) weighted
toward the boundaries of :data:`~selfspec.testing.strategies.BOUNDARIES` (plus a plugin's
own), most of them short so that examples stay cheap; never the trivial example (a 1-token
prompt and 1 new token), which Hypothesis would otherwise try first. :func:`reach` is the fixed
set every :class:`~selfspec.testing.PluginSuite` runs as explicit examples under any profile:
on *every* architecture a prompt past 512 tokens with an output past 256 (long prompt and
long output crossed, far past every sliding window), one output past 512 tokens, and a few
short edge cases; it is what makes the coverage check pass whatever the random draws.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

from selfspec._engine.contract.sampling import Sampling
from selfspec.testing._archs import ARCHS, POSITIONS
from selfspec.testing.strategies import TINY_VOCAB, boundary_lengths, prompt_ids, samplings

#: Longest prompt and output the strategies draw by default (the tiny models have
#: :data:`~selfspec.testing._archs.POSITIONS` positions); the longest outputs are the reach
#: set's, as drawn ones cost the most.
MAX_PROMPT = 768
MAX_NEW = 160
#: The reach set's lengths: on every architecture a prompt of ``LONG_PROMPT`` (+ up to 40)
#: tokens and an output of ``LONG_NEW``; on one architecture an output of ``LONGEST_NEW``.
LONG_PROMPT = 520
LONG_NEW = 260
LONGEST_NEW = 520


@dataclass(frozen=True)
class Scenario:
    """One example: ``arch``, ``prompt`` ids, ``max_new_tokens``, and ``eos_at``: None, the
    index in the reference output of the token to use as EOS, or a tuple of such indices
    (several EOS ids at once: the decode stops at the first of any of them); ``eos_rest``:
    every other token id that does not occur in the reference before its first EOS is an EOS
    id too, so a wrong draft token where the reference ends is another EOS id (a verifier
    that takes one EOS id for another commits it); ``near_ties``: decoded on the
    architecture's near-tie variant (``tiny_model(arch, near_ties=True)``)."""

    arch: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    eos_at: int | tuple[int, ...] | None = None
    label: str = ""
    sampling: Sampling | None = None
    near_ties: bool = False
    eos_rest: bool = False

    def __repr__(self) -> str:  # short: a long prompt is summarised (length, head, tail, hash)
        from selfspec.testing._report import summarise

        return (
            f"Scenario(arch={self.arch!r}, prompt={summarise(self.prompt)}, "
            f"max_new_tokens={self.max_new_tokens}, eos_at={self.eos_at}"
            f"{f', sampling={self.sampling}' if self.sampling else ''}"
            f"{', near_ties=True' if self.near_ties else ''}"
            f"{', eos_rest=True' if self.eos_rest else ''}"
            f"{f', label={self.label!r}' if self.label else ''})"
        )

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Hypothesis prints a falsifying example with its pretty printer: the short repr."""
        printer.text(repr(self))

    def as_json(self) -> dict[str, Any]:
        """Every field, the whole prompt included (the file a failure report names)."""
        return {
            "arch": self.arch,
            "prompt": list(self.prompt),
            "max_new_tokens": self.max_new_tokens,
            "eos_at": self.eos_at,
            "eos_rest": self.eos_rest,
            "label": self.label,
            "near_ties": self.near_ties,
            "sampling": None if self.sampling is None else repr(self.sampling),
        }


@dataclass(frozen=True)
class Limits:
    """How long drawn prompts and outputs get: ``max_prompt``, ``max_new`` and the model's
    ``positions`` (prompt + output must fit). :meth:`extended` widens them to a plugin's
    ``boundaries`` or says why it cannot; nothing is clipped silently."""

    max_prompt: int = MAX_PROMPT
    max_new: int = MAX_NEW
    positions: int = POSITIONS

    def extended(self, boundaries: Sequence[int]) -> Limits:
        """The limits, raised so that every boundary ``b`` (and ``b + 1``) can be drawn as a
        prompt length and as an output length; ``ValueError`` for a boundary the model's
        positions cannot hold."""
        if self.max_prompt < 1 or self.max_new < 1 or self.max_prompt + 1 > self.positions:
            raise ValueError(
                f"limits {self} leave no room: prompts and outputs need 1+ tokens "
                f"within {self.positions} positions"
            )
        top = max((int(b) for b in boundaries), default=0) + 1
        if top + 1 > self.positions:
            raise ValueError(
                f"boundary {top - 1} is past what the tiny models hold: a prompt or output of "
                f"{top} tokens needs {top + 1}+ of their {self.positions} positions; raise "
                f"max_position_embeddings (model_overrides) or drop the boundary"
            )
        return Limits(max(self.max_prompt, top), max(self.max_new, top), self.positions)


@st.composite
def scenarios(
    draw: st.DrawFn,
    archs: Sequence[str] = ARCHS,
    *,
    vocab_size: int = TINY_VOCAB,
    max_prompt: int = MAX_PROMPT,
    max_new: int = MAX_NEW,
    boundaries: Sequence[int] = (),
    positions: int = POSITIONS,
) -> Scenario:
    """A :class:`Scenario`; ``boundaries`` adds lengths that matter to a plugin (its buffer
    size, depth limit, cache capacity), each drawn with +-1 as a prompt and as an output
    length, raising ``max_prompt``/``max_new`` to reach them (:meth:`Limits.extended`:
    ``ValueError`` past ``positions``)."""
    lim = Limits(max_prompt, max_new, positions).extended(boundaries)
    arch = draw(st.sampled_from(list(archs)))
    n_prompt = draw(boundary_lengths(1, min(lim.max_prompt, lim.positions - 1), boundaries))
    prompt = draw(prompt_ids(n_prompt, vocab_size))
    n_new = draw(
        boundary_lengths(1, max(1, min(lim.max_new, lim.positions - n_prompt)), boundaries)
    )
    assume(
        n_prompt > 1 or n_new > 1
    )  # the simplest draw exercises nothing: spend the example elsewhere
    # EOS from the reference output costs no more decoding: the reference is kept per prompt
    eos_at = draw(st.one_of(st.none(), st.integers(0, n_new - 1)))
    sampling = draw(st.one_of(st.none(), samplings()))
    return Scenario(arch, tuple(prompt), n_new, eos_at, sampling=sampling)


def _motif(n: int, motif: Sequence[int], changes: int = 0, salt: str = "") -> tuple[int, ...]:
    """``motif`` repeated to ``n`` tokens, with ``changes`` tokens replaced at fixed places
    (drafts that go wrong midway)."""
    ids = (list(motif) * (n // len(motif) + 1))[:n]
    for j in range(changes):
        h = zlib.crc32(f"{salt}:{j}".encode())
        ids[h % n] = (h >> 16) % TINY_VOCAB
    return tuple(ids)


#: The reach set's motifs, one per architecture in turn: repetitive prompts make drafts of
#: n-gram and self-drafters be accepted, so acceptance paths run at long prompts.
_MOTIFS = ((5, 9, 17, 3), (11, 2, 7, 2, 30), (3, 4, 5), (1, 2), (40, 41, 42, 43, 44, 45, 46))


def reach(archs: Sequence[str] = ARCHS, positions: int = POSITIONS) -> list[Scenario]:
    """The fixed examples of every suite: a long one per architecture (a prompt of 520-552
    tokens, an output of 260), a 300-token prompt with a 520-token output (the second
    architecture), and short edge cases spread over the architectures (a window edge with EOS
    mid-output, deep repetitive drafts after a 200-token prompt, a one-token prompt with a
    130-token output)."""
    if LONG_PROMPT + 40 + LONG_NEW > positions or 300 + LONGEST_NEW > positions:
        raise ValueError(
            f"the reach set needs {LONG_PROMPT + 40 + LONG_NEW} positions; "
            f"the model has {positions}"
        )
    out = []
    for i, arch in enumerate(archs):
        prompt = _motif(LONG_PROMPT + 8 * i, _MOTIFS[i % len(_MOTIFS)], changes=3, salt=arch)
        out.append(Scenario(arch, prompt, LONG_NEW, None, "long prompt, long output"))
    base = [
        ("longest output", 300, LONGEST_NEW, None, (7, 30, 7, 2)),
        ("window edge, eos mid-output", 5, 24, 9, (3, 4, 5)),
        ("repetitive, deep drafts", 200, 40, None, (1, 2)),
        ("one-token prompt", 1, 130, None, (9,)),
    ]
    for i, (label, n_prompt, n_new, eos_at, motif) in enumerate(base):
        out.append(
            Scenario(archs[(i + 1) % len(archs)], _motif(n_prompt, motif), n_new, eos_at, label)
        )
    return out


def sampled_filters(arch: str) -> list[Scenario]:
    """Fixed sampling examples of ``arch`` with each filter on its own and both together:
    top-k alone, top-p alone, top-k and top-p (a sampler that forgets one of them differs
    from the reference within a few tokens at these settings)."""
    seed = zlib.crc32(f"filters:{arch}".encode())
    prompt = _motif(32, (7, 3, 9, 3, 1), changes=2, salt=arch)
    return [
        Scenario(arch, prompt, 24, None, label, Sampling(t, k, p, seed))
        for label, t, k, p in (
            ("sampled, top-k alone", 1.0, 3, 1.0),
            ("sampled, top-p alone", 1.0, 0, 0.6),
            ("sampled, top-k and top-p", 1.0, 4, 0.7),
        )
    ]


def several_eos(arch: str) -> Scenario:
    """A fixed example with two EOS ids, both tokens of the reference output (at new tokens 6
    and 3): the decode must stop at whichever comes first, exactly as ``generate`` does."""
    return Scenario(
        arch, _motif(24, (3, 4, 5), changes=2, salt=f"eos:{arch}"), 24, (6, 3), "several eos ids"
    )


def every_id_eos(arch: str) -> Scenario:
    """A fixed example where every token id is an EOS id (``eos_at=0`` with ``eos_rest``): the
    reference stops at its first token, so a first draft token other than the model's is one
    EOS id where the model predicts another; a repetitive prompt, so that drafters which copy
    from the prompt draft at the first step."""
    return Scenario(arch, _motif(24, (3, 4, 5)), 8, 0, "every id an eos id", eos_rest=True)


def eos_ids(
    ref: Sequence[int],
    eos_at: int | tuple[int, ...] | None,
    rest: bool = False,
    vocab_size: int = TINY_VOCAB,
) -> tuple[int, ...]:
    """The EOS ids of an example whose reference output (decoded without EOS) is ``ref``: the
    tokens at the indices ``eos_at`` (clipped to the output), and with ``rest`` every id of
    the vocabulary the reference does not hold before its first EOS (see :class:`Scenario`)."""
    if eos_at is None or not ref:
        return ()
    at = eos_at if isinstance(eos_at, tuple) else (eos_at,)
    eos = tuple(dict.fromkeys(ref[min(i, len(ref) - 1)] for i in at))
    if not rest:
        return eos
    stop = next(i for i, t in enumerate(ref) if t in eos)
    before = set(ref[:stop])
    return eos + tuple(t for t in range(vocab_size) if t not in before and t not in eos)


def last_position(arch: str, positions: int = POSITIONS) -> Scenario:
    """A fixed example whose output ends at the model's last position: a prompt of
    ``positions - 24`` tokens and 24 new tokens (a clamp of positions anywhere below the limit
    changes the output)."""
    return Scenario(
        arch,
        _motif(positions - 24, (11, 2, 7, 2, 30), changes=3, salt=f"end:{arch}"),
        24,
        None,
        "to the last position",
    )


def near_tied(arch: str) -> Scenario:
    """A fixed greedy example on the near-tie variant of ``arch``'s tiny model (twin tokens whose
    logits differ by a few 1e-4: the top-1/top-2 margin is below 1e-3 almost everywhere), a
    repetitive 48-token prompt and 40 new tokens, so drafts hold the wrong twin often: a
    verifier that accepts a draft token near the top-1 commits it, which float64 never allows."""
    return Scenario(
        arch,
        _motif(48, (3, 4, 5, 6), changes=2, salt=f"ties:{arch}"),
        40,
        None,
        "near-ties",
        near_ties=True,
    )


def sampled(arch: str) -> Scenario:
    """The fixed sampling example of ``arch`` every suite runs: a repetitive 40-token prompt,
    40 new tokens at temperature 0.3, top-p 0.9, so that drafts are accepted under sampling
    (on most architectures: the tiny models repeat themselves less when they sample)."""
    import zlib

    return Scenario(
        arch,
        _motif(40, (7, 3, 9, 3, 1)),
        40,
        None,
        "sampled",
        Sampling(0.3, 0, 0.9, zlib.crc32(arch.encode())),
    )
