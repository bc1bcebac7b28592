"""The draft weights' quantizers: int8 per output row (:func:`quantize_rows`) and 4-bit per
output row and group of inputs (:func:`quantize_groups`)."""

from __future__ import annotations

import torch

#: Rows of a weight converted at once while building (bounds the float temporaries).
CHUNK_ROWS = 4096


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output channel: ``(q [out, in] int8, scale [out] float32)``, with
    ``weight ~= q * scale[:, None]``; built :data:`CHUNK_ROWS` rows at a time."""
    out_f, in_f = weight.shape
    q = torch.empty(out_f, in_f, dtype=torch.int8, device=weight.device)
    scale = torch.empty(out_f, dtype=torch.float32, device=weight.device)
    for r in range(0, out_f, CHUNK_ROWS):
        w = weight[r : r + CHUNK_ROWS].detach().float()
        s = (w.abs().amax(1) / 127.0).clamp_min(1e-12)  # [rows]
        q[r : r + CHUNK_ROWS] = (
            (w / s[:, None]).round_().clamp_(-127, 127)
        )  # whole numbers: exact on the cast
        scale[r : r + CHUNK_ROWS] = s
    return q, scale


#: Inputs per group of the 4-bit draft weights (each group: a scale and an offset per row; 128
#: agreed with the model as often as the int8 copies at 1.5B, docs/performance.md).
INT4_GROUP = 128


def quantize_groups(
    weight: torch.Tensor, group: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit per output row and group of ``group`` inputs: ``(codes [out, in] uint8
    in 0..15, scale [out, groups], offset [out, groups])`` float32, with ``weight[o, i] ~=
    codes[o, i] * scale[o, g] + offset[o, g]`` for ``g = i // group`` (the group's minimum
    and its range over 15 steps); built :data:`CHUNK_ROWS` rows at a time."""
    return quantize_groups_torch(weight, group)


def quantize_groups_torch(
    weight: torch.Tensor, group: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`quantize_groups` in torch operations ."""
    out_f, in_f = weight.shape
    groups = -(-in_f // group)
    codes = torch.empty(out_f, in_f, dtype=torch.uint8)
    scale = torch.empty(out_f, groups, dtype=torch.float32)
    offset = torch.empty(out_f, groups, dtype=torch.float32)
    for r in range(0, out_f, CHUNK_ROWS):
        w = weight[r : r + CHUNK_ROWS].detach().float().cpu()
        # a partial last group is padded with its own last input: its minimum and range stay its own
        if groups * group != in_f:
            w = torch.cat([w, w[:, -1:].expand(-1, groups * group - in_f)], 1)
        padded = w.reshape(-1, groups, group)
        lo, hi = padded.amin(-1), padded.amax(-1)
        s = ((hi - lo) / 15.0).clamp_min(1e-12)
        c = (
            (padded - lo[..., None]).div_(s[..., None]).round_().clamp_(0, 15)
        )  # one temporary, in place after
        codes[r : r + CHUNK_ROWS] = c.view(-1, groups * group)[
            :, :in_f
        ]  # cast to uint8 on the copy
        scale[r : r + CHUNK_ROWS], offset[r : r + CHUNK_ROWS] = s, lo
    return codes, scale, offset
