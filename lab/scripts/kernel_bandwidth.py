#!/usr/bin/env python3
"""How fast each float32 product kernel reads weights for one token, against the bench's streaming read.

    python lab/scripts/kernel_bandwidth.py [--threads 2] [--layers 8] [--rows 1,8,32] [--json FILE]

The roofline of ``specdec bench`` divides the streaming read bandwidth (the faster of a sum and
a matrix-vector product over a buffer larger than the caches) by the bytes of weights a token
reads. A one-token step is a chain of matrix-vector products, so how close ``vanilla`` can come to that limit is bounded by how fast
the product kernels read. This script times, on the products of ``--layers`` Qwen2.5-1.5B-shaped
decoder layers (q, k, v, o, gate, up, down; about 140 MB each, so they stream from memory),
each layout the runner can hold weights in: the model's own ``[out, in]`` (``F.linear``, MKL),
a transposed copy (``x @ w``, MKL), oneDNN's prepacked weights and the native kernel's panels
(where it builds here), for blocks of ``--rows`` rows. Each figure is the fastest of several
calls, in GB/s of weights read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from selfspec._engine.machine import machine_info
from selfspec._engine.runner import native
from selfspec._engine.runner.native_copies import NativeLinear
from selfspec.app._bench.roofline import read_bandwidths

SHAPES = [(1536, 1536), (256, 1536), (256, 1536), (1536, 1536), (8960, 1536), (8960, 1536), (1536, 8960)]


def gbps(fn: Callable[[], object], nbytes: int, repeats: int = 7) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def _limit_bandwidths(times: int) -> list[dict[str, float]]:
    """GB/s of each of ``bench``'s streaming reads (a sum, a matrix-vector product) over a 1 GiB
    float32 buffer, ``times`` times; ``bench``'s limit is the fastest."""
    return [{k: v / 1e9 for k, v in read_bandwidths().items()} for _ in range(times)]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lab/scripts/kernel_bandwidth.py", description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rows", default="1", help="comma-separated block widths (rows per product), e.g. 1,8,32")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    out: dict[str, object] = {"machine": {**machine_info(), "threads": args.threads}, "layers": args.layers}
    reads = _limit_bandwidths(3)
    limit = {k: max(r[k] for r in reads) for k in reads[0]}
    weights = [torch.randn(o, i) for _ in range(args.layers) for (o, i) in SHAPES]
    nbytes = sum(w.numel() * 4 for w in weights)
    transposed = [w.t().contiguous() for w in weights]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w) for w in weights] if torch.backends.mkldnn.is_available() else []
    why = native.native_unsupported()
    natives = [NativeLinear(nn.Linear(w.shape[1], w.shape[0], bias=False)) for w in weights] if why is None else []
    for lin, w in zip(natives, weights):
        lin.panels.copy_(native.to_panels(w, native.tile()))
    out["gb_per_s"], out["limit_runs_gb_per_s"] = {}, reads
    print(f"{nbytes / 1e9:.2f} GB of float32 weights, {args.threads} threads; GB/s of weights read per product call"
          + ("" if why is None else f"; native: {why}"))
    print(f"limit (bench's roofline): sum {limit['sum']:.1f}, mv {limit['mv']:.1f} GB/s")
    print(f"{'rows':>4}  limit  " + "  ".join(f"{k:>10}" for k in ("model", "transposed", "packed", "native")))
    for r in [int(v) for v in args.rows.split(",")]:
        x = {n: torch.randn(r, n) for n in (1536, 8960)}
        rows = {"model": gbps(lambda x=x: [F.linear(x[w.shape[1]], w) for w in weights], nbytes),
                "transposed": gbps(lambda x=x: [x[w.shape[0]] @ w for w in transposed], nbytes)}
        if packed:
            rows["packed"] = gbps(lambda x=x: [torch.ops.mkldnn._linear_pointwise(x[w.shape[1]], p, None, "none", [], "")
                                           for w, p in zip(weights, packed)], nbytes)
        if natives:
            rows["native"] = gbps(lambda x=x: [lin(x[lin.in_features]) for lin in natives], nbytes)
        out["gb_per_s"][r] = rows
        print(f"{r:>4}  {max(limit.values()):5.1f}  " + "  ".join(f"{rows.get(k, float('nan')):10.1f}"
                                                      for k in ("model", "transposed", "packed", "native")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
