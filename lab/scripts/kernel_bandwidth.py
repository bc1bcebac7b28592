#!/usr/bin/env python3
"""How fast each float32 product kernel reads weights for one token, against a plain sum.

    python lab/scripts/kernel_bandwidth.py [--threads 2] [--layers 8] [--json FILE]

The roofline of ``specdec bench`` divides the streaming read bandwidth (a sum over a buffer
larger than the caches) by the bytes of weights a token reads. A one-token step is a chain of
matrix-vector products, so how close ``vanilla`` can come to that limit is bounded by how fast
the product kernels read. This script times, on the products of ``--layers`` Qwen2.5-1.5B-shaped
decoder layers (q, k, v, o, gate, up, down; about 140 MB each, so they stream from memory),
each layout the runner can hold weights in: the model's own ``[out, in]`` (``F.linear``, MKL),
a transposed copy (``x @ w``, MKL) and oneDNN's prepacked weights. Each figure is the fastest
of several calls, in GB/s of weights read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from selfspec._engine.machine import machine_info

SHAPES = [(1536, 1536), (256, 1536), (256, 1536), (1536, 1536), (8960, 1536), (8960, 1536), (1536, 8960)]


def gbps(fn: Callable[[], object], nbytes: int, repeats: int = 7) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def _sum_bandwidths(times: int) -> list[float]:
    """GB/s of ``times`` sums over a 1 GiB float32 buffer (what ``bench`` measures)."""
    buf = torch.ones(1 << 28)
    return [gbps(buf.sum, buf.numel() * 4) for _ in range(times)]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lab/scripts/kernel_bandwidth.py", description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    out: dict[str, object] = {"machine": {**machine_info(), "threads": args.threads}, "layers": args.layers}
    sums = _sum_bandwidths(3)
    weights = [torch.randn(o, i) for _ in range(args.layers) for (o, i) in SHAPES]
    nbytes = sum(w.numel() * 4 for w in weights)
    x = {n: torch.randn(1, n) for n in (1536, 8960)}
    transposed = [w.t().contiguous() for w in weights]
    rows = {"sum over a 1 GiB buffer (the bench's bandwidth)": max(sums),
            "model layout, F.linear (MKL)": gbps(lambda: [F.linear(x[w.shape[1]], w) for w in weights], nbytes),
            "transposed copy, x @ w (MKL)": gbps(lambda: [x[w.shape[0]] @ w for w in transposed], nbytes)}
    if torch.backends.mkldnn.is_available():
        packed = [torch.ops.mkldnn._reorder_linear_weight(w) for w in weights]

        def run_packed() -> None:
            for w, p in zip(weights, packed):
                torch.ops.mkldnn._linear_pointwise(x[w.shape[1]], p, None, "none", [], "")

        rows["packed (oneDNN)"] = gbps(run_packed, nbytes)
    out["gb_per_s"] = rows
    out["sum_runs_gb_per_s"] = sums
    print(f"{nbytes / 1e9:.2f} GB of float32 weights, one token, {args.threads} threads")
    for k, v in rows.items():
        print(f"{k:<50} {v:6.1f} GB/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
