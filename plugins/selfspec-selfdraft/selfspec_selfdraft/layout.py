"""The joint block of one Self-Draft step: ``[pending, candidate trie..., branch tokens...]``.

Slot 0 is the pending token (position ``p`` = ``state.length - 1``). Slots ``1..k`` hold the
candidate trie (candidates sharing a prefix share nodes; a node at depth ``d`` has position
``p + d`` and sees the pending token, its ancestors and itself, never another candidate).
Then each draft branch ``i`` of ``l_i`` tokens: its token ``j`` has position ``p + 1 + j`` and
sees the pending token and the branch's own tokens ``0..j`` (block-diagonal causal, paper
Fig. 3b), never the candidates or another branch. Everything sees the cached prefix (the
runner adds it; sliding windows follow the positions).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def trie(candidates: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """Merge candidate chains into a trie: ``(tokens, parents)``, ``parents[i] < i``, ``-1`` =
    the pending token. Node order is insertion order, so the first candidate's nodes come first."""
    tokens: list[int] = []
    parents: list[int] = []
    children: dict[tuple[int, int], int] = {}  # (parent, token) -> node
    for cand in candidates:
        cur = -1
        for t in cand:
            t = int(t)
            node = children.get((cur, t))
            if node is None:
                node = len(tokens)
                tokens.append(t)
                parents.append(cur)
                children[(cur, t)] = node
            cur = node
    return tokens, parents


@dataclass(frozen=True)
class Block:
    """One step's forward input. ``ids``/``positions``: ``[q]``; ``mask``: ``[q, q]`` bool;
    ``rows``: ``[n]`` rows whose logits are needed (the trie's, then the branches' rows in
    ``branch_rows``); ``branch_start[i]``: slot of branch i's first token."""

    ids: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    rows: torch.Tensor
    n_tree: int  # 1 + number of trie nodes
    branch_start: tuple[int, ...]
    branch_rows: tuple[tuple[int, ...], ...]  # per branch, the branch-local indices j with logits


def build(
    pending: int,
    position: int,
    tokens: Sequence[int],
    parents: Sequence[int],
    branches: Sequence[Sequence[int]],
    first_row: int = 0,
    device: torch.device | str = "cpu",
) -> Block:
    """Lay out one step. ``first_row``: per branch, logits are taken for branch-local indices
    ``>= min(first_row, l_i - 1)`` (the last token's is always needed: it extends the branch)."""
    k = len(tokens)
    lens = [len(b) for b in branches]
    q = 1 + k + sum(lens)
    ids = [pending, *tokens]
    pos = [position]
    depth = [0]
    for p in parents:
        depth.append(depth[p + 1] + 1)
    pos.extend(position + d for d in depth[1:])
    mask = torch.zeros(q, q, dtype=torch.bool)
    mask[:, 0] = True  # everything sees the pending token
    mask[0, 0] = True
    for i, p in enumerate(parents):  # a node sees its parent's ancestors and itself
        mask[i + 1, : k + 1] = mask[p + 1, : k + 1]
        mask[i + 1, i + 1] = True
    rows = list(range(k + 1))
    starts: list[int] = []
    brows: list[tuple[int, ...]] = []
    s = k + 1
    for b in branches:
        n = len(b)
        ids.extend(int(t) for t in b)
        pos.extend(position + 1 + j for j in range(n))
        mask[s : s + n, s : s + n] = torch.ones(n, n, dtype=torch.bool).tril_()
        lo = min(first_row, n - 1) if n else 0
        local = tuple(range(lo, n))
        rows.extend(s + j for j in local)
        starts.append(s)
        brows.append(local)
        s += n
    return Block(
        ids=torch.tensor(ids, dtype=torch.long, device=device),
        positions=torch.tensor(pos, dtype=torch.long, device=device),
        mask=mask.to(device),
        rows=torch.tensor(rows, dtype=torch.long, device=device),
        n_tree=k + 1,
        branch_start=tuple(starts),
        branch_rows=tuple(brows),
    )


def tree_path(parents: Sequence[int], tokens: Sequence[int], pred: Sequence[int]) -> list[int]:
    """Longest path of trie nodes whose tokens equal the model's predictions.

    ``pred[n+1]`` is the model's token after node n (``pred[0]`` after the pending token). A
    trie has at most one child per token, so the path is unique.
    """
    children: dict[tuple[int, int], int] = {}
    for i, (p, t) in enumerate(zip(parents, tokens)):
        children.setdefault((p, t), i)
    path: list[int] = []
    cur = -1
    while True:
        nxt = children.get((cur, pred[cur + 1]))
        if nxt is None:
            return path
        path.append(nxt)
        cur = nxt
