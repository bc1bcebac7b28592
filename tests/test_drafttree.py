"""Draft trees from any drafter (``draft_tree``) and the machine's cost curve
(docs/api/selfspec.md, docs/api/provisional.md).

Set-up, and why:
a) the expansion order, the choice of size and the cost curve are pure: checked against brute
   force with a scripted drafter whose logits depend only on a node's path;
b) the masks and positions of the depth-by-depth passes are checked on tiny float64 models,
   where a tree node's draft logits must equal exactly those of its path run as a plain chain;
c) losslessness of a tree-drafting plugin comes from the kit's ``assert_lossless``.
"""

from __future__ import annotations

import json
import zlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import selfspec
from selfspec import ArtefactStore, Decoder, Runner, draft_tree, skip_layer_step
from selfspec._engine.drafting.treeconfig import DEFAULT_GUESS
from selfspec.provisional import CostCurve, TreeCalibration, choose_size, cost_curve
from selfspec.testing import assert_lossless, tiny_model

PROMPT = [3, 7, 11, 7, 3, 9, 2]
V = 11  # the scripted drafter's vocabulary


# ------------------------------------------------------------------------------ a scripted drafter
class Scripted:
    """A drafter whose logits for a node depend only on the node's path (see a)): it learns the
    path from the mask and slots it is given, so a wrong mask gives wrong logits."""

    def __init__(self, seed: int, slot: int, pending: int) -> None:
        self.seed, self.slot = seed, slot
        self.paths: dict[int, tuple[int, ...]] = {slot: (pending,)}  # draft slot -> path of tokens
        self.calls: list[tuple[list[int], int, list[int], torch.Tensor | None]] = []

    def logits(self, path: tuple[int, ...]) -> torch.Tensor:
        g = torch.Generator().manual_seed(zlib.crc32(repr((self.seed, path)).encode()))
        return torch.randn(V, generator=g, dtype=torch.float64) * 3

    def __call__(self, ids, start, positions, mask):
        self.calls.append((ids.tolist(), start, positions.tolist(), mask))
        rows = []
        for r, t in enumerate(ids.tolist()):
            # a causal block from the pending token: row r's path is its first r + 1 ids
            if mask is None:
                path = tuple(ids.tolist()[: r + 1])
            else:  # the path: the slots this row sees past the pending token, in slot order
                seen = [s for s in range(self.slot + 1, start + r) if mask[r, s]]
                path = self.paths[self.slot] + tuple(self.paths[s][-1] for s in seen) + (t,)
            self.paths[start + r] = path
            rows.append(self.logits(path))
        return torch.stack(rows)


def _all_candidates(
    s: Scripted, topk: int, expanded: list[tuple[int, ...]]
) -> dict[tuple[int, ...], float]:
    """Brute force: the cumulative log-probability of every child of every expanded path."""
    out: dict[tuple[int, ...], float] = {}
    for path in expanded:
        base = sum(
            float(torch.log_softmax(s.logits(path[: i + 1]), -1)[path[i + 1]])
            for i in range(len(path) - 1)
        )
        lp = torch.log_softmax(s.logits(path), -1)
        for v, t in zip(*torch.topk(lp, topk)):
            out[path + (int(t),)] = base + float(v)
    return out


def _paths(tree) -> list[tuple[int, ...]]:
    paths: list[tuple[int, ...]] = []
    for t, p in zip(tree.tokens.tolist(), tree.parents.tolist()):
        paths.append((paths[p] if p >= 0 else ()) + (t,))
    return paths


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    topk=st.integers(1, 4),
    depth=st.integers(1, 5),
    budget=st.integers(1, 20),
)
def test_tree_is_the_most_probable_candidates(seed, topk, depth, budget):
    s = Scripted(seed, slot=6, pending=2)
    tree = draft_tree(s, torch.tensor([2]), 6, max_depth=depth, topk=topk, budget=budget)
    # the passes: the pending token, then one per depth over at most topk nodes
    # never deeper than budget
    assert len(s.calls) == min(depth, budget) and s.calls[0][:3] == ([2], 6, [6])
    expanded = [(2,)] + [
        s.paths[start + r] for ids, start, _, _ in s.calls[1:] for r in range(len(ids))
    ]
    cands = _all_candidates(s, topk, expanded)
    assert tree.candidates == len(cands)
    want = sorted(cands, key=lambda p: -cands[p])[: min(budget, len(cands))]
    got = [(2,) + p for p in _paths(tree)]
    assert sorted(got) == sorted(want) or sorted(cands[p] for p in got) == sorted(
        cands[p] for p in want
    )
    parents = tree.parents.tolist()
    assert all(-1 <= p < i for i, p in enumerate(parents))  # closed under ancestors, creation order
    for p, prob in zip(got, tree.probs.tolist()):
        assert prob == pytest.approx(float(torch.tensor(cands[p]).exp()), rel=1e-5)
    if len(tree):  # its Draft carries each node's probability, for a composition to value it by
        assert torch.equal(tree.draft().probs, tree.probs)
    # each depth expands the most probable newest candidates (EAGLE-2's frontier)
    for d, (ids, start, positions, _mask) in enumerate(s.calls[1:], 1):
        assert positions == [6 + d] * len(ids) and len(ids) <= topk
        newest = {p: v for p, v in cands.items() if len(p) == d + 1}
        chosen = [s.paths[start + r] for r in range(len(ids))]
        floor = min(cands[p] for p in chosen)
        assert all(v <= floor + 1e-12 for p, v in newest.items() if p not in chosen)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    topk=st.integers(1, 4),
    depth=st.integers(1, 6),
    prefix=st.lists(st.integers(0, V - 1), min_size=1, max_size=5),
)
def test_prefix_nodes_are_scored_by_the_draft_and_the_tree_grows_after_them(
    seed, topk, depth, prefix
):
    s = Scripted(seed, slot=6, pending=2)
    tree = draft_tree(
        s, torch.tensor([2]), 6, max_depth=depth, topk=topk, budget=500, prefix=prefix
    )
    chain = prefix[:depth]
    # the first pass runs the pending token and the prefix as one causal block
    assert (
        s.calls[0][:3] == ([2, *chain], 6, list(range(6, 7 + len(chain)))) and s.calls[0][3] is None
    )
    got = {(2,) + p: prob for p, prob in zip(_paths(tree), tree.probs.tolist())}
    # every prefix node, scored by the draft's own probability of its path
    for j in range(1, len(chain) + 1):
        path = (2, *chain[:j])
        assert path in got
    # every node (prefix, alternative, grown) by its path's draft probability
    for path, prob in got.items():
        lp = sum(
            float(torch.log_softmax(s.logits(path[:i]), -1)[path[i]]) for i in range(1, len(path))
        )
        assert prob == pytest.approx(float(torch.tensor(lp).exp()), rel=1e-5, abs=1e-30)
        assert len(path) - 1 <= depth
    # later passes: each node at its own depth's position
    for ids, start, positions, _mask in s.calls[1:]:
        assert positions == [6 + len(s.paths[start + r]) - 1 for r in range(len(ids))]


def test_prefix_beyond_room_or_depth_is_dropped():
    s = Scripted(3, slot=6, pending=2)
    tree = draft_tree(
        s, torch.tensor([2]), 6, max_depth=3, topk=2, budget=50, prefix=[1, 2, 3, 4, 5]
    )
    assert s.calls[0][0] == [2, 1, 2, 3] and max(len(p) for p in _paths(tree)) <= 3
    s = Scripted(3, slot=6, pending=2)
    tree = draft_tree(
        s, torch.tensor([2]), 6, max_depth=8, topk=2, budget=50, room=2, prefix=[1, 2, 3, 4, 5]
    )
    assert s.calls[0][0] == [2, 1, 2] and len(tree) <= 2


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    topk=st.integers(1, 4),
    depth=st.integers(1, 6),
    script=st.lists(st.integers(0, V - 1), min_size=0, max_size=5),
)
def test_guessed_tokens_run_after_the_best_frontier_node_and_are_scored_by_the_draft(
    seed, topk, depth, script
):
    s = Scripted(seed, slot=6, pending=2)
    asked: list[list[int]] = []

    def guess(path):
        asked.append(list(path))
        return script[len(path) % 2 :]  # any tokens: right or wrong, the draft scores them

    tree = draft_tree(s, torch.tensor([2]), 6, max_depth=depth, topk=topk, budget=500, guess=guess)
    # the pending token's guess, in the first pass
    assert asked[0] == [] and s.calls[0][0] == [2, *script[:depth]]
    got = {(2,) + p: prob for p, prob in zip(_paths(tree), tree.probs.tolist())}
    for path, prob in got.items():  # every node by its path's draft probability, within the depth
        lp = sum(
            float(torch.log_softmax(s.logits(path[:i]), -1)[path[i]]) for i in range(1, len(path))
        )
        assert prob == pytest.approx(float(torch.tensor(lp).exp()), rel=1e-5, abs=1e-30)
        assert len(path) - 1 <= depth
    for (ids, start, positions, mask), lead in zip(s.calls[1:], asked[1:]):
        # frontier rows, then the guess
        q = len(ids) - len(script[len(lead) % 2 :][: depth - len(lead)])
        # the guess follows the pass's first (most probable) node
        assert s.paths[start] == (2, *lead)
        chain = ids[q:]
        assert positions[q:] == [6 + len(lead) + j for j in range(1, len(chain) + 1)]
        # each guessed token is a node of the tree, after the lead
        for j in range(1, len(chain) + 1):
            assert (2, *lead, *chain[:j]) in got
        # a guess never sees the other frontier nodes
        assert mask[q:, start + 1 : start + q].sum() == 0


def test_a_right_guess_grows_the_tree_in_fewer_passes():
    s = Scripted(5, slot=6, pending=2)
    greedy: list[int] = []
    for _ in range(6):  # the draft's own most probable path
        greedy.append(int(s.logits((2, *greedy)).argmax()))
    plain = draft_tree(s, torch.tensor([2]), 6, max_depth=6, topk=1, budget=50)
    s2 = Scripted(5, slot=6, pending=2)
    guessed = draft_tree(
        s2,
        torch.tensor([2]),
        6,
        max_depth=6,
        topk=1,
        budget=50,
        guess=lambda path: greedy[len(path) :],
    )
    assert plain.passes == 6 and guessed.passes == 1  # one pass covers the six depths
    assert _paths(guessed) == _paths(plain) and torch.allclose(guessed.probs, plain.probs)


def test_a_guess_runs_as_far_as_its_rate_pays_on_the_draft_curve():
    flat = CostCurve((1, 64), (1.0, 1.0))  # verifying is free of width here
    steep = CostCurve((1, 2, 64), (1.0, 1.5, 32.5))  # each more draft row costs half a pass

    def first_pass(rate, draft_curve):
        s = Scripted(4, slot=6, pending=2)
        draft_tree(
            s,
            torch.tensor([2]),
            6,
            max_depth=8,
            topk=2,
            cost=flat,
            draft_cost=0.3,
            guess=lambda path: [1] * 8,
            guess_rate=rate,
            draft_curve=draft_curve,
        )
        return s.calls[0][0]

    # a guess that is nearly always right pays for its rows
    assert first_pass(0.99, steep) == [2] + [1] * 8
    assert first_pass(0.2, steep) == [2]  # one that is mostly wrong does not
    assert first_pass(0.2, None) == [2] + [1] * 8  # rows the curve calls free always pay
    s = Scripted(4, slot=6, pending=2)  # without a cost curve (a fixed budget) the whole guess runs
    draft_tree(
        s,
        torch.tensor([2]),
        6,
        max_depth=8,
        topk=2,
        budget=20,
        guess=lambda path: [1] * 8,
        guess_rate=0.0,
    )
    assert s.calls[0][0] == [2] + [1] * 8


def test_a_prefix_is_cut_where_its_probabilities_stop_paying():
    flat = CostCurve((1, 64), (1.0, 1.0))
    steep = CostCurve((1, 2, 64), (1.0, 1.5, 32.5))  # each more draft row costs half a pass

    def first_pass(probs):
        s = Scripted(4, slot=6, pending=2)
        draft_tree(
            s,
            torch.tensor([2]),
            6,
            max_depth=8,
            topk=2,
            cost=flat,
            draft_cost=0.3,
            prefix=[1] * 6,
            prefix_probs=probs,
            draft_curve=steep,
        )
        return s.calls[0][0]

    # a row costs 0.15; the k-th token saves 0.3 * its probability: the first two pay, the third not
    assert first_pass([0.9, 0.8, 0.1, 0.05, 0.01, 0.001]) == [2, 1, 1]
    assert first_pass([0.99] * 6) == [2] + [1] * 6
    assert first_pass(None) == [2] + [1] * 6  # no probabilities: the whole prefix, as given


def test_best_nodes_are_the_best_paths_nodes():
    tree = selfspec.Draft(
        torch.tensor([4, 5, 6, 7]),
        torch.tensor([-1, -1, 1, 1]),
        probs=torch.tensor([0.2, 0.7, 0.1, 0.5]),
    )
    assert tree.best_nodes() == [1, 3] and tree.best_path() == [5, 7]
    assert selfspec.Draft.chain([3, 2]).best_nodes() == [0, 1]


def test_tree_config_learns_how_often_its_guesses_agree():
    from types import SimpleNamespace

    probe = Scripted(8, slot=0, pending=2)
    right: list[int] = []
    for _ in range(5):  # the draft's own most probable continuation after the pending token 2
        right.append(int(probe.logits((2, *right)).argmax()))
    wrong = [int(probe.logits((2,)).argmin())] * 5

    def rate_after(continuation):
        config = selfspec.TreeConfig(enabled=True, budget=30, topk=2, guess=5)
        # "6 2" came before, followed by the continuation
        committed = [6, 2, *continuation, 9, 6, 2]
        state = _Fields(
            tokens=torch.tensor(committed + [0] * 40),
            length=len(committed),
            prior=None,
            cache=SimpleNamespace(capacity=64),
            max_draft_depth=6,
        )
        for _ in range(3):
            tree = config.draft(
                Scripted(8, slot=len(committed) - 1, pending=2), state, max_depth=5, draft_cost=0.5
            )
        return config.guess_rate, tree

    high, tree = rate_after(right)
    assert tree.guessed == 5 and tree.agreed == 5 and high > 0.8
    low, tree = rate_after(wrong)
    assert tree.guessed >= 1 and tree.agreed == 0 and low < 0.4  # (a later pass may guess too)


class _Fields:
    """A stand-in with the given attributes (and weak references, as a decode's state has)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


def test_frontier_mask_shows_only_ancestors():
    s = Scripted(1, slot=4, pending=5)
    draft_tree(s, torch.tensor([5]), 4, max_depth=4, topk=2, budget=30)
    for ids, start, positions, mask in s.calls[1:]:
        assert mask.shape == (len(ids), start + len(ids))
        assert mask[:, :5].all()  # the prefix and the pending token
        for r in range(len(ids)):
            seen = [j for j in range(5, start) if mask[r, j]]
            assert len(seen) == positions[r] - 4 - 1  # one ancestor per depth above it
            # itself, no sibling
            assert mask[r, start:].tolist() == [j == r for j in range(len(ids))]


@settings(max_examples=60, deadline=None)
@given(
    probs=st.lists(st.floats(0, 1), max_size=12),
    slope=st.floats(0.0, 1.0),
    draft=st.floats(0.0, 3.0),
)
def test_choose_size_is_the_best_ratio(probs, slope, draft):
    probs = sorted(probs, reverse=True)
    curve = CostCurve((1, 2, 40), (1.0, 1.0 + slope, 1.0 + 39 * slope))
    n, e, c = choose_size(probs, curve, draft)
    ratios = [(1 + sum(probs[:m])) / (draft + curve(m + 1)) for m in range(len(probs) + 1)]
    assert e / c == pytest.approx(max(ratios))
    assert ratios[n] == pytest.approx(max(ratios)) and (e, c) == pytest.approx(
        (1 + sum(probs[:n]), draft + curve(n + 1))
    )
    assert all(r < ratios[n] * (1 + 1e-9) for r in ratios[:n])  # ties go to the smaller tree


def test_flat_cost_takes_every_candidate_and_steep_cost_none():
    probs = [0.9, 0.5, 0.2, 0.1]
    assert choose_size(probs, CostCurve((1, 64), (1.0, 1.0)), 0.5)[0] == 4
    # a wider block costs too much
    assert choose_size(probs, CostCurve((1, 2), (1.0, 3.0)), 0.5)[0] == 0


def test_cost_stops_drafting_when_a_depth_cannot_pay():
    s = Scripted(3, slot=6, pending=2)
    steep = CostCurve((1, 2), (1.0, 50.0))
    tree = draft_tree(s, torch.tensor([2]), 6, max_depth=8, topk=3, cost=steep, draft_cost=0.5)
    assert len(s.calls) == 1 and len(tree) == 0  # nothing is worth verifying at that price
    s = Scripted(3, slot=6, pending=2)
    flat = CostCurve((1, 256), (1.0, 1.0))
    tree = draft_tree(s, torch.tensor([2]), 6, max_depth=5, topk=3, cost=flat, draft_cost=0.0)
    assert len(s.calls) == 5 and len(tree) == tree.candidates  # free: draft and verify everything


def test_confident_drafts_grow_a_chain_unsure_ones_a_tree():
    # a peaked drafter: one child takes almost all the mass, so expanding its siblings buys
    # nothing when a wider pass costs more; a flat drafter spreads the mass over siblings
    class Peaked(Scripted):
        def logits(self, path):
            out = super().logits(path)
            out[int(out.argmax())] += 40.0
            return out

    rising = CostCurve((1, 2, 8), (1.0, 1.3, 2.0))
    s = Peaked(5, slot=6, pending=2)
    draft_tree(s, torch.tensor([2]), 6, max_depth=6, topk=4, cost=rising, draft_cost=0.1)
    assert len(s.calls) == 6 and all(len(ids) == 1 for ids, _, _, _ in s.calls)

    class Flat(Scripted):
        def logits(self, path):
            return super().logits(path) * 0.01

    s = Flat(5, slot=6, pending=2)
    draft_tree(
        s,
        torch.tensor([2]),
        6,
        max_depth=3,
        topk=4,
        cost=CostCurve((1, 8), (1.0, 1.0)),
        draft_cost=0.1,
    )
    assert [len(ids) for ids, _, _, _ in s.calls][:2] == [1, 4]  # the root's children all expanded


def test_room_bounds_draft_slots_and_size():
    s = Scripted(0, slot=6, pending=2)
    tree = draft_tree(s, torch.tensor([2]), 6, max_depth=6, topk=3, budget=50, room=5)
    assert len(tree) <= 5
    assert max(start + len(ids) for ids, start, _, _ in s.calls) <= 6 + 1 + 5


def test_draft_tree_needs_a_budget_or_a_curve():
    with pytest.raises(ValueError, match="budget or a cost curve"):
        draft_tree(Scripted(0, 6, 2), torch.tensor([2]), 6, max_depth=3)


# ------------------------------------------------------------------------------ real passes (see b)
@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
@pytest.mark.parametrize("guess", [None, lambda path: [5, 9, 17, 3][len(path) % 2 :]])
def test_tree_pass_logits_equal_the_path_run_as_a_chain(arch, guess):
    runner = Runner(tiny_model(arch))
    cache = runner.new_cache(64)
    prompt = torch.tensor(PROMPT)
    slot = len(PROMPT) - 1
    runner.forward(prompt[:-1], cache=cache, start=0, logits=None)
    skip = (1,)
    inner = skip_layer_step(runner, cache, skip_mlp=skip)
    seen: list[tuple[torch.Tensor, int, torch.Tensor, torch.Tensor]] = []

    def step(ids, start, positions, mask):
        out = inner(ids, start, positions, mask)
        seen.append((ids, start, mask, out))
        return out

    tree = draft_tree(step, prompt[-1:], slot, max_depth=4, topk=3, budget=40, guess=guess)
    assert (len(seen) == 4 if guess is None else len(seen) >= 2) and len(tree) > 3
    # the guessed rows ran: the first pass's block, and after a later pass's frontier
    if guess is not None:
        assert seen[0][0].tolist()[1:] == [5, 9, 17, 3] and any(
            len(ids) > 3 for ids, *_ in seen[1:]
        )
    paths = {slot: []}
    for ids, start, mask, out in seen:
        for r, t in enumerate(ids.tolist()):
            # the first pass: [pending, guess...] causal from the pending token's slot
            if mask is None:
                path = ids.tolist()[1 : r + 1]
            else:  # a node (or a guessed token) sees its ancestors' slots, its own pass's included
                path = [paths[j][-1] for j in range(slot + 1, start + r) if mask[r, j]] + [t]
            paths[start + r] = path
            # the same prefix (full model), then [pending, path...] as a causal chain
            fresh = runner.new_cache(64)
            runner.forward(prompt[:-1], cache=fresh, start=0, logits=None)
            chain = torch.tensor(PROMPT[-1:] + path)
            ref = runner.forward(chain, cache=fresh, start=slot, skip_mlp=skip).logits[-1]
            torch.testing.assert_close(out[r], ref, rtol=0, atol=1e-10)


def test_runner_prefix_mask_hides_cached_slots():
    runner = Runner(tiny_model("llama"))
    ids = torch.tensor(PROMPT)
    cache = runner.new_cache(16)
    runner.forward(ids[:5], cache=cache, start=0, logits=None)
    # [q, start+q]: all of the prefix, causal block
    block = torch.ones(2, 7, dtype=torch.bool).tril_(5)
    full = runner.forward(ids[5:], cache=cache, start=5, block_mask=block).logits
    plain = runner.forward(ids[5:], cache=cache, start=5).logits
    torch.testing.assert_close(full, plain, rtol=0, atol=0)
    hide = block.clone()
    hide[:, 2] = False  # slot 2 hidden from the block's two tokens
    got = runner.forward(ids[5:], cache=cache, start=5, block_mask=hide).logits
    one = torch.ones(7, 7, dtype=torch.bool).tril_()
    one[5:, 2] = False  # the same visibility, all seven tokens in one block without a cache
    ref = runner.forward(ids, block_mask=one).logits[-2:]
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="block mask"):
        runner.forward(ids[5:], cache=cache, start=5, block_mask=torch.ones(2, 3, dtype=torch.bool))


# ------------------------------------------------------------------------------ the cost curve
def test_cost_curve_interpolates_and_is_monotone():
    c = CostCurve.from_times([1, 4, 8], [0.010, 0.009, 0.020])
    assert c.costs == (1.0, 1.0, 2.0)  # a faster wider block is noise: never below the narrower
    assert c(1) == 1.0 and c(6) == pytest.approx(1.5) and c(12) == pytest.approx(3.0)
    with pytest.raises(ValueError):
        CostCurve((2, 4), (1.0, 1.0))


def test_cost_curve_is_measured_once_and_kept(tmp_path, monkeypatch):
    from selfspec._engine.runner import costcurve

    runner = Runner(tiny_model("llama"))
    store = ArtefactStore("drafttree", root=tmp_path)
    calls = []
    real = costcurve.measure_cost_curve

    def counting(r, widths, weights=None):
        calls.append(weights)
        return real(r, (1, 2, 4), repeats=1, weights=weights)

    monkeypatch.setattr(costcurve, "measure_cost_curve", counting)
    monkeypatch.setattr(costcurve, "_MEMO", {})
    first = cost_curve(runner, store=store)
    files = list(tmp_path.glob("costcurve-*.json"))
    assert len(calls) == 1 and len(files) == 1 and first.costs[0] == 1.0
    blob = json.loads(files[0].read_text())
    assert blob["widths"] == [1, 2, 4] and blob["meta"]["machine"]["threads"] >= 1
    monkeypatch.setattr(costcurve, "_MEMO", {})  # a new process: read from the store
    assert cost_curve(runner, store=store) == first and len(calls) == 1
    cost_curve(runner, store=store, refresh=True)
    assert len(calls) == 2
    # draft passes on compressed weights: their own curve, their own file, measured on those weights
    weights = selfspec.draft_weights(runner, "int8")
    draft = cost_curve(runner, store=store, weights=weights)
    assert calls[-1] is weights and draft.costs[0] == 1.0
    # ... timed beside one-token forwards of the full model: a pass's cost in full forwards
    assert draft.relative == pytest.approx(
        draft.meta["seconds_per_width"][0] / draft.meta["full_seconds"]
    )
    assert draft.relative > 0 and first.relative is None
    assert len(list(tmp_path.glob("costcurve-*-draft-int8-*.json"))) == 1
    assert cost_curve(runner, store=store, weights=weights) is draft and len(calls) == 3
    # weights that compress nothing run the model itself: the model's curve
    assert cost_curve(
        runner, store=store, weights=selfspec.draft_weights(runner, "none")
    ) is cost_curve(runner, store=store)
    assert len(calls) == 3


def test_a_curve_is_measured_again_under_another_torch(tmp_path, monkeypatch):
    # the kernels are torch's: a curve measured under one torch is not read under another
    from selfspec._engine.runner import costcurve

    runner = Runner(tiny_model("llama", dtype=torch.float32), weight_layout="model")
    store = ArtefactStore("drafttree", root=tmp_path)
    calls = []
    monkeypatch.setattr(
        costcurve,
        "measure_cost_curve",
        lambda r, widths, weights=None: calls.append(weights) or CostCurve((1, 2), (1.0, 1.1)),
    )
    monkeypatch.setattr(costcurve, "_MEMO", {})
    cost_curve(runner, store=store)
    # a new process, the same torch: read from the store
    monkeypatch.setattr(costcurve, "_MEMO", {})
    cost_curve(runner, store=store)
    assert len(calls) == 1
    monkeypatch.setattr(costcurve, "_MEMO", {})
    monkeypatch.setattr(torch, "__version__", "0.0.0-another")
    cost_curve(runner, store=store)
    assert len(calls) == 2 and len(list(tmp_path.glob("costcurve-*.json"))) == 2


def test_tree_config_holds_the_draft_weights_curve_and_drafts_with_it(monkeypatch):
    from selfspec._engine.drafting import treeconfig

    runner = Runner(tiny_model("llama"))
    weights = selfspec.draft_weights(runner, "int8")
    model_curve, weights_curve = CostCurve((1, 4), (1.0, 1.1)), CostCurve((1, 4), (1.0, 3.0))
    monkeypatch.setattr(
        treeconfig,
        "cost_curve",
        lambda r, weights=None: model_curve if weights is None else weights_curve,
    )
    auto = {"tree": True, "tree_budget": "auto"}
    config = selfspec.TreeConfig.from_options(auto, runner, weights=weights)
    assert config.curve is model_curve and config.draft_curve is weights_curve
    # no draft weights: no draft curve
    assert selfspec.TreeConfig.from_options(auto, runner).draft_curve is None
    assert (
        selfspec.TreeConfig.from_options(
            {**auto, "tree_budget": "6"}, runner, weights=weights
        ).draft_curve
        is None
    )
    seen = []
    monkeypatch.setattr(
        treeconfig,
        "draft_tree",
        lambda *a, **k: seen.append(k["draft_curve"]) or _Fields(guessed=0, agreed=0),
    )
    state = _Fields(
        tokens=torch.tensor([1, 2, 3, 0]),
        length=3,
        prior=None,
        max_draft_depth=4,
        cache=_Fields(capacity=8),
    )
    config.draft(None, state, max_depth=2, draft_cost=0.5)
    # an explicit curve wins
    config.draft(None, state, max_depth=2, draft_cost=0.5, draft_curve=model_curve)
    assert seen == [weights_curve, model_curve]


def test_a_draft_pass_costs_its_share_of_blocks_times_the_measured_relative_cost():
    config = selfspec.TreeConfig(draft_curve=CostCurve((1, 4), (1.0, 1.5), {"relative": 0.3}))
    assert config.pass_cost() == pytest.approx(0.3)
    # measured: the estimate is unused
    assert config.pass_cost(0.5, default=0.9) == pytest.approx(0.15)
    unmeasured = selfspec.TreeConfig()  # a fixed budget, or no draft weights: no draft curve
    assert unmeasured.pass_cost(0.5) == 0.5 and unmeasured.pass_cost(
        0.5, default=0.25
    ) == pytest.approx(0.125)
    # a curve stored before passes were timed against full forwards has no relative cost
    assert selfspec.TreeConfig(draft_curve=CostCurve((1,), (1.0,))).pass_cost(0.8) == 0.8


# ------------------------------------------------------------------------------ lossless (see c)
class TreePlugin:
    """A minimal tree drafter: the model with one MLP block skipped, verified by the host."""

    def __init__(self) -> None:
        self.budget: int | None = 6

    @selfspec.hookimpl
    def selfspec_propose(self, state):
        base = state.length - 1
        step = skip_layer_step(state.runner, state.cache, skip_mlp=(0,))
        curve = CostCurve((1, 4, 64), (1.0, 1.2, 8.0)) if self.budget is None else None
        tree = draft_tree(
            step,
            state.tokens[base : base + 1],
            base,
            max_depth=min(4, state.max_draft_depth),
            topk=3,
            budget=self.budget,
            cost=curve,
            room=state.cache.capacity - base - 1,
        )
        return tree.draft()


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3", "mistral"])
@pytest.mark.parametrize("budget", [None, 1, 6])
def test_tree_drafts_are_lossless(arch, budget):
    plugin = TreePlugin()
    plugin.budget = budget
    result = assert_lossless(
        tiny_model(arch), "tree", [5, 9, 17, 3, 5, 9], 20, plugin_object=plugin
    )
    assert result.stats.drafted > 0


def test_tree_plugin_decodes_like_greedy_at_every_length():
    model = tiny_model("qwen2")
    for n in (1, 2, 7):
        dec = Decoder(model, "tree", plugin_object=TreePlugin)
        ref = selfspec.reference_generate(model, PROMPT, n, ())
        assert dec.generate(PROMPT, n, eos_token_ids=()).output_ids == ref


# ------------------------------------------------------------------------------ calibration
def test_calibration_learns_acceptance_by_draft_probability():
    cal = TreeCalibration(bins=10, prior=4.0)
    assert cal(0.3) == pytest.approx(0.3)  # no evidence: the raw probability
    # a tree: two root children (0.3 accepted, 0.25 not), a child of the accepted one (0.35,
    # accepted) and a child of the rejected one (never counted: its parent failed)
    tree = selfspec.DraftTree(
        torch.tensor([1, 2, 3, 4]),
        torch.tensor([-1, -1, 0, 1]),
        torch.ones(4),
        local=(0.3, 0.25, 0.35, 0.9),
    )
    for _ in range(20):
        cal.observe(tree, (0, 2))
    assert cal.seen[2] == 20 and cal.accepted[2] == 0  # bin [0.2, 0.3): the 0.25s, never accepted
    # bin [0.3, 0.4): 0.3 and 0.35, always accepted
    assert cal.seen[3] == 40 and cal.accepted[3] == 40
    assert cal.seen[9] == 0
    assert cal(0.35) > 0.9 and cal(0.25) < 0.05 and cal(0.95) == pytest.approx(0.95)


def test_calibrated_scores_grow_bigger_trees_for_an_underconfident_draft():
    class Sure(TreeCalibration):
        def __call__(self, p):
            return min(1.0, 3 * p)  # accepted three times as often as the draft says

    curve = CostCurve((1, 8, 64), (1.0, 1.3, 4.0))
    plain = draft_tree(
        Scripted(2, 6, 2), torch.tensor([2]), 6, max_depth=6, topk=3, cost=curve, draft_cost=0.3
    )
    sure = draft_tree(
        Scripted(2, 6, 2),
        torch.tensor([2]),
        6,
        max_depth=6,
        topk=3,
        cost=curve,
        draft_cost=0.3,
        calibrate=Sure(),
    )
    assert len(sure) > len(plain) and sure.passes >= plain.passes
    assert all(0 < p <= 1 for p in sure.local)


def test_tree_config_observes_its_last_tree():
    runner = Runner(tiny_model("llama"))
    config = selfspec.TreeConfig.from_options(
        {"tree": True, "tree_budget": "4", "tree_topk": 2}, runner
    )
    assert config.budget == 4 and config.curve is None and config.calibration is not None
    dec = Decoder(runner.model, "tree", plugin_object=_ConfigPlugin(config))
    dec.generate(PROMPT, 12, eos_token_ids=())
    assert sum(config.calibration.seen) > 0 and config.last is None


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3", "mistral"])
def test_tree_guesses_from_the_context_are_lossless(arch):
    # a prompt that repeats itself, so the context's n-grams guess (right or wrong) every step
    model = tiny_model(arch)
    config = selfspec.TreeConfig.from_options(
        {"tree": True, "tree_budget": "8", "tree_guess": 4}, Runner(model)
    )
    result = assert_lossless(
        model, "tree", [5, 9, 17, 3, 5, 9, 17, 3, 5, 9], 24, plugin_object=_ConfigPlugin(config)
    )
    assert result.stats.drafted > 0


def test_tree_config_guesser_follows_the_decode():
    def State(committed):  # noqa: N802 - the two fields the guesser reads
        return _Fields(tokens=torch.tensor(committed + [0] * 8), length=len(committed))

    config = selfspec.TreeConfig(enabled=True, budget=4, guess=3)
    state = State([1, 2, 3, 4, 1, 2])
    guess = config.guesser(state)
    assert guess([]) == (3, 4, 1) and guess([3]) == (4, 1, 2) and guess([7, 7]) == ()
    state.tokens[6:8] = torch.tensor([3, 9])  # two more committed: the index grows with them
    state.length = 8
    assert config.guesser(state)([]) == () and config.guesser(state)([1, 2]) == (3, 9)
    other = State([5, 6, 5])  # a new decode: a new index, nothing of the last one's
    assert config.guesser(other)([]) == () and config.guesser(other)([6]) == (5,)
    assert selfspec.TreeConfig(enabled=True, budget=4, guess=0).guesser(state) is None


class _ConfigPlugin:
    def __init__(self, config, draft_cost=0.5):
        self.config, self.draft_cost = config, draft_cost

    @selfspec.hookimpl
    def selfspec_propose(self, state):
        step = skip_layer_step(state.runner, state.cache, skip_mlp=(0,))
        return self.config.draft(
            step, state, max_depth=min(3, state.max_draft_depth), draft_cost=self.draft_cost
        ).draft()

    @selfspec.hookimpl
    def selfspec_update_policy(self, state, verdict):
        self.config.observe(verdict)


def test_register_tree_options_takes_the_plugins_default():
    # a plugin whose measurements favour trees declares tree=True; the rest stay as declared
    from selfspec import register_tree_options

    for default in (False, True):
        options = []
        register_tree_options(options.append, topk=3, tree=default)
        got = {o.name: o.default for o in options}
        assert got == {
            "tree": default,
            "tree_budget": "auto",
            "tree_topk": 3,
            "tree_calibrate": True,
            "tree_extend": True,
            "tree_guess": DEFAULT_GUESS,
            "tree_pause": True,
        }


def test_tree_pause_skips_drafting_while_trees_do_not_pay_and_probes_between_pauses(monkeypatch):
    from selfspec._engine.drafting import treeconfig

    config = selfspec.TreeConfig(enabled=True, budget=4, pause=True)
    three = treeconfig.DraftTree(
        torch.tensor([4, 5, 6]), torch.tensor([-1, 0, 1]), torch.tensor([0.5, 0.4, 0.3])
    )
    monkeypatch.setattr(treeconfig, "draft_tree", lambda *a, **k: three)
    state = _Fields(
        tokens=torch.tensor([1, 2, 3, 0, 0, 0]),
        length=3,
        prior=None,
        max_draft_depth=3,
        cache=_Fields(capacity=6),
        stats=_Fields(extra={}),
    )

    def steps(n, accepted=()):
        drafted = ""
        for _ in range(n):
            tree = config.draft(None, state, max_depth=3, draft_cost=0.5)
            drafted += "D" if len(tree) else "."
            config.observe(_Fields(accepted_nodes=accepted))
        return drafted

    # nothing accepted: the estimate (one virtual tree with one token accepted, then the real
    # trees, each kept at 0.9 a tree) falls below the pass's cost after the first tree; then pauses
    # of 1, 2, 4, 8 steps, each followed by one probing tree
    assert steps(20) == "D.D..D....D........D"
    assert config.paused == 15 and state.stats.extra["tree_paused"] == 15
    # the next pause (16 steps), then a probe whose whole tree is accepted: that restores the
    # estimate, so the drafter drafts every step again and its next pause would be one step
    assert steps(16) == "." * 16 and steps(1, accepted=(0, 1, 2)) == "D"
    assert steps(4, accepted=(0, 1, 2)) == "DDDD" and config._next_pause == 1
    # without tree_pause the drafter never pauses, however little is accepted
    config = selfspec.TreeConfig(enabled=True, budget=4)
    assert steps(10) == "D" * 10 and config.paused == 0


def test_tree_pause_is_an_option_and_a_paused_decode_is_lossless():
    model = tiny_model("llama")
    runner = Runner(model)
    assert (
        selfspec.TreeConfig.from_options({"tree": True, "tree_budget": "4"}, runner).pause is False
    )
    # a draft pass said to cost 4 forwards can never pay (at most 3 tokens accepted a tree): it
    # pauses
    config = selfspec.TreeConfig.from_options(
        {"tree": True, "tree_budget": "4", "tree_pause": True}, runner
    )
    plugin = _ConfigPlugin(config, draft_cost=4.0)
    result = assert_lossless(model, "tree", PROMPT, 40, plugin_object=plugin)
    assert config.paused == result.stats.extra["tree_paused"] > 0 and result.stats.drafted > 0
