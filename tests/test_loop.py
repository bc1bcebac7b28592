"""The decode loop with test plugins: right, wrong, random, tree-shaped and malformed drafts.

Set-up, and why:
a) the test plugins are plain classes with ``@selfspec.hookimpl`` methods handed to
   ``Decoder(model, name, plugin_object=...)``: a class is instantiated per decoder, an
   instance is used as it is (so a test can give it the reference continuation).
b) an oracle knows the greedy continuation ``ref``. The draft follows the *pending* token,
   which is the last committed one: after ``g = state.generated`` output tokens the next token
   to predict is ``ref[g]``, so the perfect draft is ``ref[g:g+k]``.
c) everything runs in float64, where losslessness is exact equality.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import selfspec
from selfspec import Decoder, Draft, Verdict
from selfspec._engine.contract.builtin.verify import verify_greedy
from selfspec._engine.contract.plugins import PluginError
from selfspec._engine.contract.reference import reference_generate
from selfspec.testing import assert_lossless
from selfspec.testing import strategies as sst

PROMPT = [5, 17, 3, 99, 42, 7, 7, 1]
VOCAB = 128


@pytest.fixture
def model(tiny_model_factory):
    return tiny_model_factory("qwen2")


def ref_of(model, prompt=PROMPT, n=30, eos=()):
    return reference_generate(model, prompt, n, eos)


# ----------------------------------------------------------------------------- test plugins
class Oracle:
    """Always right: proposes the next ``k`` reference tokens (see b)."""

    def __init__(self, ref: list[int] | None = None, k: int = 3) -> None:
        self.ref, self.k = ref, k

    @selfspec.hookimpl
    def selfspec_start(self, state):
        if self.ref is None:  # compute it from the model itself (property tests)
            prompt = state.committed.tolist()
            self.ref = reference_generate(
                state.runner.model, prompt, state.max_new_tokens, state.eos_token_ids
            )

    @selfspec.hookimpl
    def selfspec_propose(self, state):
        g = state.generated
        return Draft.chain(self.ref[g : g + self.k], device=state.runner.device)


class Wrong(Oracle):
    """Always wrong: every draft token differs from the reference at its position."""

    @selfspec.hookimpl
    def selfspec_propose(self, state):
        g = state.generated
        return Draft.chain(
            [(t + 1) % VOCAB for t in self.ref[g : g + self.k]], device=state.runner.device
        )


class Noisy(Oracle):
    """Random: each draft token is the reference token with probability ``p``, else random."""

    def __init__(self, seed: int, p: float = 0.6, k: int = 4) -> None:
        super().__init__(None, k)
        self.rng, self.p = random.Random(seed), p

    @selfspec.hookimpl
    def selfspec_propose(self, state):
        g, k = state.generated, self.rng.randint(0, self.k)
        toks = [
            t if self.rng.random() < self.p else self.rng.randrange(VOCAB)
            for t in self.ref[g : g + k]
        ]
        return Draft.chain(toks, device=state.runner.device)


class TreeOracle(Oracle):
    """Tree-shaped: the right path hidden among wrong siblings (each with wrong children)."""

    def __init__(self, ref=None, depth: int = 3, wrong: int = 2, seed: int = 0) -> None:
        super().__init__(ref, depth)
        self.wrong, self.rng = wrong, random.Random(seed)

    @selfspec.hookimpl
    def selfspec_propose(self, state):
        g = state.generated
        tokens, parents, parent = [], [], -1
        for t in self.ref[g : g + self.k]:
            right_at = self.rng.randint(0, self.wrong)
            right_node = None
            for j in range(self.wrong + 1):
                if j == right_at:
                    right_node = len(tokens)
                    tokens.append(t)
                    parents.append(parent)
                else:
                    w = (t + 1 + j) % VOCAB
                    tokens.append(w)
                    parents.append(parent)
                    tokens.append(self.rng.randrange(VOCAB))  # a child of the wrong sibling
                    parents.append(len(tokens) - 2)
            parent = right_node
        dev = state.runner.device
        return Draft(torch.tensor(tokens, device=dev), torch.tensor(parents, device=dev))


class Fixed:
    """Proposes the same given draft (or object) every step."""

    def __init__(self, draft) -> None:
        self.draft = draft

    @selfspec.hookimpl
    def selfspec_propose(self, state):
        return self.draft


# ----------------------------------------------------------------------------- basic behaviour
def test_vanilla_equals_reference(model):
    res = Decoder(model).generate(PROMPT, 30, eos_token_ids=())
    assert res.output_ids == ref_of(model)
    assert res.stats.steps == 30 and res.stats.drafted == 0 and res.stats.tau == 1.0


def test_always_right_accepts_everything(model):
    ref = ref_of(model)
    res = Decoder(model, "oracle", plugin_object=Oracle(ref, k=3)).generate(
        PROMPT, 30, eos_token_ids=()
    )
    s = res.stats
    assert res.output_ids == ref
    assert s.accepted == s.drafted > 0 and s.acceptance == 1.0
    assert s.accept_lengths[:7] == [4] * 7  # 3 drafts + the bonus per step
    assert s.steps == 8 and s.tau == 30 / 8


def test_always_wrong_accepts_nothing(model):
    ref = ref_of(model)
    res = Decoder(model, "wrong", plugin_object=Wrong(ref, k=3)).generate(
        PROMPT, 30, eos_token_ids=()
    )
    assert res.output_ids == ref
    assert res.stats.accepted == 0 and res.stats.drafted > 0 and res.stats.steps == 30


def test_tree_draft_finds_the_hidden_path(model):
    ref = ref_of(model)
    res = Decoder(model, "tree", plugin_object=TreeOracle(ref, depth=3)).generate(
        PROMPT, 30, eos_token_ids=()
    )
    assert res.output_ids == ref
    assert res.stats.accept_lengths[:7] == [4] * 7


def test_over_long_drafts_are_cut_to_the_budget(model):
    ref = ref_of(model, n=5)
    res = Decoder(model, "long", plugin_object=Oracle(ref + [0] * 60, k=50)).generate(
        PROMPT, 5, eos_token_ids=()
    )
    assert res.output_ids == ref
    assert res.stats.truncated_drafts >= 1
    assert res.stats.drafted == 4  # budget 5 = 4 drafts + the bonus
    tree = Decoder(model, "tree", plugin_object=TreeOracle(ref + [0] * 10, depth=9)).generate(
        PROMPT, 5, eos_token_ids=()
    )
    assert tree.output_ids == ref and tree.stats.truncated_drafts >= 1


def test_a_cut_draft_keeps_the_probs_of_the_nodes_it_keeps():
    from types import SimpleNamespace

    from selfspec._engine.contract.draftcheck import cut_draft

    state = SimpleNamespace(
        max_draft_depth=2,
        length=5,
        cache=SimpleNamespace(capacity=100),
        stats=SimpleNamespace(truncated_drafts=0),
    )
    chain = cut_draft(Draft(torch.tensor([7, 8, 9]), probs=torch.tensor([0.9, 0.8, 0.7])), state)
    assert chain.tokens.tolist() == [7, 8] and chain.probs.tolist() == pytest.approx([0.9, 0.8])
    tree = cut_draft(
        Draft(
            torch.tensor([1, 2, 3, 4]),
            torch.tensor([-1, 0, 1, -1]),
            probs=torch.tensor([0.9, 0.8, 0.7, 0.1]),
        ),
        state,
    )
    assert tree.tokens.tolist() == [1, 2, 4] and tree.probs.tolist() == pytest.approx(
        [0.9, 0.8, 0.1]
    )
    assert state.stats.truncated_drafts == 2


class SkippingDrafter:
    """Drafts ``k`` tokens by running the model with layer 0's attention skipped, so the
    layers hold different cache lengths when the host checks and cuts the draft."""

    def __init__(self, k: int) -> None:
        self.k = k

    @selfspec.hookimpl
    def selfspec_propose(self, state):
        base, tok, out = state.length - 1, state.tokens[state.length - 1 :][:1], []
        for i in range(self.k):
            logits = state.runner.forward(
                tok, cache=state.cache, start=base + i, skip_attn=(0,), logits="last"
            ).logits
            tok = logits[-1].argmax().reshape(1)
            out.append(int(tok))
        return Draft.chain(out, device=state.runner.device)


def test_drafts_that_leave_unequal_cache_lengths_are_cut(model):
    # a) the draft forwards leave layer 0 at length-1 slots and the others further on;
    # b) the draft is longer than the budget, so the host must cut it without asking the
    #    cache for one common length (see a)
    ref = ref_of(model, n=5)
    res = Decoder(model, "skipper", plugin_object=SkippingDrafter(k=8)).generate(
        PROMPT, 5, eos_token_ids=()
    )
    assert res.output_ids == ref
    assert res.stats.truncated_drafts >= 1


class EarlyExitDrafter(Oracle):
    """Drafts after writing its own draft slots in the first layer only (like an early exit),
    so the cache's layers disagree on their lengths when the host checks the draft."""

    @selfspec.hookimpl
    def selfspec_propose(self, state):
        base = state.length - 1
        draft = Draft.chain(
            self.ref[state.generated : state.generated + self.k], device=state.runner.device
        )
        ids = torch.cat([state.tokens[base : base + 1], draft.tokens])
        state.runner.forward(ids, cache=state.cache, start=base, layers=(0, 1), logits=None)
        return draft


def test_drafts_written_past_the_prefix_in_some_layers(model):
    # the depth limit counts from the committed prefix, not from layers a proposer wrote past it
    ref = ref_of(model, n=12)
    res = Decoder(model, "ee", plugin_object=EarlyExitDrafter(ref + [0] * 8, k=4)).generate(
        PROMPT, 12, eos_token_ids=()
    )
    assert res.output_ids == ref
    assert res.stats.accepted == res.stats.drafted > 0


def test_hook_propose(model):
    """propose: firstresult; None defers to vanilla; the draft reaches verify unchanged."""
    seen = []

    class Defer:
        @selfspec.hookimpl
        def selfspec_propose(self, state):
            return None

        @selfspec.hookimpl(tryfirst=True)
        def selfspec_verify(self, state, draft):
            seen.append(len(draft))

    res = Decoder(model, "defer", plugin_object=Defer).generate(PROMPT, 4, eos_token_ids=())
    assert seen == [0, 0, 0, 0] and res.output_ids == ref_of(model, n=4)

    class Two(Defer):
        @selfspec.hookimpl
        def selfspec_propose(self, state):
            return Draft.chain([1, 2], device=state.runner.device)

    seen.clear()
    Decoder(model, "two", plugin_object=Two).generate(PROMPT, 6, eos_token_ids=())
    assert seen and seen[0] == 2


def test_hook_verify(model):
    """verify: firstresult; a plugin's verdict is used, None defers to the greedy verifier."""
    calls = []

    class Recording(Oracle):
        @selfspec.hookimpl
        def selfspec_verify(self, state, draft):
            calls.append(len(draft))
            if len(calls) % 2:
                return None  # defer to the built-in
            return verify_greedy(state, draft)

    ref = ref_of(model, n=12)
    res = Decoder(model, "rec", plugin_object=Recording(ref, 2)).generate(
        PROMPT, 12, eos_token_ids=()
    )
    assert res.output_ids == ref and len(calls) == res.stats.steps


def test_custom_verdict_that_is_not_a_path_is_refused(model):
    class Liar(Oracle):
        @selfspec.hookimpl
        def selfspec_verify(self, state, draft):
            return Verdict(accepted=(int(draft.tokens[1]),), bonus=0)  # skips node 0

    ref = ref_of(model, n=8)
    with pytest.raises(PluginError, match=r"'liar'.*not a path"):
        Decoder(model, "liar", plugin_object=Liar(ref, 3)).generate(PROMPT, 8, eos_token_ids=())

    class NotVerdict(Oracle):
        @selfspec.hookimpl
        def selfspec_verify(self, state, draft):
            return (1, 2)

    with pytest.raises(PluginError, match=r"'nv'.*not a Verdict"):
        Decoder(model, "nv", plugin_object=NotVerdict(ref, 3)).generate(PROMPT, 8, eos_token_ids=())

    class BadBonus(Oracle):
        @selfspec.hookimpl
        def selfspec_verify(self, state, draft):
            return Verdict(accepted=(), bonus=VOCAB)

    with pytest.raises(PluginError, match=r"'bb'.*token ids"):
        Decoder(model, "bb", plugin_object=BadBonus(ref, 3)).generate(PROMPT, 8, eos_token_ids=())


@pytest.mark.parametrize(
    "bad, message",
    [
        (Draft(torch.tensor([1, 2], dtype=torch.int32)), "int64"),
        (Draft(torch.tensor([[1, 2]])), "1-D"),
        (Draft.chain([1, VOCAB]), r"lie in \[0, 128\)"),
        (Draft.chain([-1]), r"lie in \[0, 128\)"),
        (Draft(torch.tensor([1, 2, 3]), torch.tensor([-1, 1, 0])), "parents"),
        (Draft(torch.tensor([1, 2, 3]), torch.tensor([-1, -2, 0])), "parents"),
        (Draft(torch.tensor([1, 2, 3]), torch.tensor([-1, 0])), "parents"),
        (Draft(torch.tensor([1, 2]), torch.tensor([-1, 0], dtype=torch.int32)), "parents"),
        (Draft(torch.tensor([1, 2]), probs=torch.tensor([0.9])), "probs"),
        (Draft(torch.tensor([1, 2]), probs=torch.tensor([1, 0])), "probs"),
        (
            Draft(torch.tensor([1, 2]), probs=torch.tensor([0.9, 1.5])),
            r"probs must lie in \[0, 1\]",
        ),
        (
            Draft(torch.tensor([1, 2]), probs=torch.tensor([0.9, float("nan")])),
            r"probs must lie in \[0, 1\]",
        ),
        ([1, 2, 3], "not a Draft"),
        (torch.tensor([1, 2]), "not a Draft"),
    ],
    ids=[
        "int32",
        "2d",
        "oov",
        "negative",
        "parent-ahead",
        "parent-below",
        "parent-shape",
        "parent-dtype",
        "probs-shape",
        "probs-int",
        "probs-above-1",
        "probs-nan",
        "list",
        "tensor",
    ],
)
def test_malformed_drafts_are_refused_naming_the_plugin(model, bad, message):
    dec = Decoder(model, "broken", plugin_object=Fixed(bad))
    with pytest.raises(PluginError, match=rf"'broken'.*{message}"):
        dec.generate(PROMPT, 5, eos_token_ids=())
    # the decoder stays usable afterwards: a fresh decode gets a fresh cache
    dec.plugin.draft = Draft.empty()
    assert dec.generate(PROMPT, 5, eos_token_ids=()).output_ids == ref_of(model, n=5)


def test_exception_in_propose_names_the_plugin(model):
    class Boom:
        @selfspec.hookimpl
        def selfspec_propose(self, state):
            raise KeyError("oops")

    with pytest.raises(PluginError, match=r"'boom'.*selfspec_propose raised KeyError"):
        Decoder(model, "boom", plugin_object=Boom).generate(PROMPT, 5, eos_token_ids=())


# ----------------------------------------------------------------------------- EOS and budget
def test_eos_as_the_first_token(model):
    ref = ref_of(model)
    res = Decoder(model, "oracle", plugin_object=Oracle(ref, 5)).generate(
        PROMPT, 30, eos_token_ids=[ref[0]]
    )
    assert res.output_ids == [ref[0]] == ref_of(model, eos=[ref[0]])


def test_nothing_after_eos_inside_an_accepted_draft(model):
    ref = ref_of(model)
    j = next(i for i in range(3, len(ref)) if ref[i] not in ref[:i])  # a token first seen at j
    eos = [ref[j]]
    res = Decoder(model, "oracle", plugin_object=Oracle(ref, k=8)).generate(
        PROMPT, 30, eos_token_ids=eos
    )
    assert res.output_ids == ref[: j + 1] == ref_of(model, eos=eos)
    assert res.stats.new_tokens == j + 1
    # EOS came inside an accepted draft: the drafts after it were accepted but not committed
    assert sum(res.stats.accept_lengths) == j + 1


def test_default_eos_comes_from_the_model(tiny_model_factory):
    m = tiny_model_factory("llama")
    ref = ref_of(m)
    m_eos = tiny_model_factory("llama", eos_token_id=ref[4])
    res = Decoder(m_eos).generate(PROMPT, 30)
    assert res.output_ids == ref[: ref.index(ref[4]) + 1]


def test_default_eos_includes_the_tokenizers(tiny_model_factory):
    # the one EOS rule (selfspec.app._models.eos_token_ids) that specdec and specdec bench stop by
    m = tiny_model_factory("llama")  # no EOS in its configs
    ref = ref_of(m)

    class Tok:
        eos_token_id = ref[4]

        def decode(self, ids, skip_special_tokens=True):
            return ""

    assert Decoder(m).generate(PROMPT, 30).output_ids == ref
    assert (
        Decoder(m, tokenizer=Tok()).generate(PROMPT, 30).output_ids == ref[: ref.index(ref[4]) + 1]
    )


@pytest.mark.parametrize("budget", [0, 1, 2])
def test_budget_edges(model, budget):
    ref = ref_of(model, n=budget) if budget else []
    res = Decoder(model, "oracle", plugin_object=Oracle(ref + [1] * 20, k=6)).generate(
        PROMPT, budget, eos_token_ids=()
    )
    assert res.output_ids == ref and len(res.output_ids) == budget
    assert res.stats.steps == min(budget, 1) and res.stats.accepted == max(0, budget - 1)
    if budget >= 1:
        assert res.stats.truncated_drafts == 1


def test_bad_generate_arguments(model):
    dec = Decoder(model)
    with pytest.raises(ValueError, match="empty"):
        dec.generate([], 3)
    with pytest.raises(ValueError, match=">= 0"):
        dec.generate(PROMPT, -1)
    with pytest.raises(ValueError, match="token ids"):
        dec.generate([VOCAB], 3)


def test_prompt_of_length_one(model):
    ref = ref_of(model, prompt=[9], n=12)
    for plugin in (None, Oracle(ref, 3), TreeOracle(ref, 2)):
        dec = Decoder(model) if plugin is None else Decoder(model, "p", plugin_object=plugin)
        assert dec.generate([9], 12, eos_token_ids=()).output_ids == ref


def test_stream_receives_exactly_the_committed_tokens(model):
    ref = ref_of(model, n=20)
    chunks: list[list[int]] = []
    res = Decoder(model, "noisy", plugin_object=Noisy(seed=3)).generate(
        PROMPT, 20, eos_token_ids=(), stream=chunks.append
    )
    assert [t for c in chunks for t in c] == res.output_ids == ref
    assert [len(c) for c in chunks] == res.stats.accept_lengths and all(chunks)
    eos_chunks: list[list[int]] = []
    eos = [ref[6]]
    out = Decoder(model, "oracle", plugin_object=Oracle(ref, 4)).generate(
        PROMPT, 20, eos_token_ids=eos, stream=eos_chunks.append
    )
    assert [t for c in eos_chunks for t in c] == out.output_ids == ref[: ref.index(ref[6]) + 1]


def test_two_decoders_do_not_share_plugin_state(model):
    class Counting:
        def __init__(self) -> None:
            self.steps = 0

        @selfspec.hookimpl
        def selfspec_update_policy(self, state, verdict):
            self.steps += 1

    a = Decoder(model, "counting", plugin_object=Counting)
    b = Decoder(model, "counting", plugin_object=Counting)
    assert a.plugin is not b.plugin
    ra = a.generate(PROMPT, 5, eos_token_ids=())
    rb = b.generate(PROMPT[:3], 7, eos_token_ids=())
    assert a.plugin.steps == 5 and b.plugin.steps == 7
    assert ra.output_ids == ref_of(model, n=5) and rb.output_ids == ref_of(model, PROMPT[:3], 7)


def test_interleaved_decoders_with_stateful_plugins(tiny_model_factory):
    m1, m2 = tiny_model_factory("llama"), tiny_model_factory("gemma3")
    r1, r2 = ref_of(m1, n=15), ref_of(m2, n=15)
    d1 = Decoder(m1, "noisy", plugin_object=Noisy(seed=1))
    d2 = Decoder(m2, "noisy", plugin_object=Noisy(seed=1))
    for _ in range(2):
        d1.plugin.ref = d2.plugin.ref = None
        assert d1.generate(PROMPT, 15, eos_token_ids=()).output_ids == r1
        assert d2.generate(PROMPT, 15, eos_token_ids=()).output_ids == r2


def test_stats_are_consistent(model):
    res = Decoder(model, "noisy", plugin_object=Noisy(seed=5)).generate(
        PROMPT, 25, eos_token_ids=()
    )
    s = res.stats
    assert s.new_tokens == 25 == len(res.output_ids) == sum(s.accept_lengths)
    assert s.steps == len(s.accept_lengths) == s.forwards
    assert s.new_tokens == s.steps + s.accepted
    assert 0 < s.accepted <= s.drafted
    assert s.tau == pytest.approx(s.new_tokens / s.forwards)
    assert s.acceptance == pytest.approx(s.accepted / s.drafted)
    assert set(s.phase_s) == {"propose", "verify", "cache", "update"}
    assert s.wall_time_s >= s.prefill_s > 0
    d = s.as_dict()
    for key in ("new_tokens", "wall_time_s", "tokens_per_s", "steps", "tau", "acceptance"):
        assert key in d


# ----------------------------------------------------------------------------- lifecycle hooks
def test_hook_setup(model):
    seen = {}

    class Setup:
        @selfspec.hookimpl
        def selfspec_options(self, register):
            register(selfspec.Option("depth", int, 3, "draft depth", min=1))

        @selfspec.hookimpl
        def selfspec_setup(self, runner, options, tokenizer):
            seen["layers"], seen["options"], seen["tokenizer"] = (
                runner.n_layers,
                dict(options),
                tokenizer,
            )

    Decoder(model, "setup", {"depth": "5"}, plugin_object=Setup)
    assert seen == {"layers": 3, "options": {"depth": 5}, "tokenizer": None}
    sentinel = object()  # the decoder's tokenizer is handed over as it is
    Decoder(model, "setup", plugin_object=Setup, tokenizer=sentinel)
    assert seen["tokenizer"] is sentinel

    class Refuses:
        @selfspec.hookimpl
        def selfspec_setup(self, runner):
            raise ValueError("needs at least 30 layers")

    with pytest.raises(
        PluginError, match=r"'refuses'.*selfspec_setup raised ValueError: needs at least 30"
    ):
        Decoder(model, "refuses", plugin_object=Refuses)


def test_hook_start(model):
    seen = []

    class Start:
        @selfspec.hookimpl
        def selfspec_start(self, state):
            seen.append(
                (state.cache.length, state.committed.tolist(), state.pending, state.generated)
            )

    dec = Decoder(model, "start", plugin_object=Start)
    dec.generate(PROMPT, 3, eos_token_ids=())
    dec.generate([4, 5], 2, eos_token_ids=())
    assert seen == [(len(PROMPT) - 1, PROMPT, PROMPT[-1], 0), (1, [4, 5], 5, 0)]


def test_hook_end(model):
    seen = []

    class End:
        @selfspec.hookimpl
        def selfspec_end(self, state, result):
            seen.append((state.finished, list(result.output_ids), state.length))

    res = Decoder(model, "end", plugin_object=End).generate(PROMPT, 4, eos_token_ids=())
    assert seen == [(True, res.output_ids, len(PROMPT) + 4)]


def test_hook_cache(model):
    """cache: every plugin is called before the host commits; the built-in keeps the slots."""
    seen = []

    class Cache(Oracle):
        @selfspec.hookimpl
        def selfspec_cache(self, state, verdict):
            seen.append((state.length, verdict.committed, state.tokens[state.length - 1].item()))

    ref = ref_of(model, n=9)
    dec = Decoder(model, "cache", plugin_object=Cache(ref, 2))
    res = dec.generate(PROMPT, 9, eos_token_ids=())
    assert res.output_ids == ref
    T = len(PROMPT)
    assert seen[0] == (T, tuple(ref[:3]), PROMPT[-1])
    assert seen[1] == (T + 3, tuple(ref[3:6]), ref[2])

    class Breaks(Oracle):
        @selfspec.hookimpl(trylast=True)
        def selfspec_cache(self, state, verdict):  # after the built-in commit: corrupt it
            state.cache.crop(0)

    with pytest.raises(PluginError, match=r"'breaks'.*KV cache holds"):
        Decoder(model, "breaks", plugin_object=Breaks(ref, 2)).generate(PROMPT, 9, eos_token_ids=())


def test_hook_update_policy(model):
    seen = []

    class Update(Oracle):
        @selfspec.hookimpl
        def selfspec_update_policy(self, state, verdict):
            seen.append(
                (
                    state.generated,
                    state.committed[-len(verdict.committed) :].tolist(),
                    list(verdict.committed),
                )
            )
            self.k += 1  # adapt the draft length

    ref = ref_of(model, n=12)
    res = Decoder(model, "upd", plugin_object=Update(ref, 1)).generate(PROMPT, 12, eos_token_ids=())
    assert res.output_ids == ref
    assert [g for g, _, _ in seen] == [2, 5, 9, 12]
    assert all(a == b for _, a, b in seen)


def test_capture_layers_returns_committed_hidden_states(model):
    seen = []

    class Capture(Oracle):
        @selfspec.hookimpl
        def selfspec_start(self, state):
            state.capture_layers = (1, 3)

        @selfspec.hookimpl
        def selfspec_update_policy(self, state, verdict):
            seen.append({k: v.shape for k, v in verdict.hidden.items()})

    ref = ref_of(model, n=8)
    Decoder(model, "cap", plugin_object=Capture(ref, 2)).generate(PROMPT, 8, eos_token_ids=())
    assert seen[0] == {1: torch.Size([3, 48]), 3: torch.Size([3, 48])}


# ----------------------------------------------------------------------------- properties (see c)
# tiny decodes are fast: at least 20 examples per property whatever the profile asks, each
# audited at every step (long prompts, long outputs and deep drafts are the kit's PluginSuite
# and mutation tests' job)
MORE = settings(max_examples=max(20, settings.default.max_examples))


@MORE
@given(arch=sst.archs(), prompt=sst.prompts(), n=sst.lengths())
def test_property_vanilla_is_lossless(tiny_model_factory, arch, prompt, n):
    assert_lossless(tiny_model_factory(arch), "vanilla", prompt, n)


@MORE
@given(arch=sst.archs(), prompt=sst.prompts(), n=sst.lengths(), k=st.integers(1, 6))
def test_property_oracle_is_lossless(tiny_model_factory, arch, prompt, n, k):
    res = assert_lossless(
        tiny_model_factory(arch), "oracle", prompt, n, plugin_object=Oracle(None, k)
    )
    assert res.stats.accepted == res.stats.drafted


@MORE
@given(
    arch=sst.archs(),
    prompt=sst.prompts(),
    n=sst.lengths(),
    seed=st.integers(0, 2**16),
    p=st.floats(0, 1),
)
def test_property_random_drafts_are_lossless(
    tiny_model_factory, selfspec_device, arch, prompt, n, seed, p
):
    model = tiny_model_factory(arch, device=selfspec_device)  # CPU, and CUDA when present
    assert_lossless(model, "noisy", prompt, n, plugin_object=Noisy(seed, p))


@MORE
@given(
    arch=sst.archs(),
    prompt=sst.prompts(),
    n=sst.lengths(),
    depth=st.integers(1, 4),
    wrong=st.integers(0, 2),
    seed=st.integers(0, 2**16),
)
def test_property_tree_drafts_are_lossless(
    tiny_model_factory, selfspec_device, arch, prompt, n, depth, wrong, seed
):
    res = assert_lossless(
        tiny_model_factory(arch, device=selfspec_device),
        "tree",
        prompt,
        n,
        plugin_object=TreeOracle(None, depth, wrong, seed),
    )
    assert res.stats.accepted == sum(res.stats.accept_lengths) - res.stats.steps


@MORE
@given(
    arch=sst.archs(),
    prompt=sst.prompts(),
    n=sst.lengths(1, 12),
    drafts=st.lists(sst.drafts(), min_size=1, max_size=6),
)
def test_property_arbitrary_drafts_are_lossless(tiny_model_factory, arch, prompt, n, drafts):
    """Drafts from the kit's strategy (chains, trees, empty), cycled: always lossless."""

    class Cycle:
        def __init__(self) -> None:
            self.i = 0

        @selfspec.hookimpl
        def selfspec_propose(self, state):
            self.i += 1
            return drafts[self.i % len(drafts)]

    assert_lossless(tiny_model_factory(arch), "cycle", prompt, n, plugin_object=Cycle)


@settings(max_examples=max(30, settings.default.max_examples))
@given(
    arch=sst.archs(),
    prompt=sst.prompts(),
    n=sst.lengths(),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_property_low_precision_is_lossless_up_to_near_ties(
    tiny_model_factory, selfspec_device, arch, prompt, n, seed, dtype
):
    """float32/bf16: equal, or a first divergence at a near-tied logit, reported; never retried."""
    model = tiny_model_factory(arch, dtype=dtype, device=selfspec_device)
    res = assert_lossless(model, "noisy", prompt, n, plugin_object=Noisy(seed, 0.7))
    assert res.near_ties in (0, 1)


def test_chain_verdict_is_the_longest_matching_prefix_plus_the_bonus():
    from selfspec.provisional import chain_verdict

    logits = torch.zeros(4, 10, dtype=torch.float64)
    for row, tok in enumerate([5, 6, 1, 9]):  # the model's token after pending, d1, d2, d3
        logits[row, tok] = 1.0
    v = chain_verdict(Draft.chain([5, 6, 7]), logits, forwards=0.5)
    assert (v.accepted, v.bonus, v.accepted_nodes, v.forwards) == ((5, 6), 1, (0, 1), 0.5)
    all_in = chain_verdict(Draft.chain([5, 6, 1]), logits)
    assert (all_in.accepted, all_in.bonus) == ((5, 6, 1), 9)


@pytest.mark.parametrize("plugin", ["vanilla", "lookup"])
def test_a_stream_that_returns_true_ends_the_decode_after_that_block(model, plugin):
    full = Decoder(model, plugin).generate(PROMPT, 30, eos_token_ids=())
    blocks: list[list[int]] = []

    def stream(ids: list[int]) -> bool:
        blocks.append(ids)
        return len(blocks) == 3

    cut = Decoder(model, plugin).generate(PROMPT, 30, eos_token_ids=(), stream=stream)
    assert len(blocks) == 3  # no block after the one that asked to stop
    assert cut.output_ids == sum(blocks, []) == full.output_ids[: len(cut.output_ids)]
    assert cut.stats.new_tokens == len(cut.output_ids) < 30 and cut.stats.steps == 3
