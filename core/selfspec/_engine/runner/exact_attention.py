"""Exact mode's attention: each query's result bitwise what its one-token forward gives.

:func:`exact_attention` (registered with transformers' attention interface for the runner's
exact layer copies, :mod:`.exact`) makes the queries of the heads sharing a key/value head the
rows of its products, each row as in a :data:`~.exact.ROWS`-row product (all rows in one
product where that width is checked, else groups of ``ROWS``), against keys in blocks of
:data:`KEY_BLOCK` slots aligned at slot 0; masked and padding entries contribute exact zeros
(``exp(-inf)``); the softmax denominator and the weighted values are summed block by block in
position order, so blocks a shorter forward does not have add ``+0.0`` and change nothing. The
maximum is order-free. That a row's place in these products does not change its rounding is
checked too (:func:`attention_rows_invariant`); where it does, each query is alone in its
products.

Everything derived from a forward's position mask alone (which slots a query sees, whether the
keys sit in position order, a tree's value gathers) is the same for every layer of that forward:
it is computed once, as a :class:`_Plan`, and reused while the same mask tensor (same object,
same values) comes back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from selfspec._engine.runner.exact import IMPL, ROWS, _checked, _pad

#: Key slots per attention block (blocks aligned at slot 0).
KEY_BLOCK = 64

#: plans of the latest masks: ``(id(mask), rep, alone) -> (mask, a copy of its values, plan)``;
#: a forward has one mask per kind of layer (full, sliding window), so a few entries suffice and
#: a prefill's large mask is not kept long
_plans: dict[tuple, tuple[torch.Tensor, torch.Tensor, _Plan]] = {}
_MAX_PLANS = 4
_registered = False


@dataclass(frozen=True)
class _Gather:
    """A tree's value gathers (:func:`_gathered_values`): each row's product and place in it
    (``group``, ``row``: ``[Q]``), the number of products, and the cache slot each product reads
    at each position from the first gathered block on (``slots``: ``[G, tail * KEY_BLOCK]``,
    ``n`` = a zero row)."""

    group: torch.Tensor
    row: torch.Tensor
    products: int
    slots: torch.Tensor


@dataclass(frozen=True)
class _Plan:
    """What exact attention derives from one forward's position mask (``Q = rep * q`` rows,
    ``W`` = key slots padded to whole key blocks)."""

    #: every visible key sits at the slot of its position (scores need no reordering)
    in_order: bool
    #: ``[1, Q, W]`` bool: the (row, slot) scores that contribute nothing (unseen, padding);
    #: in order only
    hidden: torch.Tensor | None
    #: ``[Q, W]``: the position-order column of each slot's score (``W``: dropped); out of
    #: order only
    cols: torch.Tensor | None
    #: key blocks whose values are read as the cache holds them
    first: int
    #: the gathers of the blocks from ``first`` on
    gather: _Gather | None


def exact_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention with a row-invariant reduction order (see the module doc).

    query ``[1, h, q, d]``; key/value ``[1, h_kv, n, d]`` (cache slots ``0..n-1``, the block's
    own ``q`` keys last); attention_mask ``[1, 1, q, n]`` int64 from :func:`position_mask`:
    the *position* of each key a query sees, ``-1`` where it sees none. Keys are reduced in
    position order, so a tree node's ancestors count in the order a chain of one-token steps
    would have them. The queries of the heads sharing a key/value head are the rows of the
    same products. Returns ``([1, q, h, d], None)`` in the query's dtype; scores, softmax and
    the weighted sum run in float32 (float64 for float64 models).
    """
    if attention_mask is None or attention_mask.dtype != torch.long:
        raise ValueError("exact attention needs the runner's position mask (Runner(exact=True))")
    _, h, q, d = query.shape
    hk, n = key.shape[1], key.shape[2]
    rep = h // hk
    acc = torch.float64 if query.dtype == torch.float64 else torch.float32
    dev = query.device
    rows = rep * q  # the rep * q queries of each key/value head, head by head (row r * q + i)
    blocks = -(-n // KEY_BLOCK)
    width = blocks * KEY_BLOCK
    # a row's place among the ROWS rows of a product: in order, ROWS rows a product, or each
    # alone in the first row where its place in these products would change its rounding
    alone = not attention_rows_invariant(acc, dev, d)
    # every row in one product a key block, where products of that many (padded) rows were
    # checked to give each row as the ROWS-row products do
    padded = -(-rows // ROWS) * ROWS
    wide = not alone and attention_rows_invariant(acc, dev, d, padded)
    plan = _plan(attention_mask, rep, alone)
    qv = query[0].reshape(hk, rows, d).to(acc)  # [hk, Q, d]
    v = value[0].to(acc)  # [hk, n, d]
    # 1. scores in slot order, every (query, key) pair in a [ROWS, d] x [d, KEY_BLOCK] product;
    #    padding slots score against zero keys and are hidden below
    kb = (
        _pad(key[0].to(acc), 1, width).reshape(hk, blocks, KEY_BLOCK, d).transpose(-1, -2)
    )  # [hk, B, d, K]
    if wide:
        s = torch.matmul(_pad(qv, 1, padded)[:, None], kb).transpose(1, 2)[
            :, :rows
        ]  # [hk, Q, B, K]
    else:
        s = _from_rows(
            torch.matmul(_to_rows(qv, alone)[:, :, None], kb[:, None]).transpose(2, 3), rows, alone
        )
    s = s.reshape(hk, rows, width) * scaling
    softcap = kwargs.get("softcap")
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    # 2. the same scores in position order: slot order where the keys are in order, else each
    #    block key goes to its position's column for the queries that see it
    if plan.in_order:
        sp = s.masked_fill(plan.hidden, float("-inf"))  # [hk, Q, W]
    else:
        sp = s.new_full((hk, rows, width + 1), float("-inf"))
        sp.scatter_(2, plan.cols[None].expand(hk, rows, width), s)
        sp = sp[:, :, :width]
    top = sp.amax(-1, keepdim=True).clamp_min(torch.finfo(acc).min)  # order-free; finite
    pb = torch.exp(sp - top).reshape(hk, rows, blocks, KEY_BLOCK)  # unseen: exactly 0
    # 3. values in position order, each (row group, key block) in one [ROWS, KEY_BLOCK] x
    #    [KEY_BLOCK, d] product: the first blocks as the cache holds them, from the first block
    #    holding a draft's node on gathered in position order
    first = plan.first
    parts = []
    if first:
        vb = _pad(v[:, : first * KEY_BLOCK], 1, first * KEY_BLOCK).reshape(hk, first, KEY_BLOCK, d)
        pf = pb[:, :, :first].transpose(1, 2)  # [hk, first, Q, K]
        if wide:
            parts.append(
                torch.matmul(_pad(pf, 2, padded), vb)[:, :, :rows].transpose(1, 2)
            )  # [hk, Q, first, d]
        else:
            pg = _to_rows(pf, alone, dim=2)  # [hk, first, G, R, K]
            parts.append(
                _from_rows(torch.matmul(pg, vb[:, :, None]), rows, alone, dim=2).transpose(1, 2)
            )
    if plan.gather is not None:
        parts.append(_gathered_values(pb[:, :, first:], v, plan.gather))
    part = parts[0] if len(parts) == 1 else torch.cat(parts, 2)  # [hk, Q, B, d]
    sums = pb.sum(-1)  # [hk, Q, B]
    num, den = part[:, :, 0], sums[:, :, 0]
    for b in range(1, blocks):  # in position order: a shorter forward's missing blocks add +0.0
        num = num + part[:, :, b]
        den = den + sums[:, :, b]
    out = (num / den[..., None]).reshape(h, q, d)
    return out.transpose(0, 1)[None].to(query.dtype), None


def attention_rows_invariant(
    dtype: torch.dtype, device: torch.device, d: int, width: int = ROWS
) -> bool:
    """Whether exact attention's batched products (``[w, d] x [d, KEY_BLOCK]`` scores and
    ``[w, KEY_BLOCK] x [KEY_BLOCK, d]`` values) give each row bitwise as the one-token forward
    does, at this dtype, device, head size and thread count: for ``width == ROWS``, as that row
    alone in the first row of the product; wider (a multiple of ``ROWS``), as the
    ``ROWS``-row products of the same rows. Checked once on random rows, as
    :func:`~.exact.row_invariant` checks the linears."""
    key = ("attention", dtype, device, torch.get_num_threads(), ROWS, KEY_BLOCK, d, width)
    ok = _checked.get(key)
    if ok is None:
        g = torch.Generator(device="cpu").manual_seed(d + width)
        ok = True
        for a, b in ((width, d), (d, KEY_BLOCK)), ((width, KEY_BLOCK), (KEY_BLOCK, d)):
            x = torch.randn(3, *a, generator=g).to(dtype).to(device)
            y = torch.randn(3, *b, generator=g).to(dtype).to(device)
            if width == ROWS:
                parts = [
                    torch.matmul(_pad(x[:, i : i + 1], 1, ROWS), y)[:, :1] for i in range(ROWS)
                ]
            else:
                parts = [torch.matmul(x[:, i : i + ROWS], y) for i in range(0, width, ROWS)]
            ok = ok and bool(torch.equal(torch.matmul(x, y), torch.cat(parts, 1)))
        _checked[key] = ok
    return ok


def position_mask(allowed: torch.Tensor | None, kv_pos: torch.Tensor, q: int) -> torch.Tensor:
    """The mask exact attention takes: ``[1, 1, q, n]`` int64, each visible key's position,
    ``-1`` where a query does not see it (``allowed``: ``[q, n]`` bool, ``None`` = all)."""
    n = int(kv_pos.shape[0])
    grid = kv_pos[None].expand(q, n)
    if allowed is not None:
        grid = torch.where(allowed, grid, torch.full_like(grid, -1))
    return grid.reshape(1, 1, q, n).to(torch.long)


def register() -> None:
    """Register :func:`exact_attention` with transformers as :data:`~.exact.IMPL` (once), the
    attention implementation the exact layer copies (:func:`~.exact.exact_copy`) name."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface  # here: only exact mode registers it

        AttentionInterface.register(IMPL, exact_attention)
        _registered = True


# ---------------------------------------------------------------------------- helpers


def _plan(mask: torch.Tensor, rep: int, alone: bool) -> _Plan:
    """The plan of ``mask`` (``[1, 1, q, n]``) for ``rep`` heads a key/value head: remembered
    while the same tensor, with the same values, comes back (the layers of one forward)."""
    key = (id(mask), rep, alone)
    held = _plans.get(key)
    if held is not None and held[0] is mask and torch.equal(held[1], mask):
        return held[2]
    plan = _make_plan(mask, rep, alone)
    if len(_plans) >= _MAX_PLANS:
        _plans.clear()
    _plans[key] = (mask, mask.clone(), plan)
    return plan


def _make_plan(mask: torch.Tensor, rep: int, alone: bool) -> _Plan:
    q, n = mask.shape[-2], mask.shape[-1]
    pos = mask.reshape(q, n)  # [q, n]: key position, -1 = not seen
    dev = pos.device
    start = n - q
    blocks = -(-n // KEY_BLOCK)
    width = blocks * KEY_BLOCK
    slot = torch.arange(n, device=dev)
    in_order = bool(((pos == slot) | (pos < 0)).all())
    if in_order:
        hidden = _pad(pos < 0, 1, width, True).repeat(rep, 1)[None]  # [1, Q, W]
        return _Plan(True, hidden, None, blocks, None)
    cols = _pad(torch.where(pos >= 0, pos, width).clamp_(max=width), 1, width, width).repeat(
        rep, 1
    )  # [Q, W]
    first = start // KEY_BLOCK
    prefix = pos[:, :start]
    if first and not bool(((prefix == slot[:start]) | (prefix < 0)).all()):
        first = 0  # the cache's prefix is not in position order (a draft's nodes): gather it all
    return _Plan(False, None, cols, first, _make_gather(pos, rep, first * KEY_BLOCK, width, alone))


def _make_gather(pos: torch.Tensor, rep: int, lo: int, width: int, alone: bool) -> _Gather:
    """The gathers of positions ``lo..width-1``: a query reads the values of the query that
    *covers* it (sees every position it sees, at the same slot, and the most positions: for a
    tree node, a leaf below it), so the queries of one branch share one gather and one
    product's rows."""
    q, n = pos.shape
    slot_of = torch.full(
        (q, width - lo), n, dtype=torch.long, device=pos.device
    )  # position -> slot
    qi, slots = (pos >= lo).nonzero(as_tuple=True)
    slot_of[qi, pos[qi, slots] - lo] = slots
    seen = slot_of < n
    covers = ((slot_of[:, None] == slot_of[None]) | ~seen[None]).all(-1)  # [j, i]: j covers i
    lead = torch.where(covers, seen.sum(-1)[:, None], -1).argmax(0)  # [q]; at worst itself
    group, row, owner = _place(lead.repeat(rep), alone)
    return _Gather(group, row, int(group.max()) + 1, slot_of[owner])


def _gathered_values(pt: torch.Tensor, v: torch.Tensor, gather: _Gather) -> torch.Tensor:
    """Each row's weighted values over the gathered positions, key block by key block in
    position order: ``pt`` ``[hk, Q, tail, K]`` (weights by position), ``v`` ``[hk, n, d]``
    (by slot). Returns ``[hk, Q, tail, d]``; at positions a query does not see its weight is
    exactly 0."""
    hk, _, tail, _ = pt.shape
    d = v.shape[2]
    pg = pt.new_zeros(hk, gather.products, ROWS, tail, KEY_BLOCK)
    pg[:, gather.group, gather.row] = pt
    vt = torch.cat([v, v.new_zeros(hk, 1, d)], 1)[:, gather.slots]  # [hk, G, tail*K, d]; n -> 0
    own = torch.matmul(
        pg.permute(0, 1, 3, 2, 4), vt.reshape(hk, -1, tail, KEY_BLOCK, d)
    )  # [hk, G, tail, R, d]
    return own[:, gather.group, :, gather.row].permute(1, 0, 2, 3)


def _to_rows(x: torch.Tensor, alone: bool, dim: int = 1) -> torch.Tensor:
    """Rows ``x.shape[dim]`` of ``x`` as products of ``ROWS`` rows: that dim becomes
    ``[G, ROWS]`` (in order, zero rows padding the last product; ``alone``: each row first in
    its own product)."""
    if alone:
        return _pad(x.unsqueeze(dim + 1), dim + 1, ROWS)
    m = x.shape[dim]
    return _pad(x, dim, -(-m // ROWS) * ROWS).unflatten(dim, (-1, ROWS))


def _from_rows(y: torch.Tensor, m: int, alone: bool, dim: int = 1) -> torch.Tensor:
    """The ``m`` rows :func:`_to_rows` placed, back from products ``[..., G, ROWS, ...]``
    (group at ``dim``, row next): ``[..., m, ...]``."""
    if alone:
        return y.select(dim + 1, 0)
    return y.flatten(dim, dim + 1).narrow(dim, 0, m)


def _place(keys: torch.Tensor, alone: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of ``ROWS``-row products for ``m`` items: items with equal ``keys`` ``[m]``
    share products, in order, ``ROWS`` a product; ``alone``: each item first in a product
    of its own. Returns each item's product and row ``[m]`` and each product's key ``[G]``."""
    m, dev = keys.shape[0], keys.device
    if alone:
        return torch.arange(m, device=dev), torch.zeros(m, dtype=torch.long, device=dev), keys
    order = torch.argsort(keys, stable=True)
    uniq, counts = torch.unique_consecutive(keys[order], return_counts=True)
    within = torch.arange(m, device=dev) - (torch.cumsum(counts, 0) - counts).repeat_interleave(
        counts
    )
    products = -(-counts // ROWS)
    group, row = torch.empty_like(keys), torch.empty_like(keys)
    group[order] = (torch.cumsum(products, 0) - products).repeat_interleave(counts) + within // ROWS
    row[order] = within % ROWS
    return group, row, uniq.repeat_interleave(products)
