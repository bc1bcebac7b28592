"""The layouts of weights that the native kernel (``native_kernel.c``) reads, the scratch its
integer products round activations into, and those products' error bounds: pure tensor
rearrangements, no kernel needed."""

from __future__ import annotations

import torch

#: Rows of a weight rearranged into panels at once (bounds the temporaries while building).
CHUNK_ROWS = 4096


#: Outputs per panel of the ``int8vnni`` products (two vectors of 16 lanes).
VNNI_TILE = 32
#: Rows up to which an ``int8vnni`` product rounds activations to 16-bit integers (8-bit beyond).
VNNI_FINE_ROWS = 2
#: Outputs per panel of the ``int4avx2`` products (two vectors of 8 lanes).
INT4_AVX2_TILE = 16
#: Rows up to which an ``int4avx2`` product rounds activations to 15-bit integers (8-bit beyond).
INT4_AVX2_FINE_ROWS = 2


def to_vnni_panels(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 weights ``q [out, in]`` as the ``int8vnni`` products read them: panels
    ``[ceil(out / 32), ceil(in / 4), 32, 4]`` (four consecutive inputs of an output per 32-bit
    lane; padding inputs and rows 0) and each output row's sum of ``q``, int32 ``[tiles * 32]``;
    built :data:`CHUNK_ROWS` rows at a time."""
    out_f, in_f = q.shape
    tiles, k4 = -(-out_f // VNNI_TILE), -(-in_f // 4)
    panels = torch.empty(tiles, k4, VNNI_TILE, 4, dtype=torch.int8)
    colsum = torch.zeros(tiles * VNNI_TILE, dtype=torch.int32)
    step = max(1, CHUNK_ROWS // VNNI_TILE) * VNNI_TILE
    for r in range(0, out_f, step):
        c = q[r : r + step]
        colsum[r : r + c.shape[0]] = c.sum(1, dtype=torch.int32)
        block = c.new_zeros(-(-c.shape[0] // VNNI_TILE) * VNNI_TILE, k4 * 4)
        block[: c.shape[0], :in_f] = c
        t0 = r // VNNI_TILE
        panels[t0 : t0 + block.shape[0] // VNNI_TILE] = block.view(-1, VNNI_TILE, k4, 4).transpose(1, 2)
    return panels, colsum


def to_int4_vnni_panels(codes: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """4-bit codes ``[out, in]`` (uint8, each 0..15) as the ``int4vnni`` products read them:
    :func:`to_int4_quad_panels` of :data:`VNNI_TILE` outputs, ``[ceil(out / 32), ceil(in / 4),
    16, 4]`` uint8; and each output row's sum of codes per group of ``group`` inputs (a multiple
    of 4), int32 ``[tiles, groups, 32]``."""
    if group % 4:
        raise ValueError(f"a 4-bit VNNI group must be a multiple of 4 inputs, not {group}")
    out_f, in_f = codes.shape
    tiles, groups = -(-out_f // VNNI_TILE), -(-in_f // group)
    gsum = torch.zeros(tiles, groups, VNNI_TILE, dtype=torch.int32)
    step = max(1, CHUNK_ROWS // VNNI_TILE) * VNNI_TILE
    for r in range(0, out_f, step):
        c = codes[r : r + step]
        block = c.new_zeros(-(-c.shape[0] // VNNI_TILE) * VNNI_TILE, groups * group)
        block[: c.shape[0], :in_f] = c
        t0, n = r // VNNI_TILE, block.shape[0] // VNNI_TILE
        gsum[t0 : t0 + n] = block.view(n, VNNI_TILE, groups, group).sum(-1, dtype=torch.int32).transpose(1, 2)
    return to_int4_quad_panels(codes, VNNI_TILE), gsum


def to_int4_quad_panels(codes: torch.Tensor, tile: int) -> torch.Tensor:
    """4-bit codes ``[out, in]`` (uint8, each 0..15) as panels of ``tile`` outputs and four
    consecutive inputs per 32-bit lane (the ``int4vnni`` and ``int4avx2`` products): per tile and
    four inputs, ``tile * 2`` bytes whose low nibbles hold outputs ``0 .. tile/2 - 1``'s four
    codes and whose high nibbles the others', ``[ceil(out / tile), ceil(in / 4), tile // 2, 4]``
    uint8 (padding inputs and rows: code 0); built :data:`CHUNK_ROWS` rows at a time."""
    out_f, in_f = codes.shape
    tiles, k4, half = -(-out_f // tile), -(-in_f // 4), tile // 2
    panels = torch.empty(tiles, k4, half, 4, dtype=torch.uint8)
    step = max(1, CHUNK_ROWS // tile) * tile
    for r in range(0, out_f, step):
        c = codes[r : r + step]
        if c.shape[0] % tile or in_f != k4 * 4:  # padding rows or inputs: code 0
            block = c.new_zeros(-(-c.shape[0] // tile) * tile, k4 * 4)
            block[: c.shape[0], :in_f] = c
        else:
            block = c
        t0, n = r // tile, block.shape[0] // tile
        quads = block.view(n, tile, k4, 4)
        low = quads[:, :half].clone()
        low |= quads[:, half:] << 4
        panels[t0 : t0 + n] = low.transpose(1, 2)
    return panels


def to_int4_panels(codes: torch.Tensor, width: int) -> torch.Tensor:
    """4-bit codes ``[out, in]`` (uint8, each 0..15) as ``[ceil(out / width), in, width // 2]``
    bytes: in each tile, byte ``j`` of input ``i`` holds output ``j``'s code in its low nibble
    and output ``j + width // 2``'s in its high one (padding rows: code 0)."""
    out_f, in_f = codes.shape
    tiles, half = -(-out_f // width), width // 2
    panels = torch.empty(tiles, in_f, half, dtype=torch.uint8)
    step = max(1, CHUNK_ROWS // width) * width
    for r in range(0, out_f, step):
        c = codes[r : r + step]
        if c.shape[0] % width:
            c = torch.cat([c, c.new_zeros(width - c.shape[0] % width, in_f)])
        c = c.view(-1, width, in_f)
        panels[r // width : r // width + c.shape[0]] = (c[:, :half] | (c[:, half:] << 4)).transpose(1, 2)
    return panels


def to_group_panels(values: torch.Tensor, width: int) -> torch.Tensor:
    """Per-row, per-group values ``[out, groups]`` as ``[ceil(out / width), groups, width]``
    float32 (padding rows: 0), the layout :func:`native_linear_int4` reads scales and offsets in."""
    out_f, groups = values.shape
    tiles = -(-out_f // width)
    padded = values.new_zeros(tiles * width, groups, dtype=torch.float32)
    padded[:out_f] = values
    return padded.view(tiles, width, groups).transpose(1, 2).contiguous()


def to_panels(weight: torch.Tensor, width: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A ``[out, in]`` weight as ``[ceil(out / width), in, width]`` panels of ``dtype`` (the
    last padded with zero rows), built :data:`CHUNK_ROWS` rows at a time."""
    out_f, in_f = weight.shape
    tiles = -(-out_f // width)
    panels = torch.empty(tiles, in_f, width, dtype=dtype)
    step = max(1, CHUNK_ROWS // width) * width
    for r in range(0, out_f, step):
        w = weight[r : r + step].detach().to(dtype)
        if w.shape[0] % width:
            w = torch.cat([w, w.new_zeros(width - w.shape[0] % width, in_f)])
        panels[r // width : r // width + w.shape[0] // width] = w.view(-1, width, in_f).transpose(1, 2)
    return panels


def from_panels(panels: torch.Tensor, out_features: int) -> torch.Tensor:
    """The ``[out, in]`` weight :func:`to_panels` was given (exactly: a rearrangement)."""
    return from_panels_into(panels, torch.empty(out_features, panels.shape[1], dtype=panels.dtype,
                                                device=panels.device))


def from_panels_into(panels: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """:func:`from_panels` written into ``out`` (a contiguous ``[rows, in]`` tensor, ``rows`` at
    most the panels' rows): the weight's first ``rows`` rows. Returns ``out``."""
    _, in_f, width = panels.shape
    rows = out.shape[0]
    full = rows // width
    if full:
        out[: full * width].view(full, width, in_f).copy_(panels[:full].transpose(1, 2))
    if rows > full * width:
        out[full * width :].copy_(panels[full, :, : rows - full * width].t())
    return out


def vnni_error_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The most an ``int8vnni`` product of ``x [n, in]`` can differ from ``x @ w.T`` (``w`` the
    dequantized weights ``[out, in]``), ``[n, out]``: each activation rounded to within half its
    row's step (``max|x| / 32767`` for up to :data:`VNNI_FINE_ROWS` rows, ``/ 127`` beyond), and the
    float32 roundings of the sums and scales."""
    return rounding_error_bound(x, w, 32767.0 if x.shape[0] <= VNNI_FINE_ROWS else 127.0)


def int4avx2_error_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The most an ``int4avx2`` product of ``x [n, in]`` can differ from ``x @ w.T`` (``w`` the
    part of the 4-bit weights the rounded activations meet, codes times scales ``[out, in]``),
    ``[n, out]``: each activation rounded to within half its row's step (``max|x| / 16383`` for
    up to :data:`INT4_AVX2_FINE_ROWS` rows, ``/ 127`` beyond), and the float32 roundings."""
    return rounding_error_bound(x, w, 16383.0 if x.shape[0] <= INT4_AVX2_FINE_ROWS else 127.0)


def rounding_error_bound(x: torch.Tensor, w: torch.Tensor, top: float) -> torch.Tensor:
    """The most a product of ``x [n, in]`` by ``w [out, in]`` can differ from ``x @ w.T`` when
    each row of ``x`` is rounded to integers of step ``max|x| / top`` before an exact integer
    product, ``[n, out]``: half a step per activation, and the float32 roundings of the sums
    and scales."""
    x, w = x.double(), w.double()
    step = x.abs().amax(1, keepdim=True) / top
    return step / 2 * w.abs().sum(1) + 1e-6 * (x.abs() @ w.abs().T) * 4


def rounded_scratch(rows: int, in_features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The integer products' scratch (``int8vnni``, ``int4vnni``, ``int4avx2``): the rows'
    rounded activation bytes (up to two per input, padded to 4 inputs) and their scales."""
    return (torch.empty(rows, 2 * -(-in_features // 4) * 4, dtype=torch.uint8),
            torch.empty(rows, dtype=torch.float32))
