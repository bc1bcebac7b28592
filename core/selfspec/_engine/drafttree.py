"""Dynamic draft trees from any drafter: expand by cumulative draft probability, size by cost.

A drafter here is one *draft pass*: a callable ``step(ids, start, positions, mask) -> logits``
that runs the draft model (the model with blocks skipped, an early exit, ...) over a block of
``q`` tokens written at cache slots ``[start, start+q)`` and returns its logits ``[q, V']``.
:func:`draft_tree` grows a tree with it, depth by depth, as EAGLE-2 and SWIFT do:

1. the pending token's pass gives the root's ``topk`` children, each scored by its cumulative
   draft probability (the product of the draft probabilities along its path);
2. at every depth up to ``topk`` newest candidates with the highest cumulative probability
   (the *frontier*) run one pass together, each seeing the prefix, the pending token and its
   own ancestors only (a ``[q, start+q]`` block mask over the draft slots, positions by
   depth), and each adds its own ``topk`` children as candidates;
3. the tree sent to verification is the ``n`` candidates with the highest cumulative
   probability (closed under ancestors: a child never scores above its parent), ``n`` fixed
   (``budget``) or chosen to maximise expected committed tokens per unit of cost, from the
   machine's measured cost-per-width curve (:class:`selfspec.provisional.CostCurve`):
   ``(1 + sum of the chosen nodes' probabilities) / (draft cost + verify cost(n + 1))``.

With a cost curve, the frontier's width and the depth are chosen by cost too: a pass over the
``q`` best frontier nodes costs ``draft_cost * cost(q)``, verifying ``q`` more nodes costs the
curve's growth, and it can add at most their probability mass in expected tokens; the pass
runs with the ``q`` that maximises the optimistic ratio ``(expected + mass) / (cost + pass cost
+ verify growth)``, and drafting stops when no ``q`` beats the best
tree's expected tokens per unit of cost so far (a confident draft grows a chain, an unsure
one a wider tree where wide passes are cheap).

The tree's tokens are the draft model's guesses; verification (``verify_tree``) decides, so the
output is greedy decoding's whatever the drafter, the probabilities or the curve say.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from selfspec._engine.runner import KVCache, Runner
from selfspec._engine.types import Draft

#: A draft pass: ``(ids [q], start, positions [q], mask [q, start+q] or None) -> logits [q, V']``.
DraftStep = Callable[[torch.Tensor, int, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


@dataclass(frozen=True)
class DraftTree:
    """A drafted tree, its nodes in creation order (``parents[i] < i``, ``-1`` = the pending token).

    ``tokens``/``parents``: ``[n]`` int64; ``probs``: ``[n]`` float, each node's cumulative
    draft probability; ``passes``: draft passes run (the pending token's included); ``ran``:
    tokens those passes ran in all; ``candidates``: nodes scored before the choice of size;
    ``expected``: ``1 + probs.sum()``, the expected committed tokens if the draft's
    probabilities were exact; ``cost``: the step's estimated cost in one-token verify
    forwards (``nan`` without a curve).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    probs: torch.Tensor
    passes: int = 0
    ran: int = 0
    candidates: int = 0
    expected: float = 1.0
    cost: float = float("nan")
    widths: tuple[int, ...] = field(default=())
    local: tuple[float, ...] = field(default=())

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def draft(self, owner: Any = None, **meta: Any) -> Draft:
        """The tree as a :class:`selfspec.Draft` (empty when no node was chosen), carrying each
        node's (calibrated) probability as ``probs``."""
        if len(self) == 0:
            return Draft(self.tokens, None, dict(meta), owner)
        return Draft(self.tokens, self.parents, dict(meta), owner, self.probs)


def draft_tree(
    step: DraftStep,
    pending: torch.Tensor,
    slot: int,
    *,
    max_depth: int,
    topk: int = 4,
    budget: int | None = None,
    cost: Callable[[int], float] | None = None,
    draft_cost: float = 0.5,
    room: int | None = None,
    vocab: torch.Tensor | None = None,
    calibrate: Callable[[float], float] | None = None,
    prefix: Sequence[int] = (),
) -> DraftTree:
    """Grow a draft tree after ``pending`` (``[1]`` int64, at cache slot ``slot``) with ``step``.

    max_depth: deepest node (the host's ``state.max_draft_depth`` bounds it). topk: children
    kept per expanded node, and nodes expanded per depth. budget: most nodes in the tree;
    ``None`` = chosen by ``cost`` (then required). cost: verify cost of a block of ``w`` tokens
    in one-token forwards (a :class:`selfspec.provisional.CostCurve`); ``None`` = no early stop, the tree
    is the ``budget`` best nodes. draft_cost: a draft pass's cost relative to a full forward of
    the same width. room: free cache slots after ``slot`` (the expanded nodes' draft slots, and
    the tree's size, stay within it). vocab: ``[V']`` token ids of ``step``'s logit columns
    when it scores a vocabulary subset (``None``: column = token id). calibrate: maps a node's
    own draft probability to the probability that it is accepted when its parent is (a
    :class:`TreeCalibration`); every score above uses the calibrated values.
    prefix: a chain of tokens to draft after (another drafter's guess, e.g. a composition's
    earlier members, :attr:`selfspec.DecodeState.prior`): the first pass runs the pending token
    and the prefix together (causal), so each prefix token becomes a node scored by the draft's
    own probability of it, beside its ``topk`` alternatives, and the tree grows from all of
    them; a prefix token past ``max_depth`` or the room is dropped.

    Cache: the first pass writes slots ``[slot, slot + len(prefix)]``; the ``j``-th node expanded
    after it writes the next free slot, past the committed prefix, so verification overwrites them.
    """
    if budget is None and cost is None:
        raise ValueError("draft_tree needs a budget or a cost curve to choose one")
    if topk < 1:
        raise ValueError("topk must be >= 1")
    room = 1 << 30 if room is None else room
    cap = min(room, budget if budget is not None else room)
    dev = pending.device
    tokens: list[int] = []
    parents: list[int] = []
    logp: list[float] = []  # cumulative log-probability of each candidate
    local: list[float] = []  # each candidate's own raw draft probability
    slot_of: dict[int, int] = {}  # expanded node -> its draft slot
    widths: list[int] = []
    d_cost = 0.0
    empty = DraftTree(torch.empty(0, dtype=torch.long, device=dev), torch.empty(0, dtype=torch.long, device=dev),
                      torch.empty(0, dtype=torch.float32, device=dev))
    if max_depth <= 0 or cap <= 0:
        return empty
    max_depth = min(max_depth, cap)  # a tree of cap nodes is never deeper

    # a) the pending token's pass (with the prefix after it): the root's children, and each
    #    prefix token's node with its alternatives and children
    chain = [int(t) for t in prefix][: min(max_depth, room)]
    ids = pending if not chain else torch.cat([pending, torch.tensor(chain, dtype=torch.long, device=dev)])
    w = len(chain) + 1
    logits = step(ids, slot, torch.arange(slot, slot + w, device=dev), None)  # logits: [w, V'], causal
    widths.append(w)
    d_cost += draft_cost * (cost(w) if cost is not None else 1.0)
    depth: list[int] = []
    expanded: set[int] = set()
    parent, parent_logp = -1, 0.0
    for j in range(w):
        first = len(tokens)
        lp = _log_probs(logits[j])
        if j < max_depth:  # children within the deepest depth allowed
            _add_children(lp, parent, parent_logp, topk, vocab, calibrate, tokens, parents, logp, local)
            depth.extend([j + 1] * (len(tokens) - first))
        if j == len(chain):
            break
        node = next((i for i in range(first, len(tokens)) if tokens[i] == chain[j]), None)
        if node is None:  # the draft does not rank the prefix token in its top k: score it alone
            node = _add_token(lp, chain[j], parent, parent_logp, vocab, calibrate, tokens, parents, logp, local)
            depth.append(j + 1)
        slot_of[node] = slot + 1 + j
        expanded.add(node)
        parent, parent_logp = node, logp[node]
    frontier = [i for i in range(len(tokens)) if i not in expanded]
    next_slot = slot + w
    best_n, best_e, best_c = _best_size(logp, cost, d_cost, cap)

    # b) one pass per depth over the frontier, each node seeing only its ancestors' slots
    for _ in range(1, max_depth):
        frontier = [i for i in frontier if depth[i] < max_depth]
        frontier = sorted(frontier, key=lambda i: (-logp[i], i))[: min(topk, room - (next_slot - slot - 1))]
        if cost is not None:  # as wide as pays for itself; stop when no width does
            frontier = frontier[: _frontier_width([math.exp(logp[i]) for i in frontier], cost, draft_cost,
                                                  best_n, best_e, best_c)]
        if not frontier:
            break
        q = len(frontier)
        start = next_slot
        mask = _frontier_mask(frontier, parents, slot_of, slot, start, dev)  # [q, start+q]
        ids = torch.tensor([tokens[i] for i in frontier], dtype=torch.long, device=dev)
        positions = torch.tensor([slot + depth[i] for i in frontier], dtype=torch.long, device=dev)
        logits = step(ids, start, positions, mask)  # logits: [q, V']
        widths.append(q)
        d_cost += draft_cost * (cost(q) if cost is not None else 1.0)
        for r, i in enumerate(frontier):
            slot_of[i] = start + r
        next_slot = start + q
        first_new = len(tokens)
        for r, i in enumerate(frontier):
            _add_children(_log_probs(logits[r]), i, logp[i], topk, vocab, calibrate, tokens, parents, logp, local)
            depth.extend([depth[i] + 1] * (len(tokens) - len(depth)))
        frontier = list(range(first_new, len(tokens)))
        best_n, best_e, best_c = _best_size(logp, cost, d_cost, cap)

    # c) the tree: the best_n candidates by cumulative probability, in creation order
    chosen = sorted(sorted(range(len(tokens)), key=lambda i: (-logp[i], i))[:best_n])
    remap = {old: new for new, old in enumerate(chosen)}
    remap[-1] = -1
    return DraftTree(
        tokens=torch.tensor([tokens[i] for i in chosen], dtype=torch.long, device=dev),
        parents=torch.tensor([remap[parents[i]] for i in chosen], dtype=torch.long, device=dev),
        probs=torch.tensor([logp[i] for i in chosen], dtype=torch.float64).exp().to(torch.float32).to(dev),
        passes=len(widths), ran=sum(widths), candidates=len(tokens), expected=best_e,
        cost=best_c if cost is not None else float("nan"), widths=tuple(widths),
        local=tuple(local[i] for i in chosen),
    )


def choose_size(probs: Sequence[float], cost: Callable[[int], float], draft_cost: float,
                limit: int | None = None) -> tuple[int, float, float]:
    """The tree size ``n`` (the ``n`` most probable nodes, ``probs`` sorted high to low) that
    maximises ``(1 + sum(probs[:n])) / (draft_cost + cost(n + 1))``; returns ``(n, expected
    tokens, cost)``. ``draft_cost`` is what drafting already spent, in the units of ``cost``;
    ``limit`` caps ``n``. Ties go to the smaller tree."""
    top = len(probs) if limit is None else min(limit, len(probs))
    best = (0, 1.0, draft_cost + cost(1))
    e = 1.0
    for n in range(1, top + 1):
        e += float(probs[n - 1])
        c = draft_cost + cost(n + 1)
        if e * best[2] > best[1] * c:
            best = (n, e, c)
    return best


def skip_layer_step(runner: Runner, cache: KVCache, *, skip_attn: Collection[int] = (),
                    skip_mlp: Collection[int] = (), weights: Any = None) -> DraftStep:
    """A draft pass of the model with the given attention/MLP blocks skipped (the drafter of
    ``skip_layer_draft``, for :func:`draft_tree`): a forward at ``start`` with ``positions``
    and the block mask, the LM head on every row; ``weights``: the model's draft weights
    (:func:`selfspec.draft_weights`), as for ``skip_layer_draft``."""

    def step(ids: torch.Tensor, start: int, positions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return runner.forward(ids, cache=cache, start=start, positions=positions, block_mask=mask,
                              skip_attn=skip_attn, skip_mlp=skip_mlp, weights=weights).logits

    return step


# ------------------------------------------------------------------------------ helpers
def _log_probs(logits: torch.Tensor) -> torch.Tensor:
    """A pass row's draft log-probabilities ``[V']`` (in at least float32)."""
    return torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)


def _add_children(lp: torch.Tensor, parent: int, parent_logp: float, topk: int, vocab: torch.Tensor | None,
                  calibrate: Callable[[float], float] | None, tokens: list[int], parents: list[int],
                  logp: list[float], local: list[float]) -> None:
    """Append ``parent``'s ``topk`` most probable children (log-probabilities ``lp`` ``[V']``) as candidates; a
    child's cumulative log-probability never exceeds its parent's (so the most probable
    candidates always form a tree)."""
    vals, idx = torch.topk(lp, min(topk, int(lp.shape[0])))
    ids = idx if vocab is None else vocab.index_select(0, idx)
    for v, t in zip(vals.tolist(), ids.tolist()):
        p = math.exp(min(float(v), 0.0))
        own = p if calibrate is None else min(max(float(calibrate(p)), 1e-12), 1.0)
        tokens.append(int(t))
        parents.append(parent)
        logp.append(parent_logp + math.log(own))
        local.append(p)


def _add_token(lp: torch.Tensor, token: int, parent: int, parent_logp: float, vocab: torch.Tensor | None,
               calibrate: Callable[[float], float] | None, tokens: list[int], parents: list[int],
               logp: list[float], local: list[float]) -> int:
    """Append ``token`` as a child of ``parent`` scored by its draft probability (``lp``
    ``[V']``; a token outside the draft's vocabulary ``vocab`` scores as impossible); returns
    its index."""
    if vocab is None:
        col = token
    else:
        hit = torch.nonzero(vocab == token).flatten()
        col = int(hit[0]) if len(hit) else -1
    p = math.exp(min(float(lp[col]), 0.0)) if 0 <= col < int(lp.shape[0]) else 0.0
    own = p if calibrate is None else float(calibrate(p))
    tokens.append(int(token))
    parents.append(parent)
    logp.append(parent_logp + math.log(min(max(own, 1e-12), 1.0)))
    local.append(p)
    return len(tokens) - 1


def _frontier_width(probs: list[float], cost: Callable[[int], float], draft_cost: float, n: int, e: float,
                    c: float) -> int:
    """How many of the frontier's best nodes (``probs``, high to low) to expand, given the best
    tree so far (``n`` nodes, ``e`` expected tokens, cost ``c``): the ``q`` whose optimistic
    ratio is highest, if it beats ``e / c``, else 0. Optimistic: the ``q`` nodes' children can
    add at most the nodes' probability mass, for the pass and at least ``q`` more verified
    nodes: ``(e + sum(probs[:q])) / (c + draft_cost * cost(q) + cost(n + 1 + q) - cost(n + 1))``."""
    best_q, best = 0, e / c
    gain = 0.0
    for q, p in enumerate(probs, 1):
        gain += p
        r = (e + gain) / (c + draft_cost * cost(q) + cost(n + 1 + q) - cost(n + 1))
        if r > best:
            best_q, best = q, r
    return best_q


def _best_size(logp: list[float], cost: Callable[[int], float] | None, d_cost: float,
               cap: int) -> tuple[int, float, float]:
    """``(n, expected, cost)`` of the best tree from the candidates so far."""
    probs = sorted((math.exp(x) for x in logp), reverse=True)
    if cost is None:
        n = min(cap, len(probs))
        return n, 1.0 + sum(probs[:n]), float("nan")
    return choose_size(probs, cost, d_cost, cap)


def _frontier_mask(frontier: list[int], parents: list[int], slot_of: dict[int, int], slot: int, start: int,
                   device: torch.device) -> torch.Tensor:
    """``[q, start+q]`` bool: every frontier node sees slots ``[0, slot]`` (the prefix and the
    pending token), the draft slots of its own ancestors, and itself."""
    q = len(frontier)
    mask = torch.zeros(q, start + q, dtype=torch.bool)
    mask[:, : slot + 1] = True
    for r, i in enumerate(frontier):
        p = parents[i]
        while p >= 0:
            mask[r, slot_of[p]] = True
            p = parents[p]
        mask[r, start + r] = True
    return mask.to(device)
