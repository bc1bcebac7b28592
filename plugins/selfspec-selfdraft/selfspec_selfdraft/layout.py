"""The layout of one Self-Draft step: a candidate trie verified with draft branches riding along.

The verifying forward (the host's :func:`selfspec.verify_tree`) runs ``[pending, trie...,
branch tokens...]``. The candidate trie is the draft (candidates sharing a prefix share nodes;
the host gives a node at depth ``d`` position ``p + d`` and the ancestor mask). The branches are
the :class:`selfspec.ExtraBlock` built here: branch ``i`` of ``l_i`` tokens, its token ``j`` at
position ``p + 1 + j``, sees the pending token and the branch's own tokens ``0..j``
(block-diagonal causal, paper Fig. 3b), never a candidate or another branch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from selfspec import ExtraBlock


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
class Branches:
    """``extra``: the branches' tokens for the verifying forward; ``branch_rows[i]``: the
    branch-local indices of branch ``i`` whose predictions ``extra.rows`` asks for, in order."""

    extra: ExtraBlock
    branch_rows: tuple[tuple[int, ...], ...]


def branches(
    branch_tokens: Sequence[Sequence[int]],
    position: int,
    first_row: int = 0,
    device: torch.device | str = "cpu",
) -> Branches:
    """Lay out the draft branches after the pending token at ``position``. ``first_row``: per
    branch, predictions are asked for branch-local indices ``>= min(first_row, l_i - 1)`` (the
    last token's is always needed: it extends the branch)."""
    ids: list[int] = []
    pos: list[int] = []
    rows: list[int] = []
    brows: list[tuple[int, ...]] = []
    e = sum(len(b) for b in branch_tokens)
    mask = torch.zeros(e, e, dtype=torch.bool)
    s = 0
    for b in branch_tokens:
        n = len(b)
        ids.extend(int(t) for t in b)
        pos.extend(position + 1 + j for j in range(n))
        mask[s : s + n, s : s + n] = torch.ones(n, n, dtype=torch.bool).tril_()
        lo = min(first_row, n - 1) if n else 0
        local = tuple(range(lo, n))
        rows.extend(s + j for j in local)
        brows.append(local)
        s += n
    extra = ExtraBlock(
        ids=torch.tensor(ids, dtype=torch.long, device=device),
        positions=torch.tensor(pos, dtype=torch.long, device=device),
        mask=mask.to(device),
        rows=torch.tensor(rows, dtype=torch.long, device=device),
    )
    return Branches(extra, tuple(brows))
