"""The drafting and verification mechanics the host gives plugins (docs/api/selfspec.md).

Set-up, and why:
a) tiny float64 models (``selfspec.testing``), where losslessness is exact equality, so a
   verifier that reuses states must give exactly the built-in verifier's verdicts;
b) test plugins are plain classes handed to ``Decoder(..., plugin_object=...)``;
c) the pure helpers (n-gram index, tree paths, layer lists) are checked against brute force.
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import selfspec
from selfspec import (
    ArtefactError,
    ArtefactStore,
    Decoder,
    Draft,
    ExtraBlock,
    Layers,
    NgramIndex,
    Option,
    OptionError,
    Runner,
    accepted_length,
    check_layers,
    format_layers,
    model_identity,
    resolve_profile,
    skip_layer_draft,
    verify_from_layer,
    verify_greedy,
    verify_tree,
)
from selfspec.provisional import tree_path
from selfspec.testing import ARCHS, assert_lossless, tiny_model
from selfspec.testing import strategies as sst

PROMPT = [3, 7, 11, 7, 3, 9, 2]


# ------------------------------------------------------------------------------ skip-layer drafts
def _prefilled(arch: str = "qwen3", capacity: int = 48):
    runner = Runner(tiny_model(arch))
    cache = runner.new_cache(capacity)
    prompt = torch.tensor(PROMPT)
    runner.forward(prompt[:-1], cache=cache, start=0, logits=None)
    return runner, cache, prompt[-1:], len(PROMPT) - 1


def test_skip_layer_draft_exit_threshold():
    runner, cache, pending, slot = _prefilled()
    skip = (1,)
    # d) without a threshold, exactly max_tokens; a threshold just above the first token's
    # draft probability stops at it (dropped, or kept as the last draft with keep_exit), just
    # below keeps it and goes on
    kw = {"skip_attn": skip, "skip_mlp": skip}
    assert len(skip_layer_draft(runner, cache, pending, slot, max_tokens=5, **kw).tokens) == 5
    logits = runner.forward(pending, cache=cache, start=slot, logits="last", **kw).logits[-1]
    p = float(torch.softmax(logits, -1).max())
    high = min(1.0, p + 1e-6)
    assert (
        len(
            skip_layer_draft(
                runner, cache, pending, slot, max_tokens=5, exit_below=high, keep_exit=False, **kw
            ).tokens
        )
        == 0
    )
    kept = skip_layer_draft(
        runner, cache, pending, slot, max_tokens=5, exit_below=high, **kw
    ).tokens
    assert kept.tolist() == [int(logits.argmax())]
    assert (
        len(
            skip_layer_draft(
                runner, cache, pending, slot, max_tokens=1, exit_below=p - 1e-6, **kw
            ).tokens
        )
        == 1
    )


@pytest.mark.parametrize("arch", ARCHS)
def test_skip_layer_draft_without_skips_is_greedy_and_captures_one_state_per_forward(arch):
    # e) nothing skipped: the draft model is the model, so the draft is greedy's continuation
    runner, cache, pending, slot = _prefilled(arch)
    out = skip_layer_draft(runner, cache, pending, slot, max_tokens=6, capture=1)
    ref = selfspec.reference_generate(runner.model, PROMPT, 6, ())
    assert out.tokens.tolist() == ref
    assert len(out.captured) == 6 and out.captured[0].shape == (runner.hidden_size,)


class FromLayer:
    """Drafts with the upper layers' attention skipped and verifies from the first skipped
    layer with the states the draft captured (selfsd's reuse, written with the host's parts)."""

    def __init__(self, first: int, k: int = 4) -> None:
        self.first, self.k, self.used = first, k, 0

    @selfspec.hookimpl
    def selfspec_propose(self, state):
        base = state.length - 1
        k = min(self.k, state.max_draft_depth)
        if k <= 0:
            return Draft.empty(state.runner.device)
        skip = tuple(range(self.first, state.runner.n_layers))
        out = skip_layer_draft(
            state.runner,
            state.cache,
            state.tokens[base : base + 1],
            base,
            max_tokens=k,
            skip_attn=skip,
            capture=self.first,
        )
        return Draft(out.tokens, meta={"hidden": out.captured}, owner=self)

    @selfspec.hookimpl
    def selfspec_verify(self, state, draft):
        if not draft.is_from(self) or len(draft) == 0:
            return None
        self.used += 1
        return verify_from_layer(state, draft, draft.meta["hidden"], self.first)


@given(arch=st.sampled_from(ARCHS), data=st.data())
def test_verify_from_layer_is_lossless(arch, data):
    model = tiny_model(arch)
    first = data.draw(st.integers(1, model.config.num_hidden_layers - 1), label="first")
    plugin = FromLayer(first, data.draw(st.integers(1, 5), label="k"))
    prompt = data.draw(sst.prompts(model.config.vocab_size))
    n = data.draw(sst.lengths())
    assert_lossless(model, "fromlayer", prompt, n, plugin_object=plugin)
    assert plugin.used > 0 or n < 2  # a one-token budget leaves no room for a draft


# ------------------------------------------------------------------------------ tree verification
def _state(arch: str = "llama", extra_capacity: int = 32):
    """A decode state right after prefill of PROMPT (as the loop builds it)."""
    runner = Runner(tiny_model(arch))
    T = len(PROMPT)
    tokens = torch.zeros(T + extra_capacity, dtype=torch.long)
    tokens[:T] = torch.tensor(PROMPT)
    state = selfspec.DecodeState(
        runner=runner,
        cache=runner.new_cache(T + extra_capacity),
        tokens=tokens,
        length=T,
        prompt_length=T,
        max_new_tokens=extra_capacity - 8,
        eos_token_ids=frozenset(),
        stats=selfspec.Stats(),
        plugin_name="t",
    )
    runner.forward(tokens[: T - 1], cache=state.cache, start=0, logits=None)
    return state


def _greedy_after(model, ids: list[int]) -> int:
    return int(model(torch.tensor([ids])).logits[0, -1].argmax())


@pytest.mark.parametrize("arch", ARCHS)
def test_verify_tree_with_extra_rows_matches_verify_greedy_and_the_model(arch):
    model_state = _state(arch)
    model = model_state.runner.model
    ref = selfspec.reference_generate(model, PROMPT, 3, ())
    # f) a tree with the right path (ref[0], ref[1]) beside a wrong sibling
    wrong = (ref[0] + 1) % model.config.vocab_size
    draft = Draft(torch.tensor([wrong, ref[0], ref[1]]), torch.tensor([-1, -1, 1]))
    expect = verify_greedy(_state(arch), draft)
    branch = [5, 9, 4]  # rides along: sees the pending token and itself only
    base = len(PROMPT) - 1
    extra = ExtraBlock(
        ids=torch.tensor(branch),
        positions=torch.arange(base + 1, base + 4),
        mask=torch.ones(3, 3, dtype=torch.bool).tril_(),
        rows=torch.tensor([0, 2]),
    )
    verdict, preds = verify_tree(model_state, draft, extra)
    assert verdict == expect and verdict.accepted == (ref[0], ref[1]) and verdict.bonus == ref[2]
    assert preds == [
        _greedy_after(model, PROMPT + branch[:1]),
        _greedy_after(model, PROMPT + branch),
    ]


@given(data=st.data())
def test_tree_path_is_the_longest_matching_path(data):
    k = data.draw(st.integers(0, 12), label="k")
    parents = [data.draw(st.integers(-1, i - 1)) for i in range(k)]
    tokens = data.draw(st.lists(st.integers(0, 3), min_size=k, max_size=k), label="tokens")
    pred = data.draw(st.lists(st.integers(0, 3), min_size=k + 1, max_size=k + 1), label="pred")
    path = tree_path(parents, tokens, pred)
    prev = -1
    for node in path:  # a path from the root whose tokens are the predictions
        assert parents[node] == prev and tokens[node] == pred[prev + 1]
        prev = node
    # and no child of its end matches (maximal)
    assert not any(parents[i] == prev and tokens[i] == pred[prev + 1] for i in range(k))


@given(pred=st.lists(st.integers(0, 2), min_size=1, max_size=10), data=st.data())
def test_accepted_length_is_the_matching_prefix(pred, data):
    tokens = data.draw(st.lists(st.integers(0, 2), min_size=len(pred) - 1, max_size=len(pred) - 1))
    a = accepted_length(torch.tensor(pred), torch.tensor(tokens, dtype=torch.long))
    assert tokens[:a] == pred[:a] and (a == len(tokens) or tokens[a] != pred[a])


# ------------------------------------------------------------------------------ the n-gram index
def _brute_match(tokens: list[int], max_n: int, min_n: int) -> tuple[int, int]:
    for n in range(min(max_n, len(tokens)), min_n - 1, -1):
        suffix = tokens[-n:]
        for stop in range(len(tokens) - 1, n - 1, -1):  # latest earlier occurrence first
            if tokens[stop - n : stop] == suffix:
                return n, stop
    return 0, -1


@given(
    chunks=st.lists(st.lists(st.integers(0, 3), max_size=6), max_size=6),
    max_n=st.integers(1, 4),
    min_n=st.integers(1, 4),
    k=st.integers(1, 5),
)
def test_ngram_index_matches_brute_force(chunks, max_n, min_n, k):
    if min_n > max_n:
        with pytest.raises(ValueError):
            NgramIndex(max_n, min_n)
        return
    index = NgramIndex(max_n, min_n)
    seen: list[int] = []
    for chunk in chunks:  # g) growing in pieces, as a decode commits tokens
        index.extend(chunk)
        seen += chunk
        n, stop = _brute_match(seen, max_n, min_n)
        assert index.match() == (n, stop)
        assert index.continuation(k) == (tuple(seen[stop : stop + k]) if n else ())


@given(
    seen=st.lists(st.integers(0, 3), max_size=14),
    tail=st.lists(st.integers(0, 3), max_size=4),
    max_n=st.integers(1, 4),
    k=st.integers(0, 5),
)
def test_ngram_lookup_after_a_tail_matches_brute_force(seen, tail, max_n, k):
    # what followed the longest suffix of seen + tail, found inside seen (its continuation known)
    index = NgramIndex(max_n, 1)
    index.extend(seen)
    whole = seen + tail
    want: tuple[int, ...] = ()
    for n in range(min(max_n, len(whole)), 0, -1):
        stops = [s for s in range(len(seen) - 1, n - 1, -1) if seen[s - n : s] == whole[-n:]]
        if stops:
            want = tuple(seen[stops[0] : stops[0] + k])
            break
    assert index.lookup(tail, k) == want
    if not tail:  # without a tail, the list's own continuation
        assert index.lookup([], k) == (index.continuation(k) if k else ())


def test_ngram_index_returns_the_latest_occurrence_of_the_longest_suffix():
    h = NgramIndex(max_n=3, min_n=1)
    h.extend([1, 2, 3, 9, 2, 3, 8, 7])
    assert h.continuation(4) == ()  # 7 never occurred before: nothing to look up
    h.extend([5, 2, 3])  # suffix "5 2 3" never occurred, "2 3" did twice: the latest (-> 8 7)
    assert h.continuation(3) == (8, 7, 5)
    assert h.continuation(1) == (8,)
    h.extend([9, 2])  # "3 9 2" occurred once (-> 3 8); a later lone "2" (-> 3 9) loses to it
    assert h.continuation(2) == (3, 8)
    h2 = NgramIndex(max_n=3, min_n=2)  # single-token matches off
    h2.extend([4, 6, 4])
    assert h2.continuation(2) == ()
    with pytest.raises(ValueError):
        NgramIndex(max_n=1, min_n=2)


def test_ngram_halving_shortens_the_continuation_of_a_shorter_match():
    h = NgramIndex(max_n=3, min_n=1)
    h.extend([1, 2, 3, 10, 11, 12, 13, 14, 15, 16, 17, 1, 2, 3])  # "1 2 3" matched in full
    assert h.continuation(8, halving=True) == (10, 11, 12, 13, 14, 15, 16, 17)
    h2 = NgramIndex(max_n=3, min_n=1)
    h2.extend([2, 3, 10, 11, 12, 13, 14, 15, 16, 17, 9, 2, 3])  # only "2 3" matches: 8 / 2
    assert h2.continuation(8, halving=True) == (10, 11, 12, 13)
    assert h2.continuation(8) == (10, 11, 12, 13, 14, 15, 16, 17)
    h3 = NgramIndex(max_n=3, min_n=1)
    h3.extend([3, 10, 11, 12, 13, 5, 3])  # only "3" matches: 8 / 4
    assert h3.continuation(8, halving=True) == (10, 11)
    assert h3.continuation(1, halving=True) == (10,)  # never shorter than one token


# ------------------------------------------------------------------------------ the layers type
@given(layers=st.sets(st.integers(0, 40)))
def test_layers_round_trip(layers):
    assert Layers.parse(format_layers(layers)) == tuple(sorted(layers))


def test_layers_option_parses_and_refuses():
    opt = Option("skip", Layers, "1,3-4", "h")
    assert (
        opt.convert("3,5,10-12") == (3, 5, 10, 11, 12)
        and opt.convert("none") == ()
        and opt.convert([2, 1]) == (1, 2)
    )
    # the default is parsed too
    assert selfspec._engine.contract.options.resolve({"skip": opt}, {}, "p") == {"skip": (1, 3, 4)}
    assert opt.describe()["type"] == "layers" and opt.describe()["default"] == "1,3-4"
    for bad, why in (
        ("a-b", "not a layer"),
        ("2,2", "listed twice"),
        ("1-3,3", "listed twice"),
        ("-1", "not a layer"),
    ):
        with pytest.raises(OptionError, match=why):
            opt.convert(bad)
    assert check_layers((0, 29), 30, "skip") == (0, 29) and check_layers(None, 30) is None
    with pytest.raises(OptionError, match="'skip'.*outside"):
        check_layers((30,), 30, "skip")


# ------------------------------------------------------------------------------ artefacts
def test_model_identity_is_stable_across_dtypes_and_tells_checkpoints_apart():
    model = tiny_model("llama", dtype=torch.float32)
    ident = model_identity(Runner(model))
    assert ident == model_identity(Runner(model))
    bf16 = tiny_model("llama", dtype=torch.float32).to(torch.bfloat16)
    assert ident == model_identity(Runner(bf16, weight_layout="model"))
    other = model_identity(Runner(tiny_model("llama", dtype=torch.float32, seed=1)))
    assert other.fingerprint != ident.fingerprint and other.key != ident.key
    assert ident.key == f"llama-{ident.n_layers}x{ident.hidden_size}-{ident.fingerprint}"


@pytest.mark.parametrize("layout", ["packed", "transposed"])
def test_model_identity_does_not_depend_on_a_layout_the_model_adopted(layout):
    # specdec adopts the layout in place (one copy of the weights): a tuned profile found
    # through the identity must be found all the same
    from selfspec._engine.runner.layout import packing_unsupported
    from selfspec._engine.tuning.machine import cpu_capability

    why = (
        packing_unsupported("cpu", torch.float32, cpu_capability()) if layout == "packed" else None
    )
    if why:
        pytest.skip(f"packed does not run here: {why}")
    ident = model_identity(Runner(tiny_model("qwen2", dtype=torch.float32)))
    adopted = tiny_model("qwen2", dtype=torch.float32)
    runner = Runner(adopted, weight_layout=layout, adopt=True)
    assert runner.weight_layout == layout
    assert model_identity(runner) == ident


def test_store_resolver_and_atomic_save(tmp_path, monkeypatch):
    monkeypatch.setenv("SELFSPEC_CACHE_DIR", str(tmp_path))
    store = ArtefactStore("demo")
    assert store.root == tmp_path / "demo"
    assert (
        resolve_profile("auto", store, "m.json") is None
        and resolve_profile("none", store, "m.json") is None
    )
    path = store.save_text(store.path("m.json"), json.dumps({"a": 1}))
    assert (
        resolve_profile("auto", store, "m.json") == path
        and resolve_profile(None, store, "m.json") == path
    )
    assert resolve_profile("none", store, "m.json") is None
    assert resolve_profile(str(path), store, "other.json") == path
    with pytest.raises(ArtefactError, match="no profile"):
        resolve_profile(str(tmp_path / "missing.json"), store, "m.json")

    def broken(tmp):
        tmp.write_text("half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        ArtefactStore.save(path, broken)
    # h) an interrupted save leaves the old file and no partial one
    assert json.loads(path.read_text()) == {"a": 1} and sorted(
        p.name for p in path.parent.iterdir()
    ) == ["m.json"]


# ------------------------------------------------------------------------------ owner and timing
class LongDraft:
    """Proposes more tokens than the budget allows, as its own; records what verify sees."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, int, int]] = []

    @selfspec.hookimpl
    def selfspec_propose(self, state):
        return Draft.chain([1] * 10, device=state.runner.device, owner=self, proposed=10)

    @selfspec.hookimpl
    def selfspec_verify(self, state, draft):
        self.seen.append((draft.is_from(self), len(draft), draft.meta["proposed"]))


def test_the_owner_survives_the_hosts_cut():
    plugin = LongDraft()
    Decoder(tiny_model("llama"), "long", plugin_object=plugin).generate(PROMPT, 4, eos_token_ids=())
    assert plugin.seen[0] == (True, 3, 10)  # cut to the budget, still ours, meta as proposed
    assert not Draft.chain([1]).is_from(plugin) and not Draft.chain([1], owner=object()).is_from(
        plugin
    )


class TimedUpdate:
    def __init__(self, clock: list[float]) -> None:
        self.clock = clock

    @selfspec.hookimpl
    def selfspec_update_policy(self, state):
        with state.timed("search"):
            self.clock[0] += 100.0  # i) the only time that passes, on a fake clock


def test_timed_sub_phases_are_left_out_of_their_hook_phase(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    res = Decoder(tiny_model("llama"), "timed", plugin_object=TimedUpdate(clock)).generate(
        PROMPT, 5, eos_token_ids=()
    )
    assert res.stats.phase_s["search"] == 100.0 * res.stats.steps
    assert res.stats.phase_s["update"] == 0.0
