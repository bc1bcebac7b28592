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

With a cost curve, the frontier's width and the depth are chosen by cost too: a pass over the ``q``
best frontier nodes costs ``draft_cost * cost(q)`` (or the measured draft curve's), verifying ``q``
more nodes costs the curve's growth, and it can add at most their probability mass in expected
tokens; the pass runs with the ``q`` that maximises the optimistic ratio
``(expected + mass) / (cost + pass cost + verify growth)``, and drafting stops when no ``q`` beats
the best tree's expected tokens per unit of cost so far (a confident draft grows a chain, an unsure
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

from selfspec._engine.contract.treecost import best_size, frontier_width, guess_length
from selfspec._engine.contract.treecost import (
    choose_size as choose_size,  # re-exported: the size rule
)
from selfspec._engine.contract.types import Draft
from selfspec._engine.runner import KVCache, Runner

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
    forwards (``nan`` without a curve); ``widths``: each pass's width; ``local``: each node's
    own raw draft probability; ``guessed``/``agreed``: guessed tokens judged and those the
    draft itself ranked first (each guess up to its first disagreement: the evidence for
    ``guess_rate``). ``probs`` are calibrated when :func:`draft_tree` was given ``calibrate``;
    :meth:`draft` makes the ``Draft`` (with ``probs``).
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
    guessed: int = 0
    agreed: int = 0

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
    prefix_probs: Sequence[float] | None = None,
    guess: Callable[[list[int]], Sequence[int]] | None = None,
    guess_rate: float = 1.0,
    draft_curve: Callable[[int], float] | None = None,
) -> DraftTree:
    """Grow a draft tree after ``pending`` (``[1]`` int64, at cache slot ``slot``) with ``step``.

    A dynamic draft tree from any drafter (EAGLE-2 / SWIFT style), to verify with
    :func:`verify_tree` (the host's verifier does it for a tree ``Draft``).
    ``step(ids [q], start, positions [q], mask) -> logits [q, V']`` is one draft pass over a
    block written at cache slots ``[start, start+q)`` (``mask``: ``None`` or ``[q, start+q]``
    bool, for ``Runner.forward``'s ``block_mask``); :func:`skip_layer_step` makes one from a
    skip set, and any other drafter (an early exit, a compressed copy) is a few lines. The
    pending token's pass gives the root's ``topk`` children; then, depth by depth up to
    ``max_depth``, the ``topk`` newest candidates with the highest cumulative draft
    probability run one pass together (each sees the prefix, the pending token and its own
    ancestors' draft slots; position = the pending token's + depth; the ``j``-th expanded node
    writes slot ``slot + 1 + j``) and add their ``topk`` children. The tree is the ``n`` most
    probable candidates (closed under ancestors), ``n = budget``, or, with ``budget=None``, the
    ``n`` that maximises ``(1 + sum of their probabilities) / (draft cost + cost(n + 1))``
    (:func:`selfspec.provisional.choose_size`). With a ``cost``, each pass expands the
    ``q <= topk`` best frontier nodes whose optimistic ratio ``(expected + their probability
    mass) / (cost + draft_cost * cost(q) + the verify cost of q more nodes)`` is highest, and
    drafting stops when no ``q`` beats the best tree's expected tokens per unit of cost (a
    confident draft grows a chain, an unsure one a wider tree where wide passes are cheap).

    max_depth: deepest node (the host's ``state.max_draft_depth`` bounds it). topk: children
    kept per expanded node, and nodes expanded per depth. budget: most nodes in the tree;
    ``None`` = chosen by ``cost`` (then required). cost: verify cost of a block of ``w`` tokens
    in one-token forwards (a :class:`selfspec.provisional.CostCurve`); ``None`` = no early stop, the
    tree is the ``budget`` best nodes. draft_cost: a draft pass's cost relative to a full forward of
    the same width. room: free cache slots after ``slot`` (the expanded nodes' draft slots, and
    the tree's size, stay within it). vocab: ``[V']`` token ids of ``step``'s logit columns
    when it scores a vocabulary subset (``None``: column = token id). calibrate: maps a node's
    own draft probability to the probability that it is accepted when its parent is (a
    :class:`TreeCalibration`); every score above uses the calibrated values.
    prefix: a chain of tokens to draft after (another drafter's guess, e.g. a composition's
    earlier members, :attr:`selfspec.DecodeState.prior`): the first pass runs the pending token
    and the prefix together (causal), so each prefix token becomes a node scored by the draft's
    own probability of it, beside its ``topk`` alternatives, and the tree grows from all of
    them (the frontier is every candidate of that pass but the prefix nodes, each expanded node
    at its own depth's position); a prefix token past ``max_depth`` or the room is dropped.
    prefix_probs: the probability
    that each prefix token is accepted with those before it (a composition's node values); with
    a cost curve the prefix is then cut where its next token no longer pays for its row, as a
    guess is (below).
    guess: ``guess(path) -> tokens``, a cheap guess of what follows a node (``path``: its tokens
    from the root, ``[]`` for the pending token), e.g. :meth:`selfspec.NgramIndex.lookup` over
    the context: every pass after the first runs the guess after its most probable frontier
    node as rows of the same pass (causal after that node, at the positions after it, seeing
    what it sees and none of the other frontier nodes), each guessed token a node scored by the
    draft's own probability of it and expanded with its own row, like a prefix token, so a
    right guess advances the tree several depths in one pass and a wrong one adds a few
    low-probability nodes; the first pass runs the pending token's guess when there is no
    prefix; a guessed token past ``max_depth`` or the room is dropped. guess_rate: the
    probability that a guessed token is the draft's own choice when the ones before it were
    (learned by the caller, e.g. :class:`TreeConfig`); with a cost curve, a guess runs the
    ``m`` tokens that maximise ``sum(guess_rate**j for j <= m) * pass(q) - (pass(q + m) -
    pass(q))`` (each right token saves a pass of the ``q`` frontier rows), all of it without a
    curve.
    draft_curve: a draft pass's cost at width ``w`` relative to width 1 (a
    :class:`selfspec.provisional.CostCurve` measured on the draft weights: a compressed
    copy's kernels grow with the width unlike the full model's); ``None``: ``cost``. A pass of
    width ``w`` costs ``draft_cost * draft_curve(w)``.

    Cache: the first pass writes slots ``[slot, slot + len(prefix)]``; each later pass writes
    the next free slots (its frontier nodes, then its guess), past the committed prefix, so
    verification overwrites them.
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
    depth: list[int] = []
    slot_of: dict[int, int] = {}  # expanded node -> its draft slot
    widths: list[int] = []
    d_cost = 0.0
    empty = DraftTree(
        torch.empty(0, dtype=torch.long, device=dev),
        torch.empty(0, dtype=torch.long, device=dev),
        torch.empty(0, dtype=torch.float32, device=dev),
    )
    if max_depth <= 0 or cap <= 0:
        return empty
    max_depth = min(max_depth, cap)  # a tree of cap nodes is never deeper
    curve = draft_curve if draft_curve is not None else cost

    def pass_cost(w: int) -> float:
        return draft_cost * (curve(w) if curve is not None else 1.0)

    def children(top: tuple[list[float], list[int]], parent: int) -> None:
        first = len(tokens)
        if (
            depth[parent] if parent >= 0 else 0
        ) < max_depth:  # children within the deepest depth allowed
            _add_children(
                top,
                parent,
                logp[parent] if parent >= 0 else 0.0,
                calibrate,
                tokens,
                parents,
                logp,
                local,
            )
        depth.extend([(depth[parent] if parent >= 0 else 0) + 1] * (len(tokens) - first))

    guessed = [
        0,
        0,
    ]  # guessed tokens judged, and those the draft ranked first (each guess's leading run)

    def walk(
        chain: list[int],
        rows: list[torch.Tensor],
        tops: list[tuple[list[float], list[int]]],
        lead: int,
        lead_first: int,
        start: int,
        judge: bool,
    ) -> set[int]:
        """Each ``chain`` token a node after ``lead`` (whose children start at ``lead_first``),
        scored by the row before it, slotted from ``start``, expanded with its own row; ``judge``:
        count how far the draft agrees with it (a guess)."""
        parent, first, on = lead, lead_first, set()
        for j, tok in enumerate(chain):
            if judge:
                guessed[0] += 1
                if tops[j][1][:1] != [tok]:
                    judge = False
                else:
                    guessed[1] += 1
            node = next(
                (i for i in range(first, len(tokens)) if parents[i] == parent and tokens[i] == tok),
                None,
            )
            if (
                node is None
            ):  # the draft does not rank the guessed token in its top k: score it alone
                node = _add_token(
                    rows[j],
                    tok,
                    parent,
                    logp[parent] if parent >= 0 else 0.0,
                    vocab,
                    calibrate,
                    tokens,
                    parents,
                    logp,
                    local,
                )
                depth.append((depth[parent] if parent >= 0 else 0) + 1)
            slot_of[node] = start + j
            on.add(node)
            first = len(tokens)
            children(tops[j + 1], node)
            parent = node
        return on

    # a) the pending token's pass (with the prefix, or its guess, after it): the root's children,
    #    and each chain token's node with its alternatives and children
    costed = pass_cost if cost is not None else None
    chain = [int(t) for t in prefix][: min(max_depth, room)]
    if chain and prefix_probs is not None:
        chain = chain[: guess_length(list(prefix_probs)[: len(chain)], 1, costed)]
    elif not prefix and guess is not None:
        chain = [int(t) for t in guess([])][: min(max_depth, room)]
        chain = chain[: guess_length(_powers(guess_rate, len(chain)), 1, costed)]
    ids = (
        pending
        if not chain
        else torch.cat([pending, torch.tensor(chain, dtype=torch.long, device=dev)])
    )
    w = len(chain) + 1
    logits = step(
        ids, slot, torch.arange(slot, slot + w, device=dev), None
    )  # logits: [w, V'], causal
    widths.append(w)
    d_cost += pass_cost(w)
    rows, tops = _rows(logits, topk, vocab)
    children(tops[0], -1)
    expanded = walk(chain, rows, tops, -1, 0, slot + 1, judge=not prefix)  # a prefix is not a guess
    frontier = [i for i in range(len(tokens)) if i not in expanded]
    next_slot = slot + w
    best_n, best_e, best_c = best_size(logp, cost, d_cost, cap)

    # b) one pass per depth over the frontier (and the guess after its best node), each row
    #    seeing only its ancestors' slots
    for _ in range(1, max_depth):
        frontier = [i for i in frontier if depth[i] < max_depth]
        frontier = sorted(frontier, key=lambda i: (-logp[i], i))[
            : min(topk, room - (next_slot - slot - 1))
        ]
        if cost is not None:  # as wide as pays for itself; stop when no width does
            frontier = frontier[
                : frontier_width(
                    [math.exp(logp[i]) for i in frontier], cost, pass_cost, best_n, best_e, best_c
                )
            ]
        if not frontier:
            break
        q = len(frontier)
        lead = frontier[0]
        chain = []
        if guess is not None:
            chain = [int(t) for t in guess(_path(lead, tokens, parents))]
            chain = chain[: max(0, min(max_depth - depth[lead], room - (next_slot - slot - 1) - q))]
            chain = chain[: guess_length(_powers(guess_rate, len(chain)), q, costed)]
        start = next_slot
        for r, i in enumerate(frontier):
            slot_of[i] = start + r
        mask = _frontier_mask(
            frontier, parents, slot_of, slot, start, len(chain), dev
        )  # [q+m, start+q+m]
        ids = torch.tensor([tokens[i] for i in frontier] + chain, dtype=torch.long, device=dev)
        positions = torch.tensor(
            [slot + depth[i] for i in frontier]
            + [slot + depth[lead] + j for j in range(1, len(chain) + 1)],
            dtype=torch.long,
            device=dev,
        )
        logits = step(ids, start, positions, mask)  # logits: [q+m, V']
        widths.append(q + len(chain))
        d_cost += pass_cost(q + len(chain))
        next_slot = start + q + len(chain)
        first_new = len(tokens)
        rows, tops = _rows(logits, topk, vocab)
        for r, i in enumerate(frontier):
            children(tops[r], i)
        expanded = walk(
            chain,
            rows[:1] + rows[q:],
            tops[:1] + tops[q:],
            lead,
            first_new,
            start + q,  # lead's first
            judge=True,
        )
        frontier = [i for i in range(first_new, len(tokens)) if i not in expanded]
        best_n, best_e, best_c = best_size(logp, cost, d_cost, cap)

    # c) the tree: the best_n candidates by cumulative probability, in creation order
    chosen = sorted(sorted(range(len(tokens)), key=lambda i: (-logp[i], i))[:best_n])
    remap = {old: new for new, old in enumerate(chosen)}
    remap[-1] = -1
    return DraftTree(
        tokens=torch.tensor([tokens[i] for i in chosen], dtype=torch.long, device=dev),
        parents=torch.tensor([remap[parents[i]] for i in chosen], dtype=torch.long, device=dev),
        probs=torch.tensor([logp[i] for i in chosen], dtype=torch.float64)
        .exp()
        .to(torch.float32)
        .to(dev),
        passes=len(widths),
        ran=sum(widths),
        candidates=len(tokens),
        expected=best_e,
        cost=best_c if cost is not None else float("nan"),
        widths=tuple(widths),
        local=tuple(local[i] for i in chosen),
        guessed=guessed[0],
        agreed=guessed[1],
    )


def skip_layer_step(
    runner: Runner,
    cache: KVCache,
    *,
    skip_attn: Collection[int] = (),
    skip_mlp: Collection[int] = (),
    weights: Any = None,
) -> DraftStep:
    """A draft pass of the model with the given attention/MLP blocks skipped (the drafter of
    ``skip_layer_draft``, for :func:`draft_tree`): a forward at ``start`` with ``positions``
    and the block mask, the LM head on every row; ``weights``: the model's draft weights
    (:func:`selfspec.draft_weights`), as for ``skip_layer_draft``."""

    def step(
        ids: torch.Tensor, start: int, positions: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        return runner.forward(
            ids,
            cache=cache,
            start=start,
            positions=positions,
            block_mask=mask,
            skip_attn=skip_attn,
            skip_mlp=skip_mlp,
            weights=weights,
        ).logits

    return step


# ------------------------------------------------------------------------------ helpers
def _rows(
    logits: torch.Tensor, topk: int, vocab: torch.Tensor | None
) -> tuple[list[torch.Tensor], list[tuple[list[float], list[int]]]]:
    """A pass's draft log-probabilities, one ``[V']`` row per token (in at least float32) and each
    row's ``topk`` most probable ``(log-probabilities, token ids)``, high to low: one softmax and
    one top-k over the whole pass."""
    lp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
    vals, idx = torch.topk(lp, min(topk, int(lp.shape[-1])), dim=-1)
    ids = idx if vocab is None else vocab[idx]
    return list(lp), list(zip(vals.tolist(), ids.tolist()))


def _add_children(
    top: tuple[list[float], list[int]],
    parent: int,
    parent_logp: float,
    calibrate: Callable[[float], float] | None,
    tokens: list[int],
    parents: list[int],
    logp: list[float],
    local: list[float],
) -> None:
    """Append ``parent``'s most probable children (``top``: their log-probabilities and token
    ids, from :func:`_rows`) as candidates; a child's cumulative log-probability never exceeds
    its parent's (so the most probable candidates always form a tree)."""
    for v, t in zip(*top):
        v = min(float(v), 0.0)
        p = math.exp(v)
        own = (
            v if calibrate is None else math.log(min(max(float(calibrate(p)), 1e-12), 1.0))
        )  # log-probability
        tokens.append(int(t))
        parents.append(parent)
        logp.append(parent_logp + own)
        local.append(p)


def _add_token(
    lp: torch.Tensor,
    token: int,
    parent: int,
    parent_logp: float,
    vocab: torch.Tensor | None,
    calibrate: Callable[[float], float] | None,
    tokens: list[int],
    parents: list[int],
    logp: list[float],
    local: list[float],
) -> int:
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


def _powers(rate: float, m: int) -> list[float]:
    """``[rate, rate**2, ..., rate**m]``: the probability that a guess's first ``j`` tokens are all
    right, for :func:`~selfspec._engine.contract.treecost.guess_length`."""
    return [rate**j for j in range(1, m + 1)]


def _path(node: int, tokens: list[int], parents: list[int]) -> list[int]:
    """The tokens from the root to ``node``, ``node``'s own last."""
    out: list[int] = []
    while node >= 0:
        out.append(tokens[node])
        node = parents[node]
    return out[::-1]


def _frontier_mask(
    frontier: list[int],
    parents: list[int],
    slot_of: dict[int, int],
    slot: int,
    start: int,
    chain: int,
    device: torch.device,
) -> torch.Tensor:
    """``[q+m, start+q+m]`` bool: every frontier node sees slots ``[0, slot]`` (the prefix and
    the pending token), the draft slots of its own ancestors, and itself; the ``m = chain``
    guessed tokens after the first frontier node (rows ``q..q+m-1``) see what it sees, and
    each other up to themselves (causal)."""
    q = len(frontier)
    mask = torch.zeros(q + chain, start + q + chain, dtype=torch.bool)
    mask[:, : slot + 1] = True
    for r, i in enumerate(frontier):
        p = parents[i]
        while p >= 0:
            mask[r, slot_of[p]] = True
            p = parents[p]
        mask[r, start + r] = True
    if chain:
        mask[q:, : start + 1] = mask[0, : start + 1]
        mask[q:, start + q :] = torch.ones(chain, chain, dtype=torch.bool).tril()
    return mask.to(device)
