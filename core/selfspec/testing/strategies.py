"""Hypothesis strategies for losslessness tests: architectures, prompts, lengths, options, drafts.

In a plugin's tests::

    from hypothesis import given
    from selfspec.testing import strategies as sst

    @given(arch=sst.archs(), prompt=sst.prompts(128), n=sst.lengths())
    def test_lossless(arch, prompt, n, tiny_model_factory):
        assert_lossless(tiny_model_factory(arch), "mine", prompt, n)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import strategies as st

from selfspec._engine.contract.options import Option, OptionError
from selfspec.testing._archs import ARCHS

#: Largest vocabulary id drawn by default: the tiny models' vocabulary size.
TINY_VOCAB = 128


#: Lengths where bugs live: powers of two +-1 (buffers, capacities, index wrap), and the tiny
#: models' sliding windows +-1 (4 in Mistral/Qwen2, 3 in Gemma 3).
BOUNDARIES: tuple[int, ...] = tuple(
    sorted({2, 3, 4, 5, 6} | {n for k in range(3, 10) for n in (2**k - 1, 2**k, 2**k + 1)})
)


def archs() -> st.SearchStrategy[str]:
    """One of :data:`~selfspec.testing.ARCHS`."""
    return st.sampled_from(ARCHS)


def prompts(
    vocab_size: int = TINY_VOCAB, min_len: int = 1, max_len: int = 24
) -> st.SearchStrategy[list[int]]:
    """Prompt token ids in ``[0, vocab_size)``; some with repeats (what n-gram drafters feed on)."""
    ids = st.integers(0, vocab_size - 1)
    plain = st.lists(ids, min_size=min_len, max_size=max_len)
    # a few ids repeated: repetitive prompts make lookup-style drafters propose
    small = st.lists(st.integers(0, min(vocab_size, 6) - 1), min_size=min_len, max_size=max_len)
    return st.one_of(plain, small)


def lengths(min_value: int = 1, max_value: int = 40) -> st.SearchStrategy[int]:
    """``max_new_tokens`` values."""
    return st.integers(min_value, max_value)


def boundary_lengths(
    min_value: int, max_value: int, boundaries: Sequence[int] = (), short: int = 24
) -> st.SearchStrategy[int]:
    """Lengths over a wide range, weighted toward where bugs live: short values (cheap, most
    examples: half the draws), the boundaries (:data:`BOUNDARIES` and ``boundaries``, e.g. a
    plugin's buffer size or depth limit, each +-1) inside ``[min_value, max_value]``, and
    anything in range."""
    marks = {b + d for b in boundaries for d in (-1, 0, 1)} | set(BOUNDARIES)
    marks = sorted(m for m in marks if min_value <= m <= max_value)
    cheap = st.integers(min_value, max(min_value, min(short, max_value)))
    parts = [cheap, cheap]
    if marks:
        parts.append(st.sampled_from(marks))
    parts.append(st.integers(min_value, max_value))
    return st.one_of(parts)


@st.composite
def prompt_ids(draw: st.DrawFn, length: int, vocab_size: int = TINY_VOCAB) -> list[int]:
    """``length`` token ids: free, from a few ids, or a motif repeated with a few changes
    (repetition makes n-gram and self-drafts get accepted, so acceptance paths run)."""
    kind = draw(st.sampled_from(["motif", "free", "few"]))
    if kind == "free":
        return draw(st.lists(st.integers(0, vocab_size - 1), min_size=length, max_size=length))
    if kind == "few":
        return draw(
            st.lists(st.integers(0, min(vocab_size, 6) - 1), min_size=length, max_size=length)
        )
    motif = draw(st.lists(st.integers(0, vocab_size - 1), min_size=1, max_size=8))
    ids = (motif * (length // len(motif) + 1))[:length]
    for _ in range(draw(st.integers(0, 2))):  # a few changed tokens: drafts that go wrong midway
        ids[draw(st.integers(0, length - 1))] = draw(st.integers(0, vocab_size - 1))
    return ids


def option_values(opt: Option) -> st.SearchStrategy[Any]:
    """Valid values of one declared option (choices, bounded numbers, booleans)."""
    if opt.choices is not None:
        base: st.SearchStrategy[Any] = st.sampled_from(list(opt.choices))
    elif opt.type is bool:
        base = st.booleans()
    elif opt.type is int:
        lo = int(math.ceil(opt.min)) if opt.min is not None else None
        hi = int(math.floor(opt.max)) if opt.max is not None else None
        # unbounded sides get a small range around the default: huge values only cost time
        anchor = opt.default if isinstance(opt.default, int) else (lo if lo is not None else 0)
        if lo is None:
            lo = min(0, anchor, hi if hi is not None else 0)
        if hi is None:
            hi = max(anchor, lo) + 8
        base = st.integers(lo, hi)
    elif opt.type is float:
        anchor = float(opt.default) if opt.default is not None else 0.0
        lo = float(opt.min) if opt.min is not None else anchor - 1.0
        hi = float(opt.max) if opt.max is not None else max(anchor, lo) + 1.0
        base = st.floats(lo, hi, allow_nan=False, allow_infinity=False)
    elif opt.default is not None:
        base = st.just(opt.default)
    else:
        base = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=8)
    if opt.default is not None:
        base = st.one_of(st.just(opt.default), base)

    def valid(v: Any) -> bool:
        try:
            opt.convert(v)
        except OptionError:
            return False
        return True

    return base.filter(valid)


def options(
    declared: Mapping[str, Option],
    *,
    fixed: Mapping[str, Any] | None = None,
    strategies: Mapping[str, Any] | None = None,
    model: Any = None,
) -> st.SearchStrategy[dict[str, Any]]:
    """A dict of valid values for some of a plugin's declared options (the rest keep defaults).

    ``declared`` is what :func:`selfspec._engine.contract.plugins.declared_options` returns;
    ``fixed`` pins some options to given values; ``strategies`` replaces the drawing of some (to
    constrain them: ``{"num_draft": st.integers(1, 8)}``). A value of ``strategies`` may also be a
    callable taking ``model`` and returning the strategy, for options whose valid values depend on
    the model (its device, its number of layers): :func:`draft_weights` is one.
    """
    fixed = dict(fixed or {})
    given = {
        k: v if isinstance(v, st.SearchStrategy) else v(model)
        for k, v in (strategies or {}).items()
    }
    free = {
        name: given.get(name, option_values(opt))
        for name, opt in declared.items()
        if name not in fixed
    }
    if not free:
        return st.just(fixed)
    return st.fixed_dictionaries({}, optional=free).map(lambda d: {**d, **fixed})


def draft_weights(model: Any, choices: Sequence[str] | None = None) -> st.SearchStrategy[str]:
    """The draft-weights backends (the ``draft_weights`` option) among ``choices`` (default:
    every registered draft format) that run for ``model`` on this machine: each format's own
    ``unsupported`` decides (the int8 and 4-bit library products on the CPU, ``bnb-*`` where
    bitsandbytes is installed). Give it as an option strategy that takes the model:
    ``option_strategies = {"draft_weights": lambda m: sst.draft_weights(m, ("int8", "bf16"))}``.
    Raises ``ValueError`` when none of ``choices`` runs there."""
    from selfspec._engine.drafting.draftweights import BACKENDS, DraftWeightsError
    from selfspec._engine.drafting.draftweights.shadow import resolve_backend
    from selfspec._engine.runner.placement import model_device

    device = model_device(model)  # where its inputs go (an offloaded model's execution device)
    runs = []
    for backend in choices if choices is not None else BACKENDS:
        try:
            resolve_backend(backend, device, next(model.parameters()).dtype)
        except DraftWeightsError:
            continue
        runs.append(backend)
    if not runs:
        raise ValueError(
            f"none of the draft weights {list(choices or BACKENDS)} runs on {device} here"
        )
    return st.sampled_from(runs)


def samplings(max_temperature: float = 2.0) -> st.SearchStrategy[Any]:
    """:class:`selfspec.Sampling` settings that sample: temperature in ``(0, max_temperature]``,
    top-k off or 1-64, top-p off or in [0.3, 1), any 32-bit seed."""
    from selfspec._engine.contract.sampling import Sampling

    temperature = st.one_of(
        st.sampled_from([1.0, 0.7, max_temperature]),
        st.floats(0.05, max_temperature, allow_nan=False),
    )
    top_k = st.one_of(st.just(0), st.integers(1, 64))
    top_p = st.one_of(st.just(1.0), st.floats(0.3, 0.99, allow_nan=False))
    return st.builds(Sampling, temperature, top_k, top_p, st.integers(0, 2**32 - 1))


@st.composite
def trees(
    draw: st.DrawFn, vocab_size: int = TINY_VOCAB, min_nodes: int = 1, max_nodes: int = 8
) -> tuple[list[int], list[int]]:
    """``(tokens, parents)`` of a random tree draft: ``parents[i] < i``, ``-1`` = the pending
    token."""
    n = draw(st.integers(min_nodes, max_nodes))
    tokens = draw(st.lists(st.integers(0, vocab_size - 1), min_size=n, max_size=n))
    parents = [draw(st.integers(-1, i - 1)) for i in range(n)]
    return tokens, parents


def chains(
    vocab_size: int = TINY_VOCAB, min_len: int = 0, max_len: int = 8
) -> st.SearchStrategy[list[int]]:
    """Token ids of a chain draft."""
    return st.lists(st.integers(0, vocab_size - 1), min_size=min_len, max_size=max_len)


def drafts(
    vocab_size: int = TINY_VOCAB, max_nodes: int = 8, kind: str = "any", device: Any = "cpu"
) -> st.SearchStrategy[Any]:
    """:class:`~selfspec.Draft` values: ``kind`` is ``"chain"``, ``"tree"`` or ``"any"``."""
    import torch

    from selfspec._engine.contract.types import Draft

    def as_tree(tp: tuple[list[int], list[int]]) -> Draft:
        tokens, parents = tp
        return Draft(
            torch.tensor(tokens, dtype=torch.long, device=device),
            torch.tensor(parents, dtype=torch.long, device=device),
        )

    chain = chains(vocab_size, 0, max_nodes).map(lambda t: Draft.chain(t, device=device))
    tree = trees(vocab_size, 1, max_nodes).map(as_tree)
    if kind == "chain":
        return chain
    if kind == "tree":
        return tree
    if kind != "any":
        raise ValueError(f"kind must be 'chain', 'tree' or 'any', not {kind!r}")
    return st.one_of(chain, tree)
