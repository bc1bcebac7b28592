#!/usr/bin/env python3
"""How a forward's time splits between the weight products and the rest, per block width.

    python lab/scripts/forward_split.py [--model qwen2.5-coder-1.5b] [--layout packed]
        [--widths 1,4,8] [--repeats 6] [--threads 2] [--json FILE]

``bench``'s roofline holds ``vanilla`` against the machine's streaming read over the bytes of
weights a token reads, so the time a step spends outside the products (norms, rotary,
attention, cache writes, activations, the Python of the layer loop) is what keeps it below the
limit, and a verification block's extra cost over one token is what its products and that rest
add with the width. This script runs the runner's forward of ``--widths`` new tokens (a chain,
every row's logits, as a verification asks) after a cached prompt of about 60 tokens, times
each call of the layout's product modules inside it (``packed``: ``PackedLinear``; the others:
``nn.Linear`` and the layout's linear modules) and prints, for the fastest of ``--repeats``
forwards, the forward's wall time, the products' and the rest.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

import torch
from torch import nn

from selfspec._engine.runner import Runner
from selfspec._engine.tuning.machine import machine_info
from selfspec.app._models import format_prompt, load

PROMPT = (
    "Write a Python function that checks whether a number is prime, with tests and a docstring."
)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="lab/scripts/forward_split.py", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--layout", default="packed")
    ap.add_argument("--widths", default="1,4,8")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load(args.model)
    runner = Runner(loaded.model, weight_layout=args.layout)
    spent = {"s": 0.0, "calls": 0}
    # the modules a forward runs, in its layout
    run_modules = [*runner._run_layers, runner.adapter.lm_head]
    products = {m for top in run_modules for m in top.modules() if _is_product(m)}

    def before(module, inputs):  # noqa: ARG001 (a forward pre-hook's signature)
        module._t0 = time.perf_counter()

    def after(module, inputs, output):  # noqa: ARG001 (a forward hook's signature)
        spent["s"] += time.perf_counter() - module._t0
        spent["calls"] += 1

    for m in products:
        m.register_forward_pre_hook(before)
        m.register_forward_hook(after)
    ids = torch.tensor(format_prompt(loaded, PROMPT))
    rows = []
    for width in [int(w) for w in args.widths.split(",")]:
        best = None
        for _ in range(args.repeats):
            cache = runner.new_cache(len(ids) + width + 1)
            with torch.inference_mode():
                runner.forward(ids, cache=cache, start=0, logits="last")
                spent.update(s=0.0, calls=0)
                t0 = time.perf_counter()
                runner.forward(torch.full((width,), 100), cache=cache, start=len(ids), logits="all")
                wall = time.perf_counter() - t0
            if best is None or wall < best["forward_ms"] / 1e3:
                best = {
                    "width": width,
                    "forward_ms": wall * 1e3,
                    "products_ms": spent["s"] * 1e3,
                    "rest_ms": (wall - spent["s"]) * 1e3,
                    "product_calls": spent["calls"],
                }
        rows.append(best)
        print(
            f"width {width:3d}: forward {best['forward_ms']:7.1f} ms = "
            f"products {best['products_ms']:7.1f} ms "
            f"({best['product_calls']} calls) + rest {best['rest_ms']:6.1f} ms",
            flush=True,
        )
    if args.json:
        blob = {
            "model": args.model,
            "layout": runner.weight_layout,
            "prompt_tokens": len(ids),
            "rows": rows,
            "machine": {**machine_info(), "threads": args.threads},
            "command": " ".join(
                [
                    "python lab/scripts/forward_split.py",
                    *(argv if argv is not None else sys.argv[1:]),
                ]
            ),
        }
        with open(args.json, "w") as f:
            json.dump(blob, f, indent=2)
    return 0


def _is_product(module: nn.Module) -> bool:
    """A module that multiplies by a weight and holds no other such module (a leaf product)."""
    return (isinstance(module, nn.Linear) or type(module).__name__.endswith("Linear")) and not any(
        _is_product(c) for c in module.children()
    )


if __name__ == "__main__":
    sys.exit(main())
