#!/usr/bin/env python3
"""Time versions of the native kernel's float32 product against each other, on 1.5B shapes.

    python lab/scripts/kernel_variants.py VARIANT [VARIANT ...] [--rows 1,2,4,8,16] [--layers 4]
        [--threads 2] [--repeats 7] [--int8]

A VARIANT is ``SOURCE`` or ``SOURCE|FLAGS``: a copy of ``native_kernel.c`` (an older revision,
``git show REV:core/selfspec/_engine/runner/native_kernel.c > old.c``, or an edited one) and
extra compiler flags (``-DNAME=VALUE``). Each is built as the runner builds its kernel (the
machine's C compiler, ``-O3 -march=native``, OpenMP) and times ``selfspec_native_linear`` over the products of ``--layers`` Qwen2.5-1.5B-shaped
decoder layers (about 190 MB of float32 weights each, so they stream from memory) for blocks
of ``--rows`` rows, the variants interleaved row count by row count, fastest of ``--repeats``
calls. Each variant's panels are laid out at its own tile width, and every variant's outputs
must be bitwise equal to the first one's (they sum in the same order), else the line says
``MISMATCH``. The machine's streaming read is printed beside them (the bench's roofline).
``--int8`` times the int8 product (``selfspec_native_linear_int8``: int8 panels, a scale per
output row, the ``int8native`` draft weights) instead, GB/s of int8 weights.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import tempfile
from pathlib import Path

import torch

from selfspec._engine.runner import native
from selfspec._engine.runner.panels import to_panels
from selfspec.app._bench.roofline import read_bandwidths

sys.path.insert(0, str(Path(__file__).parent))
from kernel_bandwidth import SHAPES, gbps  # noqa: E402 (the layer shapes and the timing, shared)


def build(variant: str, folder: Path, index: int) -> ctypes.CDLL:
    """The variant's library (``SOURCE|FLAGS``), built into ``folder`` as the runner builds its own."""
    source, _, flags = variant.partition("|")
    out = folder / f"variant{index}.so"
    return native._bind(native.compile_kernel(out, native._compiler(), ("-march=native", *flags.split()),
                                               Path(source)))


def width(lib: ctypes.CDLL, int8: bool) -> int:
    """The variant's tile for the product timed (older kernels laid int8 panels at the float32 tile)."""
    return int(lib.selfspec_native_tile_q() if int8 and hasattr(lib, "selfspec_native_tile_q")
               else lib.selfspec_native_tile())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("variants", nargs="+", help="SOURCE or SOURCE|FLAGS")
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--int8", action="store_true", help="time the int8 product instead of the float32 one")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    raw = [torch.randn(o, i, generator=gen) * 0.02 for _ in range(args.layers) for (o, i) in SHAPES]
    if args.int8:
        raw = [(w / w.abs().amax(1, keepdim=True) * 127).round().to(torch.int8) for w in raw]
    nbytes = sum(w.numel() * w.element_size() for w in raw)
    with tempfile.TemporaryDirectory() as tmp:
        libs = [build(v, Path(tmp), k) for k, v in enumerate(args.variants)]
        panels = {}
        for lib in libs:
            tile = width(lib, args.int8)
            panels.setdefault(tile, [to_panels(w, tile, w.dtype) for w in raw])
        bw = read_bandwidths()
        print(f"{nbytes / 1e9:.2f} GB of {'int8' if args.int8 else 'float32'} weights, {args.threads} threads; streaming read "
              + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in bw.items()) + " GB/s")
        for rows in [int(r) for r in args.rows.split(",")]:
            xg = torch.Generator().manual_seed(rows)
            xs = {i: torch.randn(rows, i, generator=xg) for i in {i for _, i in SHAPES}}
            line, ref = f"rows {rows:3d}:", None
            for variant, lib in zip(args.variants, libs):
                tile = width(lib, args.int8)
                ws = panels[tile]
                ys = [torch.empty(rows, w.shape[0] * tile) for w in ws]
                scale = torch.ones(max(w.shape[0] for w in ws) * tile)

                def run(lib=lib, ws=ws, ys=ys, tile=tile, scale=scale, xs=xs, rows=rows) -> None:
                    for w, y in zip(ws, ys):
                        if args.int8:
                            lib.selfspec_native_linear_int8(xs[w.shape[1]].data_ptr(), w.data_ptr(), scale.data_ptr(),
                                                            None, y.data_ptr(), rows, w.shape[0] * tile, w.shape[1],
                                                            args.threads)
                        else:
                            lib.selfspec_native_linear(xs[w.shape[1]].data_ptr(), w.data_ptr(), None, y.data_ptr(),
                                                       rows, w.shape[0] * tile, w.shape[1], args.threads)

                best = nbytes / (gbps(run, nbytes, args.repeats) * 1e9)
                out = torch.cat([y[:, : w.shape[0]] for w, y in zip(raw, ys)], 1)
                same = "" if ref is None or torch.equal(ref, out) else " MISMATCH"
                ref = out if ref is None else ref
                name = Path(variant.partition("|")[0]).name + (f"|{variant.partition('|')[2]}" if "|" in variant else "")
                line += f"  [{name}] {best * 1e3:6.1f} ms {nbytes / best / 1e9:5.1f} GB/s{same}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
