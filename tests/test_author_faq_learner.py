"""A plugin that learns from the verification logits, and a tree draft.

``Learner`` is the FAQ's example (docs/faq.md): it drafts from what
the full model predicted at earlier verifications, read from ``Verdict.top_k`` in
``selfspec_update_policy``, and never overrides ``selfspec_verify``. With ``tree=True`` it drafts
a tree (the model's first and second choice after the pending token, each continued as a
chain). The regions between ``# [start:NAME]`` and ``# [end:NAME]`` are shown in the docs
verbatim (``scripts/docsync.py``). Models: the kit's tiny random models, float64.
"""

from __future__ import annotations

import weakref

import pytest
import torch
from hypothesis import strategies as st

import selfspec
from selfspec import Decoder, Draft, Option, greedy, verify_greedy
from selfspec.provisional import chain_verdict, tree_path
from selfspec.testing import PluginSuite, assert_lossless

PROMPT = [5, 17, 3, 99, 42, 7, 7, 1, 5, 17, 3]


# [start:learner]
class Learner:
    """Drafts what the full model predicted after the same token at earlier verifications."""

    @selfspec.hookimpl
    def selfspec_options(self, register):
        register(Option("num_draft", int, 4, "deepest draft", min=0, max=16))
        register(Option("tree", bool, False, "draft the model's second choice as a second branch"))

    @selfspec.hookimpl
    def selfspec_setup(self, options):
        self.depth, self.tree = options["num_draft"], options["tree"]

    @selfspec.hookimpl
    def selfspec_start(self, state):
        self.table = {}  # token -> the full model's top-2 next tokens after it, last seen
        self.rows = []  # the token at each logit row of this step's verification

    @selfspec.hookimpl
    def selfspec_propose(self, state):
        depth = min(self.depth, state.max_draft_depth)
        firsts = self.table.get(state.pending, ())[: 2 if self.tree else 1] if depth else ()
        tokens, parents = [], []
        for token in firsts:  # one branch per first token, continued by the best choice
            parent = -1  # the pending token
            for _ in range(depth):
                tokens.append(token)
                parents.append(parent)
                parent = len(tokens) - 1
                if token not in self.table:
                    break
                token = self.table[token][0]
        self.rows = [state.pending, *tokens]  # row 0: the pending token, row i + 1: node i
        device = state.runner.device
        if not self.tree:
            return Draft.chain(tokens, device)
        return Draft(
            torch.tensor(tokens, dtype=torch.long, device=device),
            torch.tensor(parents, dtype=torch.long, device=device),
        )

    @selfspec.hookimpl
    def selfspec_update_policy(self, state, verdict):
        top = verdict.top_k(2)  # ([1 + len(draft), 2] logits, [1 + len(draft), 2] token ids)
        if top is None:
            return  # a verifier that gives no logits: nothing to learn this step
        for token, best in zip(self.rows, top[1].tolist()):
            self.table[token] = tuple(best)  # what the model predicted after `token`
            # [end:learner]


class TestLearner(PluginSuite):
    plugin = "learner"
    plugin_object = Learner
    option_strategies = {"num_draft": st.integers(0, 6)}
    reach_options = {"num_draft": 6}


class TestLearnerTree(PluginSuite):
    plugin = "learner"
    plugin_object = Learner
    fixed_options = {"tree": True}
    option_strategies = {"num_draft": st.integers(0, 6)}
    reach_options = {"num_draft": 6, "tree": True}


@pytest.fixture
def model(tiny_model_factory):
    return tiny_model_factory("llama")  # float64


def test_the_learner_learns_without_overriding_verify(model):
    # [start:learner-use]
    decoder = Decoder(model, "learner", {"num_draft": 4}, plugin_object=Learner)
    assert "selfspec_verify" not in decoder.plugin_hooks  # the host's verifier does the verifying
    result = assert_lossless(model, decoder, PROMPT * 3, 40)
    assert result.stats.accepted > 0  # drafts from what earlier verifications predicted
    # [end:learner-use]
    assert decoder.plugin.table  # it learned something


def test_the_tree_learner_drafts_trees(model):
    seen = []

    class Spy(Learner):
        @selfspec.hookimpl
        def selfspec_update_policy(self, state, verdict):
            seen.append(verdict.logits.shape[0])
            super().selfspec_update_policy(state, verdict)

    result = assert_lossless(model, "learner", PROMPT * 3, 40, {"tree": True}, plugin_object=Spy)
    assert result.stats.accepted > 0
    assert max(seen) > 1 + 4 - 1  # two branches drafted at once: more rows than one chain has


# --------------------------------------------------------------------------- Verdict.logits
class Probe:
    """Checks ``Verdict.logits`` of every step against the forward that made it."""

    def __init__(self, verifier=None, tree=False):
        self.verifier, self.tree = verifier, tree
        self.blocks, self.steps, self.ref, self.freed = [], 0, None, []

    @selfspec.hookimpl
    def selfspec_setup(self, runner):
        forward = runner.forward

        def recording(*args, **kwargs):  # the logits block of every forward, as made
            out = forward(*args, **kwargs)
            # the audit's forwards use its own cache
            self.blocks.append((kwargs.get("cache"), out.logits))
            return out

        runner.forward = recording

    @selfspec.hookimpl
    def selfspec_propose(self, state):
        if self.ref is not None:
            self.freed.append(self.ref() is None)  # last step's block freed by now?
        dev = state.runner.device
        toks = [state.pending, 3, state.pending]
        self.rows = 4 if state.max_draft_depth >= 3 else 1
        if self.rows == 1:
            return Draft.empty(dev)
        if self.tree:
            return Draft(torch.tensor(toks, device=dev), torch.tensor([-1, 0, -1], device=dev))
        return Draft.chain(toks, dev)

    @selfspec.hookimpl
    def selfspec_verify(self, state, draft):
        return self.verifier(state, draft) if self.verifier else None

    @selfspec.hookimpl
    def selfspec_update_policy(self, state, verdict):
        logits = verdict.logits
        last = [block for cache, block in self.blocks if cache is state.cache][-1]
        assert logits.shape == (self.rows, state.runner.vocab_size)
        assert logits.data_ptr() == last.data_ptr()  # a reference to the forward's block, no copy
        rows = list(verdict.logit_rows)
        assert greedy(logits[rows]).tolist() == list(verdict.committed)
        values, ids = verdict.top_k(2)
        assert ids.shape == (self.rows, 2) and torch.equal(ids[:, 0], greedy(logits))
        self.steps += 1
        self.ref = weakref.ref(logits)
        self.blocks.clear()


def _from_layer_0(state, draft):
    ids = torch.cat([state.tokens[state.length - 1 : state.length], draft.tokens])
    return selfspec.verify_from_layer(state, draft, list(state.runner.embed(ids)[0]), 0)


@pytest.mark.parametrize(
    "verifier, tree",
    [
        (None, False),
        (None, True),
        (verify_greedy, False),
        (lambda s, d: selfspec.verify_tree(s, d)[0], True),
        (_from_layer_0, False),
    ],
    ids=["builtin-chain", "builtin-tree", "verify_greedy", "verify_tree", "verify_from_layer"],
)
def test_every_host_verifier_hands_over_its_logits_and_they_die_with_the_step(
    model, verifier, tree
):
    probe = Probe(verifier, tree)
    assert_lossless(model, "probe", PROMPT, 12, plugin_object=probe)
    assert probe.steps >= 4
    # never alive into the next step
    assert len(probe.freed) == probe.steps - 1 and all(probe.freed)


def test_verify_tree_hands_over_the_tree_rows_only(model):
    extra = selfspec.ExtraBlock(
        torch.tensor([9, 8]),
        torch.tensor([0, 1]),
        torch.ones(2, 2, dtype=torch.bool).tril(),
        torch.tensor([1]),
    )

    def with_extra(state, draft):
        base = state.length - 1
        block = selfspec.ExtraBlock(extra.ids, extra.positions + base + 1, extra.mask, extra.rows)
        return selfspec.verify_tree(state, draft, block)[0]

    probe = Probe(with_extra, tree=True)
    # shape [1 + 3, V] checked inside
    assert_lossless(model, "probe", PROMPT, 8, plugin_object=probe)
    assert probe.steps >= 3


def test_chain_verdict_keeps_the_callers_logits_and_a_custom_verdict_has_none():
    logits = torch.randn(3, 10, dtype=torch.float64)
    draft = Draft.chain(greedy(logits)[:2].tolist())
    verdict = chain_verdict(draft, logits, forwards=0.5)
    assert verdict.logits is logits and verdict.committed == tuple(greedy(logits).tolist())
    assert verdict.logit_rows == (0, 1, 2)
    assert selfspec.Verdict((), 4).logits is None and selfspec.Verdict((), 4).top_k(3) is None
    tree = selfspec.Verdict((7,), 4, accepted_nodes=(2,), kv_slots=(0, 3))
    assert tree.logit_rows == (0, 3)


def test_tree_path_names_the_accepted_nodes():
    # [start:tree-path]
    parents, tokens = [-1, 0, -1, 2], [10, 11, 20, 21]  # branches p -> 10 -> 11 and p -> 20 -> 21
    assert tree_path(parents, tokens, pred=[20, 99, 99, 21, 5]) == [2, 3]  # nodes, root first
    assert tree_path(parents, tokens, pred=[10, 12, 99, 99, 99]) == [0]  # 11 rejected: stop at 10
    assert tree_path(parents, tokens, pred=[30, 0, 0, 0, 0]) == []  # no first token matches
    # [end:tree-path]


def test_a_tree_is_verified_in_one_forward_with_an_ancestor_mask(model):
    runner = selfspec.Runner(model)
    cache = runner.new_cache(capacity=32)
    runner.forward(torch.tensor(PROMPT[:-1]), cache=cache, start=0, logits=None)  # prefill
    base, p = len(PROMPT) - 1, PROMPT[-1]  # the pending token's slot and id
    top2 = torch.topk(runner.forward(torch.tensor(PROMPT)).logits[-1], 2).indices.tolist()
    a, c, b = top2[0], top2[1], 3  # a: the model's choice after p; c: its second; b: a guess
    # [start:tree]
    # the pending token p, then two branches: p -> a -> b and p -> c
    # parents[i] < i; -1: p
    draft = Draft(torch.tensor([a, b, c]), parents=torch.tensor([-1, 0, -1]))
    assert draft.is_tree and draft.depths() == [1, 2, 1]
    # what verify_greedy(state, draft) runs for it: one forward over [p, a, b, c] at slot base
    block_mask = torch.tensor(
        [
            [1, 0, 0, 0],  # p sees itself (and, like every row, the cached prefix)
            [1, 1, 0, 0],  # a sees p and itself
            [1, 1, 1, 0],  # b sees p, a and itself
            [1, 0, 0, 1],  # c sees p and itself, never the branch beside it
        ],
        dtype=torch.bool,
    )  # [1 + k, 1 + k]: may row r attend to column c
    positions = base + torch.tensor([0, 1, 2, 1])  # p's position + each node's depth
    out = runner.forward(
        torch.tensor([p, a, b, c]),
        cache=cache,
        start=base,
        positions=positions,
        block_mask=block_mask,
    )  # keys/values of node n at slot base + 1 + n
    # pred[0]: after p; pred[n + 1]: after node n on its own path
    pred = greedy(out.logits).tolist()
    # accepted nodes, root first
    path = tree_path(draft.parents.tolist(), draft.tokens.tolist(), pred)
    kv_slots = (0, *(n + 1 for n in path))  # Verdict.kv_slots: p's slot and the accepted nodes'
    # [end:tree]
    assert path[:1] == [0] and kv_slots[:2] == (0, 1)  # a is the model's own choice
    # each branch as a plain chain
    chain_ab = runner.forward(torch.tensor([*PROMPT, a, b])).logits[-3:]
    chain_c = runner.forward(torch.tensor([*PROMPT, c])).logits[-1]
    torch.testing.assert_close(out.logits[:3], chain_ab, rtol=0, atol=1e-10)
    torch.testing.assert_close(out.logits[3], chain_c, rtol=0, atol=1e-10)
