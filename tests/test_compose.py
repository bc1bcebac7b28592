"""Composed drafts: names, refusals, the merged trie, the budget cut, the cheap-first rule with
injected statistics, each member's own verdict, option routing, losslessness end to end.

a) A member's verdict must be what verifying its own draft alone gives: checked against
   ``verify_greedy`` on that draft, from the same cache, on a real tiny model.
b) The cheap-first rule is tested with statistics injected by hand, so the expected decision
   follows from the formula, not from timings.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import selfspec
from selfspec import Decoder, Draft, PluginError, Verdict
from selfspec._engine.contract.compose import Composer, _Proposal
from selfspec._engine.contract.composetree import (
    CallOutcomes,
    MemberStats,
    Trie,
    cut,
    node_values,
    without_member,
    worth_calling,
)
from selfspec._engine.contract.plugins import member_names
from selfspec._engine.runner.costcurve import CostCurve
from selfspec.testing import assert_lossless
from selfspec.testing._mutants import Echo


class Chain:
    """A composable drafter proposing fixed chains, recording the verdicts it is given."""

    def __init__(self, ids: list[int] | None = None) -> None:
        self.ids = ids or []
        self.verdicts: list[Verdict] = []

    @selfspec.hookimpl
    def selfspec_propose(self, state: Any) -> Draft:
        return Draft.chain(self.ids[: state.max_draft_depth], device=state.runner.device)

    @selfspec.hookimpl
    def selfspec_update_policy(self, verdict: Verdict) -> None:
        self.verdicts.append(verdict)


class Refuses(Chain):
    composable = False


def test_composed_names_are_parsed():
    assert member_names("lookup") is None
    assert member_names("lookup+selfsd") == ["lookup", "selfsd"]
    assert member_names(["lookup", "selfsd"]) == ["lookup", "selfsd"]


@pytest.mark.parametrize(
    ("name", "objects", "blamed", "words"),
    [
        ("a+vanilla", {"a": Chain}, "vanilla", "cannot be a member"),
        ("a+echo", {"a": Chain, "echo": Echo}, "echo", "selfspec_verify and selfspec_cache"),
        ("a+no", {"a": Chain, "no": Refuses}, "no", "composable = False"),
        ("a+a", {"a": Chain}, "a+a", "named twice"),
        ("a+", {"a": Chain}, "", "empty member"),
        ("a+not-installed", {"a": Chain}, "not-installed", "not installed"),
    ],
)
def test_members_that_cannot_join_are_refused_by_name(name, objects, blamed, words):
    with pytest.raises(PluginError) as info:
        selfspec._engine.contract.manager.make_manager(name, objects)
    assert info.value.plugin == blamed and words in str(info.value)


def test_the_trie_merges_shared_prefixes_once_and_remembers_owners():
    t = Trie()
    assert t.add([5, 6, 7], None, 0) == [0, 1, 2]
    assert t.add([5, 6, 9, 8], [-1, 0, 0, 2], 1) == [0, 1, 3, 4]  # 5, 5>6 shared; 5>9, 5>9>8 new
    assert t.tokens == [5, 6, 7, 9, 8] and t.parents == [-1, 0, 1, 0, 3]
    assert t.owners == [{0, 1}, {0, 1}, {0}, {1}, {1}]
    tokens, parents, remap = t.subtree([0, 3, 4])
    assert tokens == [5, 9, 8] and parents == [-1, 0, 1] and remap == {0: 0, 3: 1, 4: 2}


def _stats(
    rates: list[float],
    lengths: dict[int, float] | None = None,
    cost: float | None = None,
    size: float = 0.0,
) -> MemberStats:
    """Statistics injected by hand: depth d passes with rate ``rates[d-1]`` (after 100 steps)."""
    s = MemberStats(reach=[100.0] * len(rates), passed=[100.0 * r - 1 + 2 * r for r in rates])
    s.passed = [r * 102 - 1 for r in rates]  # (passed + 1) / (reach + 2) == r
    if lengths is not None:
        s.lengths = [lengths.get(a, 0.0) for a in range(max(lengths) + 1)]
        s.weight = sum(lengths.values())
        s.size = size * s.weight
    if cost is not None:
        s.cost, s.costed = cost, 1.0
    return s


def test_node_values_are_depth_rates_shared_among_siblings_and_never_above_the_parent():
    t = Trie()
    t.add([1, 2, 3], None, 0)
    t.add([1, 4, 5], [-1, 0, 0], 1)  # a tree: 4 and 5 are siblings at depth 2
    values = node_values(t, [_stats([0.9, 0.8, 0.7]), _stats([0.5, 0.6])])
    assert values == pytest.approx([0.9, 0.8, 0.7, 0.3, 0.3])


def test_a_members_own_node_probabilities_value_its_nodes_in_place_of_its_depth_rates():
    t = Trie()
    t.add([1, 2, 3], None, 0)  # a chain without probs: member 0's depth rates
    t.add([1, 4, 5, 6], [-1, 0, 0, 2], 1, probs=[0.95, 0.9, 0.05, 0.85])  # a tree with probs
    assert t.probs[0] == {1: 0.95} and t.probs[1] == {} and t.probs[3] == {1: 0.9}
    values = node_values(t, [_stats([0.6, 0.5, 0.4]), _stats([0.5, 0.5, 0.5])])
    # node 1 (token 1): both members, the best of 0.6 and 0.95; token 4's 0.9 stays, not halved
    # with its sibling; token 6 is capped by its parent (token 5, 0.05)
    assert values == pytest.approx([0.95, 0.5, 0.4, 0.9, 0.05, 0.05])


def test_the_cut_keeps_the_nodes_worth_their_verify_cost():
    values = [0.9, 0.8, 0.1, 0.05]
    flat = CostCurve((1, 64), (1.0, 1.0))  # verifying more costs nothing: keep every node
    assert cut(values, flat, 0.0) == [0, 1, 2, 3]
    steep = CostCurve((1, 2), (1.0, 2.0))  # every node costs a forward: keep none
    assert cut(values, steep, 0.0) == []
    knee = CostCurve((1, 3, 4), (1.0, 1.0, 1.5))  # two nodes are free, a third costs half a forward
    assert cut(values, knee, 0.0) == [0, 1]
    assert cut(values, None, 0.0, limit=3) == [0, 1, 2]


def test_cheap_first_skips_a_costly_member_when_the_free_draft_covers_its_gain():
    curve = CostCurve((1, 16), (1.0, 1.3))
    # ~1.3 accepted, 0.6 forwards
    costly = _stats([0.9, 0.8], lengths={0: 2, 1: 3, 2: 5}, cost=0.6, size=2)
    # nothing drafted yet: call it
    assert worth_calling(costly, covered=0.0, nodes=0, spent=0.0, cost=curve)
    # a long confident draft
    assert not worth_calling(costly, covered=5.0, nodes=6, spent=0.0, cost=curve)
    cheap = _stats([0.9, 0.8], lengths={0: 2, 1: 3, 2: 5}, cost=0.01, size=2)
    # nearly free: worth it
    assert worth_calling(cheap, covered=1.0, nodes=6, spent=0.0, cost=curve)
    # never observed: call
    assert worth_calling(MemberStats(), covered=9.0, nodes=9, spent=0.0, cost=curve)


def test_cheap_first_follows_the_prediction_until_both_choices_are_measured():
    out = CallOutcomes()
    assert out.choose(predicted=False) is False and out.choose(predicted=True) is True
    for _ in range(3):
        out.observe(False, tokens=2, forwards=1.0)  # skipped steps measured, calling not yet
    assert out.choose(predicted=False) is True  # the unmeasured choice is explored


@pytest.mark.parametrize("call_rate,skip_rate", [(3.0, 2.0), (2.0, 3.0)])
def test_cheap_first_takes_the_faster_measured_choice(call_rate, skip_rate):
    """Once both are measured, the choice whose steps committed more tokens per forward wins,
    whatever the prediction says (both orders)."""
    out = CallOutcomes()
    for _ in range(4):
        out.observe(True, tokens=int(call_rate * 2), forwards=2.0)
        out.observe(False, tokens=int(skip_rate), forwards=1.0)
    assert out.rate(True) == pytest.approx(call_rate) and out.rate(False) == pytest.approx(
        skip_rate
    )
    for predicted in (True, False):
        assert out.choose(predicted) is (call_rate > skip_rate)


def test_a_choice_not_taken_for_long_is_measured_again():
    # the slower choice's evidence ages while the faster one is taken; below MIN_OUTCOMES it is
    # explored again, so the rule follows a text that changes
    out = CallOutcomes()
    for _ in range(3):
        out.observe(True, tokens=6, forwards=2.0)
        out.observe(False, tokens=2, forwards=1.0)
    steps = 0
    while out.choose(predicted=True):
        out.observe(True, tokens=6, forwards=2.0)
        steps += 1
        assert steps < 500
    assert out.rate(False) is None and steps > 10


def test_a_step_without_a_member_commits_the_path_through_the_other_members_nodes():
    # merged draft: 0 -> 1 (member 0 = the free draft), 0 -> 2 -> 3 (member 1), node 0 shared
    trie = Trie()
    trie.add([7, 8], None, 0)
    trie.add([7, 9, 4], None, 1)
    args = (trie.tokens, trie.parents, trie.owners)
    # member 0's path: all of it is kept
    assert without_member([7, 8, 5], *args, member=1) == (3, 3)
    # past node 0 the path was member 1's
    assert without_member([7, 9, 4, 6], *args, member=1) == (2, 3)
    assert without_member([7, 9, 4, 6], *args, member=0) == (4, 4)
    assert without_member([6], *args, member=1) == (1, 3)  # nothing accepted: the bonus alone


def test_a_called_step_measures_the_skip_choice_too():
    """With the counterfactual, the steps that call a member measure both choices, so the rule
    never skips it only to find out what skipping gives (a free draft that is never right)."""
    out = CallOutcomes()
    for _ in range(3):
        out.observe(True, tokens=6, forwards=2.0, skipped=(1, 1.0))
    assert out.rate(True) == pytest.approx(3.0) and out.rate(False) == pytest.approx(1.0)
    assert out.choose(predicted=False) is True
    blind = CallOutcomes()  # without it, the unmeasured skip is explored
    for _ in range(3):
        blind.observe(True, tokens=6, forwards=2.0)
    assert blind.choose(predicted=True) is False


def test_the_counterfactual_takes_the_members_proposing_and_its_nodes_verify_share_off():
    comp = Composer("x+y", [])
    comp.curve = CostCurve((1, 5), (1.0, 2.0))  # each row a quarter of a forward
    comp.forward_s, comp.forward_w = 1.0, 1.0  # a forward is one second
    trie = Trie()
    trie.add([7, 8], None, 0)
    trie.add([7, 9, 4], None, 1)
    comp._verified, comp._width = (trie.tokens, trie.parents, trie.owners), 5
    m = type("M", (), {"index": 1})()
    step = [_Proposal(m, [7, 9, 4], None, [0, 2, 3], 0.5)]  # type: ignore[arg-type]
    verdict = Verdict(accepted=(7, 9, 4), bonus=6, accepted_nodes=(0, 2, 3), kv_slots=(0, 1, 3, 4))
    tokens, forwards = comp.without(m, step, verdict, took=3.0, verify=2.0)  # type: ignore[arg-type,misc]
    assert tokens == 2  # the shared first node, then the bonus
    assert forwards == pytest.approx(3.0 - 0.5 - 2.0 * (1 - 1.5 / 2.0))
    comp.counterfactual = False
    assert comp.without(m, step, verdict, took=3.0, verify=2.0) is None  # type: ignore[arg-type]


def test_the_measured_choices_start_afresh_in_every_decode():
    """A decode's cheap-first outcomes are its own: what an earlier prompt measured (a prompt
    that copies, say) does not decide for the next."""
    from selfspec.testing import tiny_model

    dec = Decoder(tiny_model("llama", dtype=torch.float32), "lookup+qspec")
    earlier = dec.plugin.members[1].outcomes
    earlier.observe(False, tokens=1000, forwards=1.0)
    dec.generate([5, 9, 17, 3, 5, 9, 17, 3], 8)
    assert dec.plugin.members[1].outcomes is not earlier
    assert dec.plugin.members[1].outcomes.tokens[False] < 1000 * 0.5


def test_proposing_time_is_counted_in_mean_forwards():
    """A member's proposing seconds enter the cut and the cheap-first rule in one-token forwards:
    over the mean forward time of the verify phases so far, not over their sum."""
    comp = Composer("x+y", [])
    assert comp.forwards(0.6) == 0.0  # no forward measured yet
    comp.forward_s, comp.forward_w = 3.0, 10.0  # ten verify phases of 0.3 s per forward
    assert comp.forwards(0.6) == pytest.approx(2.0)


def test_a_member_skipped_for_long_is_called_again():
    # its evidence ages with every skipped step, and the optimistic prior (one step at its
    # deepest accepted length) takes over: the rule calls it again after enough skips
    curve = CostCurve((1, 16), (1.0, 1.3))
    costly = _stats([0.9, 0.8, 0.7, 0.6, 0.5, 0.4], lengths={0: 40, 1: 5, 6: 5}, cost=0.6, size=6)
    assert not worth_calling(costly, covered=1.5, nodes=3, spent=0.0, cost=curve)
    skips = 0
    while not worth_calling(costly, covered=1.5, nodes=3, spent=0.0, cost=curve):
        costly.skipped()
        skips += 1
        assert skips < 500
    assert 10 < skips < 500 and costly.mean_size() == pytest.approx(6.0)
    gain = costly.expected_gain(1.5)
    assert gain is not None and gain > 0.5


def test_a_member_verdict_is_what_verifying_its_own_draft_alone_gives(tiny_model_factory):
    # see a)
    model = tiny_model_factory("llama")
    prompt = [3, 4, 5, 6] * 12
    ref = selfspec.reference_generate(model, prompt, 8)
    a = Chain(ref[:2] + [0])  # right twice, then wrong
    b = Chain([ref[0], 1])  # right once
    dec = Decoder(
        model, "a+b", {"budget": "8", "cheap_first": False}, plugin_object={"a": a, "b": b}
    )
    dec.generate(prompt, 4)
    va, vb = a.verdicts[0], b.verdicts[0]
    assert (va.accepted, va.bonus, va.accepted_nodes) == (tuple(ref[:2]), ref[2], (0, 1))
    assert (vb.accepted, vb.bonus, vb.accepted_nodes) == (tuple(ref[:1]), ref[1], (0,))
    assert va.logits.shape[0] == 4 and vb.logits.shape[0] == 3
    alone = Decoder(model, "a", plugin_object=Chain(a.ids)).generate(prompt, 4)
    assert alone.output_ids[:3] == ref[:3]
    assert torch.equal(vb.logits[0], va.logits[0])


class Sees(Chain):
    """A chain drafter that records ``state.prior`` as it proposes."""

    def __init__(self, ids: list[int] | None = None) -> None:
        super().__init__(ids)
        self.priors: list[Draft | None] = []

    @selfspec.hookimpl
    def selfspec_propose(self, state: Any) -> Draft:
        self.priors.append(state.prior)
        return Draft.chain(self.ids[: state.max_draft_depth], device=state.runner.device)


def test_a_member_sees_the_earlier_members_merged_draft_as_prior(tiny_model_factory):
    model = tiny_model_factory("llama")
    a, b, c = Sees([5, 6, 7]), Sees([5, 9]), Sees([1])
    dec = Decoder(
        model,
        "a+b+c",
        {"budget": "8", "cheap_first": False},
        plugin_object={"a": a, "b": b, "c": c},
    )
    result = dec.generate([3, 4, 5, 6] * 4, 4)
    # the first step runs the members in the order given (none is measured yet)
    assert a.priors[0] is None  # the first member: no prior
    first = b.priors[0]
    assert first.tokens.tolist() == [5, 6, 7] and first.parents.tolist() == [-1, 0, 1]
    assert first.probs.shape == (3,) and first.best_path() == [5, 6, 7]
    merged = c.priors[0]  # a's chain and b's, sharing their first token
    assert merged.tokens.tolist() == [5, 6, 7, 9] and merged.parents.tolist() == [-1, 0, 1, 0]
    assert result.stats.members["c"]["proposed"] == len(c.priors)


def test_a_tree_drafter_extends_the_earlier_members_best_path(tiny_model_factory):
    # qspec grows its tree after a's chain (tree_extend on): the chain is a path of its draft,
    # scored by its own draft model, even where that model would not propose it; with
    # tree_extend off it drafts beside it, from the pending token alone
    model = tiny_model_factory("qwen2")
    prompt = [3, 4, 5, 6] * 12
    wrong = [17, 18, 19]  # a chain the draft model does not rank first
    found: dict[bool, set[tuple[int, ...]]] = {}
    for extend in (True, False):
        dec = Decoder(
            model,
            "a+qspec",
            {"cheap_first": False, "qspec.tree_extend": extend, "qspec.tree_budget": "500"},
            plugin_object={"a": Chain(wrong)},
        )
        member = dec.plugin.members[1]
        paths: set[tuple[int, ...]] = set()
        real = member.call

        def call(hook, real=real, paths=paths, **kwargs):
            d = real(hook, **kwargs)
            if hook == "selfspec_propose" and d is not None and d.parents is not None:
                nodes: list[tuple[int, ...]] = []
                for t, p in zip(d.tokens.tolist(), d.parents.tolist()):
                    nodes.append((nodes[p] if p >= 0 else ()) + (t,))
                paths.update(nodes)
            return d

        member.call = call
        result = dec.generate(prompt, 6)
        assert result.output_ids == selfspec.reference_generate(model, prompt, 6)
        found[extend] = paths
    assert tuple(wrong) in found[True] and any(
        len(p) > 3 and p[:3] == tuple(wrong) for p in found[True]
    )
    assert not any(p[:1] == (17,) for p in found[False])


def test_member_verdict_follows_the_committed_path_through_the_kept_nodes():
    comp = Composer("x+y", [])
    comp._remap = {0: 0, 1: 1, 3: 2}  # merged node 2 was cut
    p = _Proposal(member=None, tokens=[7, 8, 9], parents=None, where=[0, 1, 2], seconds=0.0)  # type: ignore[arg-type]
    v = comp.member_verdict(
        p, Verdict(accepted=(7, 8), bonus=9, accepted_nodes=(0, 1), kv_slots=(0, 1, 2))
    )
    assert (v.accepted, v.bonus, v.accepted_nodes, v.kv_slots, v.logits) == (
        (7, 8),
        9,
        (0, 1),
        (0, 1, 2),
        None,
    )
    q = _Proposal(member=None, tokens=[5], parents=None, where=[3], seconds=0.0)  # type: ignore[arg-type]
    w = comp.member_verdict(
        q, Verdict(accepted=(7, 8), bonus=9, accepted_nodes=(0, 1), kv_slots=(0, 1, 2))
    )
    assert (w.accepted, w.bonus, w.kv_slots) == ((), 7, (0,))


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_compositions_of_the_shipped_plugins_are_lossless(tiny_model_factory, arch):
    model = tiny_model_factory(arch)
    prompt = [3, 4, 5, 6] * 20 + list(range(20, 40))
    r = assert_lossless(model, ["lookup", "selfsd"], prompt, 48, {"selfsd.num_draft": 4})
    assert set(r.stats.members) == {"lookup", "selfsd"}
    assert_lossless(model, "selfdraft+clasp+lookup", prompt, 48)


def test_member_options_are_routed_and_validated(tiny_model_factory):
    model = tiny_model_factory("llama")
    dec = Decoder(model, "lookup+selfsd", {"lookup.num_draft": 3, "selfsd.gamma": 0.2})
    lookup, selfsd = (m.plugin for m in dec.plugin.members)
    assert lookup.num_draft == 3 and selfsd.threshold.gamma0 == pytest.approx(0.2)
    with pytest.raises(selfspec.OptionError, match="num_draft"):
        Decoder(model, "lookup+selfsd", {"num_draft": 3})
    with pytest.raises(selfspec.OptionError, match="lookup.num_draft"):
        Decoder(model, "lookup+selfsd", {"lookup.num_draft": 0})


def test_bench_routes_options_to_composition_members():
    from selfspec.app._bench.variants import _plugin_options

    routed = _plugin_options(
        ["lookup", "lookup+selfsd"], ["num_draft=4", "selfsd.gamma=0.3", "lookup.min_ngram=2"]
    )
    assert routed["lookup"] == {"num_draft": "4", "min_ngram": "2"}
    assert routed["lookup+selfsd"] == {
        "lookup.num_draft": "4",
        "selfsd.num_draft": "4",
        "selfsd.gamma": "0.3",
        "lookup.min_ngram": "2",
    }
