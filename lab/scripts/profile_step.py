#!/usr/bin/env python3
"""Profile one decoding step of the host beside HF's, on the same kernels (docs/performance.md).

    python lab/scripts/profile_step.py [--model M] [--threads 2] [--steps 16] [--width 1]
        [--layout model] [--exact] [--top 15] [--json FILE]

Both decode the same prompt for ``--steps`` steps after a warm-up: HF's own forward with its
``DynamicCache`` (what ``generate`` runs per step), and ``vanilla``'s runner forward with the
host's KV cache, in the weight layout ``--layout`` (``model``: the same products as HF's).
``--width k`` profiles a verification forward of ``k`` tokens instead of one-token steps;
``--exact`` profiles the host's runner in exact mode (docs/losslessness.md) beside the default one.
Prints, for each, the wall time per step and the ``torch.profiler`` operators with the most
self CPU time; ``--json`` keeps both tables.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

import torch
from torch.profiler import ProfilerActivity, profile

from selfspec._engine.runner import Runner
from selfspec._engine.tuning.machine import machine_info
from selfspec.app._models import format_prompt, load


def _hf_steps(model, ids: torch.Tensor, steps: int, width: int) -> None:
    from transformers import DynamicCache

    cache = DynamicCache()
    out = model(ids, past_key_values=cache, use_cache=True)
    nxt = out.logits[:, -1:].argmax(-1).repeat(1, width)
    for _ in range(steps):
        out = model(nxt, past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1).repeat(1, width)


def _host_steps(runner: Runner, ids: torch.Tensor, steps: int, width: int) -> None:
    prompt = ids[0]
    cache = runner.new_cache(len(prompt) + steps * width + 1)
    out = runner.forward(prompt, cache=cache, start=0, logits="last")
    nxt = out.logits[-1:].argmax(-1).repeat(width)
    for _ in range(steps):
        out = runner.forward(nxt, cache=cache, logits="all" if width > 1 else "last")
        nxt = out.logits[-1:].argmax(-1).repeat(width)


def _profile(fn, top: int) -> tuple[float, list[dict]]:
    fn()  # warm-up
    t0 = time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return wall, [
        {"op": e.key, "self_cpu_ms": e.self_cpu_time_total / 1e3, "calls": e.count} for e in rows
    ]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="lab/scripts/profile_step.py", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--width", type=int, default=1)
    ap.add_argument("--layout", default="model")
    ap.add_argument("--exact", action="store_true")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load(args.model)
    model = loaded.model
    ids = torch.tensor(
        [format_prompt(loaded, "Write a Python function that checks whether a number is prime.")]
    )
    runner = Runner(model, weight_layout=args.layout)
    exact = Runner(model, weight_layout=args.layout, exact=True) if args.exact else None
    result = {
        "model": args.model or "default",
        "steps": args.steps,
        "width": args.width,
        "layout": runner.weight_layout,
        "machine": {**machine_info(), "threads": args.threads},
        "command": " ".join(
            ["python lab/scripts/profile_step.py", *(argv if argv is not None else sys.argv[1:])]
        ),
    }
    with torch.inference_mode():
        runs = [
            ("hf", lambda: _hf_steps(model, ids, args.steps, args.width)),
            ("host", lambda: _host_steps(runner, ids, args.steps, args.width)),
        ]
        if exact is not None:
            runs.append(("host-exact", lambda: _host_steps(exact, ids, args.steps, args.width)))
        for name, fn in runs:
            wall, rows = _profile(fn, args.top)
            result[name] = {"ms_per_step": 1e3 * wall / args.steps, "top": rows}
            print(
                f"\n{name}: {1e3 * wall / args.steps:.2f} ms per step (prefill included once), "
                f"width {args.width}, "
                f"layout {'model (HF)' if name == 'hf' else runner.weight_layout}"
            )
            print(f"{'op':<48} {'self ms':>9} {'calls':>6}")
            for r in rows:
                print(f"{r['op'][:48]:<48} {r['self_cpu_ms']:9.2f} {r['calls']:6d}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
