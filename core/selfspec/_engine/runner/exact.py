"""Exact mode: a forward whose every row is bitwise what that row's one-token forward gives.

A verification pass over ``k + 1`` positions rounds differently from ``k + 1`` one-token
steps when a product or a reduction sums in another order for a block than for one row: a
GEMM picks its kernel and blocking from the number of rows (MKL runs one row as a
matrix-vector product), and attention reduces over however many keys the block sees. Exact
mode makes a row's result independent of how many rows are computed with it, with torch
operations only:

* **Products** (every linear of the layers and the LM head, in the runner's weight layout)
  compute each row as a product of exactly :data:`ROWS` rows computes it (a one-token step is
  its row and ``ROWS - 1`` zero rows), so a row meets the same kernel, blocking and summation
  order alone as inside any block. A block of ``w`` rows (up to :data:`FUSED_ROWS`) runs as
  one product, reading the weights once, only where that product's rows were found bitwise
  equal to :data:`ROWS`-row products of the same rows on this module's shape, dtype, device and
  thread count (:func:`row_invariant`: checked once per width on random rows; a kernel's
  summation order follows from its shapes, not the values): as ``w`` rows where that width is
  checked, else padded with zero rows to a multiple of :data:`ROWS` where that one is.
  Elsewhere each group of :data:`ROWS` rows is its own product. That a row's result does not
  depend on its place among the :data:`ROWS` rows is checked the same way; where it does,
  every row is computed alone, first in its own :data:`ROWS`-row product (slow, exact).
* **Attention** (:func:`.exact_attention.exact_attention`, registered with transformers'
  attention interface as :data:`IMPL`) reduces keys in blocks aligned at slot 0 and in
  position order, its products' rows placed as the linears' are (:mod:`.exact_attention`).
* **Norms, rotary embeddings, activations, residuals** work row by row and are already
  invariant (tested).

It costs some speed (a one-token step computes :data:`ROWS` rows of every product, a block
whose fused product is not row-invariant reads the weights once per group; attention loops
over key blocks in Python) and is its own reference: ``vanilla`` in exact mode, not HF
``generate`` (whose one-row products round differently; docs/losslessness.md).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

#: Rows of the product that defines every row's result, and of every query group, in exact mode.
ROWS = 4
#: The widest block of rows run as one product (a multiple of :data:`ROWS`); wider blocks run
#: in chunks of it, so at most ``FUSED_ROWS // ROWS`` widths are ever checked per shape.
FUSED_ROWS = 64
#: The attention implementation name exact layer copies run under.
IMPL = "selfspec_exact"

#: the checks' verdicts, by what decides a kernel's summation order (product type and shape, dtype,
#: device, threads, ROWS, width; attention's dtype, device, threads, ROWS, key block, head size)
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
        if (
            ROWS < n <= FUSED_ROWS
            and n % ROWS
            and self._invariant(ROWS, rows)
            and self._invariant(n, rows)
        ):
            out = self.inner(rows)  # no padding: this width gives each row as its ROWS-row product
            return out.reshape(*lead, out.shape[-1])
        padded = -(-n // ROWS) * ROWS
        if padded != n:
            rows = _pad(rows, 0, padded)
        if padded <= FUSED_ROWS:
            out = self._product(rows)  # [padded, out]
        else:
            out = torch.cat(
                [self._product(rows[i : i + FUSED_ROWS]) for i in range(0, padded, FUSED_ROWS)]
            )
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
    """Whether ``product`` over ``width`` rows gives each row bitwise as the one-token forward
    does: for ``width == ROWS``, as that row alone in the first row of a :data:`ROWS`-row
    product; wider, as the :data:`ROWS`-row products of the same rows (in order, ``ROWS`` a
    product, the last one padded with zero rows when ``width`` is not a multiple of ``ROWS``).
    Decided once per product type, shape, bias, dtype, device, thread count and
    width, on random rows (a summation order follows from the shapes, not the values, and any
    difference in it shows as rounding in some of them), and remembered for the process.

    A wider multiple of :data:`ROWS` is compared with its two halves' products where both were
    found invariant (equal to the halves, it equals their :data:`ROWS`-row products), else with
    every :data:`ROWS`-row product: three products a width, not one per group."""
    key = (
        type(product).__qualname__,
        product.in_features,
        product.out_features,
        getattr(product, "bias", None) is not None,
        like.dtype,
        like.device,
        torch.get_num_threads(),
        ROWS,
        width,
    )
    ok = _checked.get(key)
    if ok is None:
        half = ROWS * (width // ROWS // 2)
        halves = (
            width > ROWS
            and width % ROWS == 0
            and row_invariant(product, half, like)
            and row_invariant(product, width - half, like)
        )
        g = torch.Generator(device="cpu").manual_seed(width)
        probe = torch.randn(width, product.in_features, generator=g).to(like.dtype).to(like.device)
        with torch.no_grad():
            whole = product(probe)
            if width == ROWS:
                parts = [product(_pad(probe[i : i + 1], 0, ROWS))[:1] for i in range(ROWS)]
            elif halves:
                parts = [product(probe[:half]), product(probe[half:])]
            else:
                parts = [
                    product(_pad(probe[i : i + ROWS], 0, ROWS))[: width - i]
                    for i in range(0, width, ROWS)
                ]
        ok = _checked[key] = bool(torch.equal(whole, torch.cat(parts)))
    return ok


def _pad(x: torch.Tensor, dim: int, size: int, value: float = 0.0) -> torch.Tensor:
    """``x`` with ``value`` appended along ``dim`` up to ``size`` (one ``F.pad``)."""
    extra = size - x.shape[dim]
    if extra <= 0:
        return x
    return nn.functional.pad(x, (0, 0) * (x.dim() - 1 - dim % x.dim()) + (0, extra), value=value)


def exact_copy(module: nn.Module) -> nn.Module:
    """A copy of a decoder layer (or a bare product module) for exact mode: every product
    wrapped in :class:`RowInvariantLinear`, attention run by :func:`exact_attention` (the copy
    has its own config object naming :data:`IMPL`, registered by
    :func:`.exact_attention.register`); parameters and buffers shared."""
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
            if (
                hasattr(child, "in_features")
                and not isinstance(child, RowInvariantLinear)
                and not any(hasattr(c, "in_features") for c in child.children())
            ):
                setattr(sub, name, RowInvariantLinear(child))
    return twin
