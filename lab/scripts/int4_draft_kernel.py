#!/usr/bin/env python3
"""Would a 4-bit draft copy be cheaper than the int8 one on this CPU? PyTorch's CPU int4 product
(``aten._weight_int4pack_mm_for_cpu``, group-wise asymmetric 4-bit weights, bf16 activations)
against the draft weights' ``int8`` backend (``DynamicInt8Linear``), per matrix, with a working
set larger than the caches (as a draft pass over every layer reads it).

    python lab/scripts/int4_draft_kernel.py [--shape 8960x1536] [--matrices 24] [--group 64]
        [--rows 1,2,4,8] [--repeats 10]

Prints, per row count (a draft pass's width), the time per matrix of each kernel, the bytes of
weights each reads per second, and each one's relative error against the float32 product.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import torch

from selfspec._engine.draftweights.linears import DynamicInt8Linear
from selfspec._engine.machine import machine_info


def int4_pack(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(packed, scales_and_zeros)`` for ``aten._weight_int4pack_mm_for_cpu``: 4-bit codes per
    ``group`` inputs, dequantized as ``(q - 8) * scale + zero``."""
    n, k = w.shape
    wg = w.float().reshape(n, k // group, group)
    lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    scale = (hi - lo).clamp_min(1e-6) / 15
    q = torch.round((wg - lo) / scale).clamp(0, 15).to(torch.int32).reshape(n, k)
    sz = torch.cat([scale, lo + scale * 8], -1).reshape(n, k // group, 2).transpose(0, 1).contiguous()
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1), sz.to(torch.bfloat16)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lab/scripts/int4_draft_kernel.py", description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="8960x1536", help="OUTxIN of each matrix (default: a 1.5B Qwen MLP)")
    ap.add_argument("--matrices", type=int, default=24, help="distinct matrices cycled through (the working set)")
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args(argv)
    n, k = (int(x) for x in args.shape.split("x"))
    torch.manual_seed(0)
    weights = [torch.randn(n, k) * 0.02 for _ in range(args.matrices)]
    probe = weights[0].clone()
    int8 = [DynamicInt8Linear(w, None) for w in weights]
    int4 = [int4_pack(w, args.group) for w in weights]
    del weights
    m = machine_info()
    print(f"{m['cpu']} [{m['cpu_capability']}], {m['torch_threads']} threads, torch {torch.__version__}; "
          f"{args.matrices} matrices of {n}x{k} (int8 {args.matrices * n * k / 1e6:.0f} MB, "
          f"int4 {args.matrices * n * k / 2e6:.0f} MB), group {args.group}")
    for rows in (int(r) for r in args.rows.split(",")):
        x = torch.randn(rows, k)
        xb = x.to(torch.bfloat16)
        ref = x @ probe.t()
        err8 = float((int8[0](x) - ref).norm() / ref.norm())
        p0, s0 = int4[0]
        err4 = float((torch.ops.aten._weight_int4pack_mm_for_cpu(xb, p0, args.group, s0).float() - ref).norm()
                     / ref.norm())

        def run8(x=x) -> None:
            for lin in int8:
                lin(x)

        def run4(xb=xb) -> None:
            for packed, sz in int4:
                torch.ops.aten._weight_int4pack_mm_for_cpu(xb, packed, args.group, sz)

        times = {}
        for name, f in (("int8", run8), ("int4", run4)):
            f()
            t0 = time.perf_counter()
            for _ in range(args.repeats):
                f()
            times[name] = (time.perf_counter() - t0) / args.repeats / args.matrices
        print(f"rows {rows}: int8 {times['int8'] * 1e3:.3f} ms/matrix ({n * k / times['int8'] / 1e9:.0f} GB/s, "
              f"err {err8:.3f})  int4 {times['int4'] * 1e3:.3f} ms/matrix ({n * k / 2 / times['int4'] / 1e9:.0f} GB/s, "
              f"err {err4:.3f})  int4/int8 time {times['int4'] / times['int8']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
