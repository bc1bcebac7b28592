"""What a fourth plugin author (Token Recycling: an adjacency matrix of each token's likely
successors filled from verification logits, a breadth-first tree drafted through it, sized
online by the host's cost curve) asked of the contract, each answer checked.

The regions between ``# [start:NAME]`` and ``# [end:NAME]`` are shown in docs/faq.md
("Questions authors ask") verbatim (``scripts/docsync.py``). Models: the kit's tiny random
Llama in float64, so every comparison is exact.
"""

from __future__ import annotations

import pytest
import torch

import selfspec
from selfspec import ArtefactStore, Decoder, Draft, Verdict
from selfspec.provisional import choose_size, cost_curve
from selfspec.testing import LosslessError, PluginSuite, assert_lossless

PROMPT = [5, 17, 3, 99, 42, 7, 7, 1]


@pytest.fixture
def model(tiny_model_factory):
    return tiny_model_factory("llama")


# --------------------------------------------------------------------------- kept nodes
# [start:kept]
class DepthFirst:
    """Drafts a fixed tree stored depth first (each subtree right after its root), and maps
    every logit row of the verification to its own node through ``kept``."""

    #: (parent, token): node 2 (depth 3) comes before node 3 (depth 1)
    TREE = [(-1, 11), (0, 12), (1, 13), (-1, 21), (3, 22)]

    @selfspec.hookimpl
    def selfspec_start(self, state):
        self.seen = []  # (proposed node, logits row) for every row of every step

    @selfspec.hookimpl
    def selfspec_propose(self, state):
        self.tree = self.TREE  # what this step proposed, in the plugin's own numbering
        parents, tokens = zip(*self.tree)
        device = state.runner.device
        return Draft(torch.tensor(tokens, device=device), torch.tensor(parents, device=device))

    @selfspec.hookimpl
    def selfspec_update_policy(self, state, verdict, kept):
        # row i + 1 of verdict.logits is about node i of the verified draft, which is node
        # kept[i] of the draft proposed: the host cut nodes deeper than the budget allows
        for i, node in enumerate(kept):
            self.seen.append((node, verdict.logits[i + 1].clone()))
        self.kept = kept
        # [end:kept]


def path_tokens(tree, node):
    """The tokens from the pending token's child down to ``node`` of ``tree``."""
    out = []
    while node >= 0:
        parent, token = tree[node]
        out.append(token)
        node = parent
    return out[::-1]


def test_update_policy_maps_every_logit_row_of_a_cut_tree_to_the_proposed_node(model):
    # [start:kept-use]
    decoder = Decoder(model, "depthfirst", plugin_object=DepthFirst)
    result = decoder.generate(PROMPT, 3)  # a budget of 3: the first step keeps depths 1-2 only
    assert decoder.plugin.kept == ()  # the last step had room for no draft
    assert result.stats.truncated_drafts >= 1
    # [end:kept-use]
    tree = DepthFirst.TREE
    committed = list(PROMPT)
    rows_by_step = iter(decoder.plugin.seen)
    # the first step's draft lost node 2 (depth 3): kept is (0, 1, 3, 4), rows 1..4
    first = [next(rows_by_step) for _ in range(4)]
    assert [node for node, _ in first] == [0, 1, 3, 4]
    for node, row in first:  # each row is the model's prediction after that node's own path
        ids = committed + path_tokens(tree, node)
        expected = model(torch.tensor([ids])).logits[0, -1]
        torch.testing.assert_close(row, expected, rtol=0, atol=1e-9)
    assert result.output_ids == selfspec.reference_generate(model, PROMPT, 3)


# --------------------------------------------------------------------------- constructors
def test_verdict_draft_and_choose_size_are_built_like_this(model):
    # [start:constructors]
    device = "cpu"
    # a chain, or a tree with parents (-1 = the pending token) and optional acceptance probs
    chain = Draft.chain([11, 12, 13], device)
    tree = Draft(
        torch.tensor([11, 12, 21]), torch.tensor([-1, 0, -1]), probs=torch.tensor([0.6, 0.3, 0.2])
    )
    assert tree.depths() == [1, 2, 1] and tree.best_path() == [11, 12]
    # a verdict: the accepted path's tokens and node ids, the model's next token (the bonus)
    verdict = Verdict(accepted=(11, 12), bonus=40, accepted_nodes=(0, 1), kv_slots=(0, 1, 2))
    assert verdict.committed == (11, 12, 40) and verdict.logit_rows == (0, 1, 2)
    # the tree size that maximises expected tokens per unit of cost: probs sorted high to low,
    # cost(w) the cost of a verifying block of w tokens, draft_cost what drafting spent
    n, expected, cost = choose_size(
        [0.9, 0.5, 0.2, 0.05], cost=lambda w: 1 + 0.1 * (w - 1), draft_cost=0.0
    )
    assert (n, round(expected, 2)) == (2, 2.4)  # 2.4 / 1.2 ties 2.6 / 1.3: the smaller tree
    # [end:constructors]
    assert chain.tokens.tolist() == [11, 12, 13] and not chain.is_tree
    assert cost == pytest.approx(1.2)


# --------------------------------------------------------------------------- sizing without probs
def test_a_model_free_drafter_sizes_its_tree_on_the_cost_curve(model, tmp_path):
    # [start:model-free-size]
    runner = selfspec.Runner(model)
    # this machine's cost of a full forward over w tokens, in one-token forwards; widths= are
    # the widths measured (a tree of up to 64 nodes verifies in a block of 65)
    curve = cost_curve(
        runner, widths=(1, 2, 4, 8, 16, 32, 64, 65), store=ArtefactStore("drafttree", root=tmp_path)
    )
    assert curve(1) == 1.0
    # a drafter without draft probabilities values each node by its own running rate: how
    # often a node at that depth (or that rank among its siblings) was accepted when drafted
    accepted = {1: 40, 2: 22, 3: 9}  # counted in selfspec_update_policy from accepted_nodes
    drafted = {1: 100, 2: 80, 3: 60}
    rate = {d: accepted[d] / drafted[d] for d in drafted}
    # a node's value is the probability its whole path is accepted: here its depth's rate
    values = sorted([rate[1]] * 4 + [rate[2]] * 6 + [rate[3]] * 8, reverse=True)
    n, expected, _ = choose_size(values, curve, draft_cost=0.0, limit=64)
    # [end:model-free-size]
    assert 0 <= n <= len(values) and expected >= 1.0


# --------------------------------------------------------------------------- a suite that fails
class CountsOtherEos:
    """A lossy verifier for the example below: accepts a drafted EOS id where the model
    predicts another EOS id (both end the decode; the last token differs)."""

    @selfspec.hookimpl
    def selfspec_propose(self, state):
        ids = state.committed.tolist()
        for j in range(len(ids) - 2, -1, -1):  # what followed the pending token last time
            if ids[j] == ids[-1]:
                return Draft.chain(ids[j + 1 : j + 5], state.runner.device)
        return None

    @selfspec.hookimpl
    def selfspec_verify(self, state, draft):
        v = selfspec.verify_greedy(state, draft)
        a, eos = len(v.accepted), state.eos_token_ids
        if draft.is_tree or a >= len(draft):
            return v
        drafted = int(draft.tokens[a])
        if drafted in eos and v.bonus in eos and drafted != v.bonus:
            return Verdict((*v.accepted, drafted), v.bonus, tuple(range(a + 1)), logits=v.logits)
        return v


# [start:suite-fails]
class BrokenSuite(PluginSuite):  # not collected: the name does not start with "Test"
    plugin = "broken"
    plugin_object = CountsOtherEos  # your plugin with the bug you want the suite to catch
    hypothesis_profile = "selfspec-ci"  # derandomized: the same examples every run
    shrink = False  # stop at the first failing example, as drawn


def test_the_suite_fails_a_broken_copy(tiny_model_factory):
    with pytest.raises(LosslessError, match="selfspec_verify"):  # the audit names the hook
        BrokenSuite().test_lossless("llama", "cpu", tiny_model_factory)
        # [end:suite-fails]


# --------------------------------------------------------------------------- stats via openai
def test_the_openai_client_keeps_the_selfspec_stats():
    openai = pytest.importorskip("openai")
    body = {
        "id": "cmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "smollm2-135m-instruct",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "Paris."},
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
        "selfspec": {"plugin": "lookup", "tau": 1.5, "steps": 2},
    }
    # what client.chat.completions.create returns
    response = openai.types.chat.ChatCompletion.model_validate(body)
    # [start:openai-stats]
    stats = response.model_dump()["selfspec"]  # or response.model_extra["selfspec"]
    assert stats["plugin"] == "lookup" and stats["tau"] == 1.5
    # [end:openai-stats]


# --------------------------------------------------------------------------- acceptance of trees
def test_path_acceptance_compares_a_tree_with_a_chain(model):
    class Chain:
        @selfspec.hookimpl
        def selfspec_propose(self, state):
            return Draft.chain(
                selfspec.reference_generate(model, state.committed.tolist(), 3), state.runner.device
            )

    class Tree(Chain):  # the same right chain, with a wrong sibling at every depth
        @selfspec.hookimpl
        def selfspec_propose(self, state):
            right = selfspec.reference_generate(model, state.committed.tolist(), 3)
            tokens, parents = [], []
            parent = -1
            for t in right:
                tokens += [(t + 1) % 128, t]
                parents += [parent, parent]
                parent = len(tokens) - 1
            dev = state.runner.device
            return Draft(torch.tensor(tokens, device=dev), torch.tensor(parents, device=dev))

    # [start:path-acceptance]
    chain = assert_lossless(model, Decoder(model, "chain", plugin_object=Chain), PROMPT, 24).stats
    tree = assert_lossless(model, Decoder(model, "tree", plugin_object=Tree), PROMPT, 24).stats
    assert chain.accepted == tree.accepted  # the same right path
    assert tree.acceptance == chain.acceptance / 2  # every sibling counts as drafted
    # per depth: comparable
    assert tree.path_acceptance == chain.path_acceptance == chain.acceptance
    # [end:path-acceptance]
