"""Attention masks for a block of new tokens over a cached prefix.

Every mask here answers one question per (query, key) pair: may the new token at row ``r``
attend to the key in column ``c``? Columns are the cached slots ``[0, start)`` followed by the
block's own tokens. The prefix is visible to every new token; within the block, visibility
is the ``block`` mask (causal for a chain, ancestors for a tree, or any mask a caller builds),
which may also cover the cached slots (``[q, start+q]``); a sliding-window layer also hides keys
whose *position* is ``window`` or more behind the query's position (``kv_pos > q_pos - window``, as
Hugging Face's ``sliding_window_overlay``).
"""

from __future__ import annotations

import torch


def causal(q: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[q, q]`` bool, True on and below the diagonal."""
    return torch.ones(q, q, dtype=torch.bool, device=device).tril_()


def tree(parents: torch.Tensor, with_root: bool = True) -> torch.Tensor:
    """Ancestor mask of a tree draft.

    ``parents``: ``[k]`` int64, ``parents[i] < i``, ``-1`` = the root (the pending token).
    Returns ``[k+1, k+1]`` bool for the block ``[root, node_0 .. node_{k-1}]`` when
    ``with_root`` (each node sees the root, its ancestors and itself), else ``[k, k]``.
    """
    k = int(parents.shape[0])
    m = torch.zeros(k + 1, k + 1, dtype=torch.bool)
    m[0, 0] = True
    for i, p in enumerate(parents.tolist()):
        m[i + 1] = m[p + 1]
        m[i + 1, i + 1] = True
    m = m.to(parents.device)
    return m if with_root else m[1:, 1:]


def tree_positions(parents: torch.Tensor, root_position: int) -> torch.Tensor:
    """``[k+1]`` position ids of ``[root, nodes...]``: the root's position plus each
    node's depth."""
    depth = [0]
    for p in parents.tolist():
        depth.append(depth[p + 1] + 1)
    return torch.tensor(depth, dtype=torch.long, device=parents.device) + root_position


def build(
    prefix_pos: torch.Tensor,
    positions: torch.Tensor,
    block: torch.Tensor | None,
    window: int | None,
) -> torch.Tensor | None:
    """``[q, start+q]`` bool mask, or ``None`` when every key is visible.

    ``prefix_pos``: ``[start]`` positions of the cached slots; ``positions``: ``[q]`` of the
    block; ``block``: ``[q, q]`` bool (``None`` = causal), or ``[q, start+q]`` bool, which of
    the cached slots *and* the block's tokens each block token sees (a tree drafted depth by
    depth: a node sees only its ancestors' slots).
    """
    q = int(positions.shape[0])
    start = int(prefix_pos.shape[0])
    full = block is not None and start > 0 and int(block.shape[1]) == start + q
    if block is not None and int(block.shape[1]) not in (q, start + q):
        raise ValueError(
            f"block mask {tuple(block.shape)} fits neither [{q}, {q}] nor [{q}, {start + q}]"
        )
    if (
        q == 1
        and not full
        and (window is None or start == 0 or int(positions[0]) - int(prefix_pos.min()) < window)
    ):
        return None  # a single query sees everything: let the kernel run unmasked
    if block is None:
        block = causal(q, positions.device)
    if full:
        allowed = block.to(torch.bool).clone()
    else:
        allowed = torch.cat(
            [torch.ones(q, start, dtype=torch.bool, device=positions.device), block], 1
        )
    if window is not None:
        kv_pos = torch.cat([prefix_pos, positions])
        allowed &= kv_pos[None, :] > positions[:, None] - window
    return allowed


def for_attention(mask: torch.Tensor | None, impl: str, dtype: torch.dtype) -> torch.Tensor | None:
    """Shape ``[q, kv]`` bool into what the attention implementation takes: ``[1, 1, q, kv]``,
    bool for SDPA, additive float for eager."""
    if mask is None:
        return None
    mask = mask[None, None]
    if impl == "eager":
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
            ~mask, torch.finfo(dtype).min
        )
    return mask
