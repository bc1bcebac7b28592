"""The cost arithmetic of draft trees: which size, frontier width and guess length pay.

Pure functions of probabilities and cost curves (``cost(w)``: a block of ``w`` tokens in
one-token forwards, a :class:`selfspec.provisional.CostCurve`); :func:`selfspec.draft_tree`
calls them while it grows a tree, and a composition's cut uses :func:`choose_size`. Each
maximises expected committed tokens per unit of cost, or the net saving of a guess.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence


def choose_size(
    probs: Sequence[float],
    cost: Callable[[int], float],
    draft_cost: float,
    limit: int | None = None,
) -> tuple[int, float, float]:
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


def guess_length(probs: Sequence[float], q: int, pass_cost: Callable[[int], float] | None) -> int:
    """How many tokens of a guessed chain to run beside ``q`` frontier rows, ``probs[j]`` the
    probability that its first ``j + 1`` tokens are all right: all without a cost; else the
    ``k`` that maximises ``sum(probs[:k]) * pass_cost(q) - (pass_cost(q + k) - pass_cost(q))``
    (a right token saves a pass; ties go to the shorter chain)."""
    m = len(probs)
    if pass_cost is None or m <= 0:
        return m
    base = pass_cost(q)
    best_k, best, saved = 0, 0.0, 0.0
    for k in range(1, m + 1):
        saved += float(probs[k - 1]) * base
        value = saved - (pass_cost(q + k) - base)
        if value > best + 1e-12:
            best_k, best = k, value
    return best_k


def frontier_width(
    probs: list[float],
    cost: Callable[[int], float],
    pass_cost: Callable[[int], float],
    n: int,
    e: float,
    c: float,
) -> int:
    """How many of the frontier's best nodes (``probs``, high to low) to expand, given the best
    tree so far (``n`` nodes, ``e`` expected tokens, cost ``c``): the ``q`` whose optimistic
    ratio is highest, if it beats ``e / c``, else 0. Optimistic: the ``q`` nodes' children can
    add at most the nodes' probability mass, for the pass and at least ``q`` more verified
    nodes: ``(e + sum(probs[:q])) / (c + pass_cost(q) + cost(n + 1 + q) - cost(n + 1))``."""
    best_q, best = 0, e / c
    gain = 0.0
    for q, p in enumerate(probs, 1):
        gain += p
        r = (e + gain) / (c + pass_cost(q) + cost(n + 1 + q) - cost(n + 1))
        if r > best:
            best_q, best = q, r
    return best_q


def best_size(
    logp: list[float], cost: Callable[[int], float] | None, d_cost: float, cap: int
) -> tuple[int, float, float]:
    """``(n, expected, cost)`` of the best tree from the candidates so far."""
    probs = sorted((math.exp(x) for x in logp), reverse=True)
    if cost is None:
        n = min(cap, len(probs))
        return n, 1.0 + sum(probs[:n]), float("nan")
    return choose_size(probs, cost, d_cost, cap)


def check_budget(value: str) -> str | None:
    """Why ``value`` is not a draft budget (``auto`` or a positive number of nodes), or None;
    the check of ``tree_budget`` and of a composition's ``budget``."""
    spec = str(value).strip().lower()
    if spec == "auto" or (spec.isdigit() and int(spec) >= 1):
        return None
    return "must be 'auto' or a positive number of nodes"
