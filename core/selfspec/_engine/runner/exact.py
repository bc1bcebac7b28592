"""Exact mode: a forward whose every row is bitwise what that row's one-token forward gives.

A verification pass over ``k + 1`` positions rounds differently from ``k + 1`` one-token
steps when a product or a reduction sums in another order for a block than for one row: a
GEMM picks its kernel and blocking from the number of rows (MKL runs one row as a
matrix-vector product), and attention reduces over however many keys the block sees. Exact
mode makes a row's result independent of how many rows are computed with it, with torch
operations only:

* **Products** (every linear of the layers and the LM head, in the runner's weight layout)
  compute each row as a product of exactly :data:`ROWS` rows computes it: a block is padded
  with zero rows to a multiple of :data:`ROWS`, so a row meets the same kernel, blocking and
  summation order alone as inside any block. A padded block of ``w`` rows (up to
  :data:`FUSED_ROWS`) runs as one product, reading the weights once, only where that
  product's rows were found bitwise equal to :data:`ROWS`-row products of the same rows on
  this module's shape, dtype, device and thread count (:func:`row_invariant`: checked once
  per width on random rows; a kernel's summation order follows from its shapes, not the
  values). Elsewhere each group of :data:`ROWS` rows is its own product. That a row's result
  does not depend on its place among the :data:`ROWS` rows is checked the same way; where it
  does, every row is computed alone, first in its own :data:`ROWS`-row product (slow, exact).
* **Attention** (:func:`exact_attention`, registered with transformers' attention interface
  as :data:`IMPL`) makes the queries of the heads sharing a key/value head the rows of its
  products, each row as in a :data:`ROWS`-row product (all rows in one product where that
  width is checked, else groups of :data:`ROWS`), against keys in blocks of
  :data:`KEY_BLOCK` slots aligned at slot 0; masked and padding entries contribute
  exact zeros (``exp(-inf)``); the softmax denominator and the weighted values are summed
  block by block in slot order, so blocks a shorter forward does not have add ``+0.0`` and
  change nothing. The maximum is order-free. That a row's place in these products does not
  change its rounding is checked too (:func:`attention_rows_invariant`); where it does, each
  query is alone in its products.
* **Norms, rotary embeddings, activations, residuals** work row by row and are already
  invariant (tested).

It costs some speed (a one-token step computes :data:`ROWS` rows of every product, a block
whose fused product is not row-invariant reads the weights once per group; attention loops
over key blocks in Python) and is its own reference: ``vanilla`` in exact mode, not HF
``generate`` (whose one-row products round differently; docs/losslessness.md).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

#: Rows of the product that defines every row's result, and of every query group, in exact mode.
ROWS = 4
#: The widest block of rows run as one product (a multiple of :data:`ROWS`); wider blocks run
#: in chunks of it, so at most ``FUSED_ROWS // ROWS`` widths are ever checked per shape.
FUSED_ROWS = 64
#: Key slots per attention block (blocks aligned at slot 0).
KEY_BLOCK = 64
#: The attention implementation name exact layer copies run under.
IMPL = "selfspec_exact"

_registered = False
#: the checks' verdicts, by what decides a kernel's summation order (product type and shape, dtype,
#: device, threads, ROWS, width; attention's dtype, device, threads, ROWS, KEY_BLOCK, head size)
_checked: dict[tuple, bool] = {}


class RowInvariantLinear(nn.Module):
    """A product module (``nn.Linear``, a packed or compressed linear) whose every row comes
    out as in a one-token forward, alone in a :data:`ROWS`-row product: ``[..., in]`` ->
    ``[..., out]``."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.in_features = inner.in_features
        self.out_features = inner.out_features
        self._verdicts: dict[tuple, bool] = {}

    @property
    def weight(self) -> torch.Tensor:
        return self.inner.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return getattr(self.inner, "bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        rows = x.reshape(-1, x.shape[-1])  # [n, in]
        n = rows.shape[0]
        padded = -(-n // ROWS) * ROWS
        if padded != n:
            rows = _pad(rows, 0, padded)
        if padded <= FUSED_ROWS:
            out = self._product(rows)  # [padded, out]
        else:
            out = torch.cat([self._product(rows[i : i + FUSED_ROWS]) for i in range(0, padded, FUSED_ROWS)])
        return out[:n].reshape(*lead, out.shape[-1])

    def _product(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` ``[w, in]`` (``w`` a multiple of :data:`ROWS`, at most :data:`FUSED_ROWS`)
        through the product, each row as a one-token forward computes it: alone in the first
        row of a :data:`ROWS`-row product."""
        w = rows.shape[0]
        if not self._invariant(ROWS, rows):  # a row's place in the product matters
            return torch.cat([self.inner(_pad(rows[i : i + 1], 0, ROWS))[:1] for i in range(w)])
        if w == ROWS or self._invariant(w, rows):
            return self.inner(rows)
        return torch.cat([self.inner(rows[i : i + ROWS]) for i in range(0, w, ROWS)])

    def _invariant(self, width: int, rows: torch.Tensor) -> bool:
        """:func:`row_invariant` for this product, remembered on the module too (a step asks
        for every product)."""
        key = (ROWS, width, rows.dtype, rows.device, torch.get_num_threads())
        ok = self._verdicts.get(key)
        if ok is None:
            ok = self._verdicts[key] = row_invariant(self.inner, width, rows)
        return ok


def row_invariant(product: nn.Module, width: int, like: torch.Tensor) -> bool:
    """Whether ``product`` over ``width`` rows (a multiple of :data:`ROWS`) gives each row
    bitwise as the one-token forward does: for ``width == ROWS``, as that row alone in the
    first row of a :data:`ROWS`-row product; wider, as the :data:`ROWS`-row products of the
    same rows. Decided once per product type, shape, bias, dtype, device, thread count and
    width, on random rows (a summation order follows from the shapes, not the values, and any
    difference in it shows as rounding in some of them), and remembered for the process.

    A wider width is compared with its two halves' products where both were found invariant
    (equal to the halves, it equals their :data:`ROWS`-row products), else with every
    :data:`ROWS`-row product: three products a width, not one per group."""
    key = (type(product).__qualname__, product.in_features, product.out_features,
           getattr(product, "bias", None) is not None, like.dtype, like.device, torch.get_num_threads(), ROWS, width)
    ok = _checked.get(key)
    if ok is None:
        half = ROWS * (width // ROWS // 2)
        halves = width > ROWS and row_invariant(product, half, like) and row_invariant(product, width - half, like)
        g = torch.Generator(device="cpu").manual_seed(width)
        probe = torch.randn(width, product.in_features, generator=g).to(like.dtype).to(like.device)
        with torch.no_grad():
            whole = product(probe)
            if width == ROWS:
                parts = [product(_pad(probe[i : i + 1], 0, ROWS))[:1] for i in range(ROWS)]
            elif halves:
                parts = [product(probe[:half]), product(probe[half:])]
            else:
                parts = [product(probe[i : i + ROWS]) for i in range(0, width, ROWS)]
        ok = _checked[key] = bool(torch.equal(whole, torch.cat(parts)))
    return ok


def exact_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0,
                    **kwargs: Any) -> tuple[torch.Tensor, None]:
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
    rep, start = h // hk, n - q
    acc = torch.float64 if query.dtype == torch.float64 else torch.float32
    dev = query.device
    # rows: the rep * q queries of each key/value head, head by head (row r * q + i)
    qv = query[0].reshape(hk, rep * q, d).to(acc)  # [hk, Q, d]
    k, v = key[0].to(acc), value[0].to(acc)  # [hk, n, d]
    pos = attention_mask.reshape(q, n)  # [q, n]: key position, -1 = not seen
    rows = rep * q
    blocks = -(-n // KEY_BLOCK)
    width = blocks * KEY_BLOCK
    # a row's place among the ROWS rows of a product: in order, ROWS rows a product, or each
    # alone in the first row where its place in these products would change its rounding
    alone = not attention_rows_invariant(acc, dev, d)
    # every row in one product a key block, where products of that many (padded) rows were
    # checked to give each row as the ROWS-row products do
    padded = -(-rows // ROWS) * ROWS
    wide = not alone and attention_rows_invariant(acc, dev, d, padded)
    # 1. scores in slot order, every (query, key) pair in a [ROWS, d] x [d, KEY_BLOCK] product
    kb = _pad(k, 1, width).reshape(hk, blocks, KEY_BLOCK, d).transpose(-1, -2)  # [hk, B, d, K]
    if wide:
        s = torch.matmul(_pad(qv, 1, padded)[:, None], kb).transpose(1, 2)[:, :rows]  # [hk, Q, B, K]
    else:
        s = _from_rows(torch.matmul(_to_rows(qv, alone)[:, :, None], kb[:, None]).transpose(2, 3), rows, alone)
    s = s.reshape(hk, rows, width)[:, :, :n] * scaling
    softcap = kwargs.get("softcap")
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    # 2. the same scores in position order. Where every visible key sits at the slot of its
    #    position (the cache holds the committed prefix, the block is a chain), slot order is
    #    position order; else a block key goes to its position's column for the queries that
    #    see it.
    slot = torch.arange(n, device=dev)
    in_order = bool(((pos == slot) | (pos < 0)).all())
    unseen = (pos < 0).repeat(rep, 1)[None]  # [1, Q, n]
    if in_order:
        sp = _pad(s.masked_fill(unseen, float("-inf")), 2, width, float("-inf"))  # [hk, Q, W]
    else:
        cols = torch.where(pos >= 0, pos, width).clamp_(max=width).repeat(rep, 1)  # unseen -> dropped
        sp = s.new_full((hk, rows, width + 1), float("-inf"))
        sp.scatter_(2, cols[None].expand(hk, rows, n), s.masked_fill(unseen, float("-inf")))
        sp = sp[:, :, :width]
    top = sp.amax(-1, keepdim=True).clamp_min(torch.finfo(acc).min)  # order-free; finite
    pb = torch.exp(sp - top).reshape(hk, rows, blocks, KEY_BLOCK)  # unseen: exactly 0
    # 3. values in position order, each (row group, key block) in one [ROWS, KEY_BLOCK] x
    #    [KEY_BLOCK, d] product. Blocks whose slots are their positions for every query (all
    #    of them, in order) read the values as the cache holds them; from the first block
    #    holding a draft's node on, values are gathered in position order
    first = blocks if in_order else start // KEY_BLOCK
    prefix = pos[:, :start]
    if not in_order and first and not bool(((prefix == slot[:start]) | (prefix < 0)).all()):
        first = 0  # the cache's prefix is not in position order (a draft's nodes): gather it all
    parts = []
    if first:
        vb = _pad(v[:, : first * KEY_BLOCK], 1, first * KEY_BLOCK).reshape(hk, first, KEY_BLOCK, d)
        pf = pb[:, :, :first].transpose(1, 2)  # [hk, first, Q, K]
        if wide:
            parts.append(torch.matmul(_pad(pf, 2, padded), vb)[:, :, :rows].transpose(1, 2))  # [hk, Q, first, d]
        else:
            pg = _to_rows(pf, alone, dim=2)  # [hk, first, G, R, K]
            parts.append(_from_rows(torch.matmul(pg, vb[:, :, None]), rows, alone, dim=2).transpose(1, 2))
    if blocks > first:
        parts.append(_gathered_values(pb[:, :, first:], v, pos, rep, first * KEY_BLOCK, width, alone))
    part = parts[0] if len(parts) == 1 else torch.cat(parts, 2)  # [hk, Q, B, d]
    sums = pb.sum(-1)  # [hk, Q, B]
    num, den = part[:, :, 0], sums[:, :, 0]
    for b in range(1, blocks):  # in position order: a shorter forward's missing blocks add +0.0
        num = num + part[:, :, b]
        den = den + sums[:, :, b]
    out = (num / den[..., None]).reshape(h, q, d)
    return out.transpose(0, 1)[None].to(query.dtype), None


def _to_rows(x: torch.Tensor, alone: bool, dim: int = 1) -> torch.Tensor:
    """Rows ``x.shape[dim]`` of ``x`` as products of :data:`ROWS` rows: that dim becomes
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


def _gathered_values(pt: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, rep: int, lo: int, width: int,
                     alone: bool) -> torch.Tensor:
    """Each row's weighted values over positions ``lo..width-1``, key block by key block in
    position order: ``pt`` ``[hk, rep * q, tail, K]`` (weights by position), ``v``
    ``[hk, n, d]`` (by slot), ``pos`` ``[q, n]``. Returns ``[hk, rep * q, tail, d]``.

    A query reads the values of the query that *covers* it (sees every position it sees, at the
    same slot, and the most positions: for a tree node, a leaf below it), so the queries of one
    branch share one gather and one product's rows; at positions a query does not see its
    weight is exactly 0."""
    hk, rows, tail, _ = pt.shape
    q, n, d = pos.shape[0], v.shape[1], v.shape[2]
    slot_of = torch.full((q, width - lo), n, dtype=torch.long, device=v.device)  # position -> slot
    qi, slots = (pos >= lo).nonzero(as_tuple=True)
    slot_of[qi, pos[qi, slots] - lo] = slots
    seen = slot_of < n
    covers = ((slot_of[:, None] == slot_of[None]) | ~seen[None]).all(-1)  # [j, i]: j covers i
    lead = torch.where(covers, seen.sum(-1)[:, None], -1).argmax(0)  # [q]; at worst itself
    group, row, owner = _place(lead.repeat(rep), alone)
    pg = pt.new_zeros(hk, int(group.max()) + 1, ROWS, tail, KEY_BLOCK)
    pg[:, group, row] = pt
    vt = torch.cat([v, v.new_zeros(hk, 1, d)], 1)[:, slot_of[owner]]  # [hk, G, tail*K, d]; n -> 0
    own = torch.matmul(pg.permute(0, 1, 3, 2, 4), vt.reshape(hk, -1, tail, KEY_BLOCK, d))  # [hk, G, tail, R, d]
    return own[:, group, :, row].permute(1, 0, 2, 3)


def _place(keys: torch.Tensor, alone: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of :data:`ROWS`-row products for ``m`` items: items with equal ``keys`` ``[m]``
    share products, in order, :data:`ROWS` a product; ``alone``: each item first in a product
    of its own. Returns each item's product and row ``[m]`` and each product's key ``[G]``."""
    m, dev = keys.shape[0], keys.device
    if alone:
        return torch.arange(m, device=dev), torch.zeros(m, dtype=torch.long, device=dev), keys
    order = torch.argsort(keys, stable=True)
    uniq, counts = torch.unique_consecutive(keys[order], return_counts=True)
    within = torch.arange(m, device=dev) - (torch.cumsum(counts, 0) - counts).repeat_interleave(counts)
    products = -(-counts // ROWS)
    group, row = torch.empty_like(keys), torch.empty_like(keys)
    group[order] = (torch.cumsum(products, 0) - products).repeat_interleave(counts) + within // ROWS
    row[order] = within % ROWS
    return group, row, uniq.repeat_interleave(products)


def attention_rows_invariant(dtype: torch.dtype, device: torch.device, d: int, width: int = ROWS) -> bool:
    """Whether exact attention's batched products (``[w, d] x [d, KEY_BLOCK]`` scores and
    ``[w, KEY_BLOCK] x [KEY_BLOCK, d]`` values) give each row bitwise as the one-token forward
    does, at this dtype, device, head size and thread count: for ``width == ROWS``, as that row
    alone in the first row of the product; wider (a multiple of :data:`ROWS`), as the
    :data:`ROWS`-row products of the same rows. Checked once on random rows, as
    :func:`row_invariant` checks the linears."""
    key = ("attention", dtype, device, torch.get_num_threads(), ROWS, KEY_BLOCK, d, width)
    ok = _checked.get(key)
    if ok is None:
        g = torch.Generator(device="cpu").manual_seed(d + width)
        ok = True
        for a, b in ((width, d), (d, KEY_BLOCK)), ((width, KEY_BLOCK), (KEY_BLOCK, d)):
            x = torch.randn(3, *a, generator=g).to(dtype).to(device)
            y = torch.randn(3, *b, generator=g).to(dtype).to(device)
            if width == ROWS:
                parts = [torch.matmul(_pad(x[:, i : i + 1], 1, ROWS), y)[:, :1] for i in range(ROWS)]
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


def _pad(x: torch.Tensor, dim: int, size: int, value: float = 0.0) -> torch.Tensor:
    """``x`` with ``value`` appended along ``dim`` up to ``size`` (one ``F.pad``)."""
    extra = size - x.shape[dim]
    if extra <= 0:
        return x
    return nn.functional.pad(x, (0, 0) * (x.dim() - 1 - dim % x.dim()) + (0, extra), value=value)


def register() -> None:
    """Register :func:`exact_attention` with transformers as :data:`IMPL` (once)."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface

        AttentionInterface.register(IMPL, exact_attention)
        _registered = True


def exact_copy(module: nn.Module) -> nn.Module:
    """A copy of a decoder layer (or a bare product module) for exact mode: every product
    wrapped in :class:`RowInvariantLinear`, attention run by :func:`exact_attention` (the copy
    has its own config object naming :data:`IMPL`); parameters and buffers shared."""
    register()
    if hasattr(module, "in_features"):
        return RowInvariantLinear(module)
    memo: dict[int, object] = {id(t): t for t in [*module.parameters(), *module.buffers()]}
    for sub in module.modules():
        config = getattr(sub, "config", None)
        if config is not None and id(config) not in memo:
            twin_config = copy.copy(config)
            twin_config._attn_implementation = IMPL
            memo[id(config)] = twin_config
    twin = copy.deepcopy(module, memo)
    for sub in list(twin.modules()):
        for name, child in list(sub.named_children()):
            if hasattr(child, "in_features") and not isinstance(child, RowInvariantLinear) and not any(
                    hasattr(c, "in_features") for c in child.children()):
                setattr(sub, name, RowInvariantLinear(child))
    return twin
