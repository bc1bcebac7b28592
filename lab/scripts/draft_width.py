#!/usr/bin/env python3
"""A draft forward's cost against its width, per draft-weights backend, beside a full forward.

    python lab/scripts/draft_width.py [--model qwen2.5-coder-1.5b] [--backends int8,int4]
        [--widths 1,2,4,8] [--repeats 9] [--threads 2] [--json FILE] [--plot FILE.png]
    python lab/scripts/draft_width.py --from FILE.json --plot FILE.png   # a plot of a saved run

A tree's draft passes are blocks of a few rows: whether a backend makes a draft cheaper depends
on the widths a drafter's passes have, not on one row alone. After a cached prompt, each
backend's draft forward (every layer on its compressed copy, the whole vocabulary) and the
model's own forward (``vanilla``, the runner's ``auto`` layout) run ``--widths`` new tokens,
interleaved per repetition so all see the same machine load; prints the median and fastest ms
per width, and each draft's median as a fraction of ``vanilla``'s at one token; ``--plot``
draws those fractions against the width.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence

import torch

from selfspec._engine.drafting.draftweights import draft_weights
from selfspec._engine.runner import Runner
from selfspec._engine.tuning.machine import machine_info
from selfspec.app._models import format_prompt, load

PROMPT = (
    "Write a Python function that checks whether a number is prime, with tests and a docstring."
)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="lab/scripts/draft_width.py", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--backends", default="int8,int4")
    ap.add_argument("--widths", default="1,2,4,8")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None, help="a PNG of each draft's cost against its width")
    ap.add_argument(
        "--from", dest="saved", default=None, help="plot a saved --json run instead of measuring"
    )
    args = ap.parse_args(argv)
    if args.saved:
        with open(args.saved) as f:
            saved = json.load(f)
        _plot(
            {n: {int(w): ts for w, ts in ws.items()} for n, ws in saved["ms"].items()},
            saved,
            args.plot,
        )
        return 0
    torch.set_num_threads(args.threads)
    loaded = load(args.model)
    runner = Runner(loaded.model)
    variants = {"vanilla": None, **{b: draft_weights(runner, b) for b in args.backends.split(",")}}
    widths = [int(w) for w in args.widths.split(",")]
    ids = torch.tensor(format_prompt(loaded, PROMPT))
    cache = runner.new_cache(len(ids) + max(widths))
    start = len(ids)
    times: dict[str, dict[int, list[float]]] = {v: {w: [] for w in widths} for v in variants}
    with torch.inference_mode():
        runner.forward(ids, cache=cache, start=0, logits="last")
        block = ids[-1:].repeat(max(widths))
        for r in range(args.repeats + 1):  # one warm-up round
            for w in widths:
                for name, weights in variants.items():
                    t0 = time.perf_counter()
                    runner.forward(
                        block[:w], cache=cache, start=start, logits="all", weights=weights
                    )
                    if r:
                        times[name][w].append(time.perf_counter() - t0)
    one = statistics.median(times["vanilla"][widths[0]])
    print(
        f"ms per forward (median / fastest of {args.repeats}), layout {runner.weight_layout}; "
        f"draft median / vanilla's at {widths[0]} token"
    )
    print(f"{'variant':<12}" + "".join(f"{w:>22}" for w in widths))
    for name in variants:
        cells = [
            f"{1e3 * statistics.median(times[name][w]):7.1f} / {1e3 * min(times[name][w]):6.1f}"
            + ("" if name == "vanilla" else f" ({statistics.median(times[name][w]) / one:.2f})")
            for w in widths
        ]
        print(f"{name:<12}" + "".join(f"{c:>22}" for c in cells))
    if args.json:
        result = {
            "model": args.model,
            "layout": runner.weight_layout,
            "widths": widths,
            "repeats": args.repeats,
            "machine": {**machine_info(), "threads": args.threads},
            "command": " ".join(
                ["python lab/scripts/draft_width.py", *(argv if argv is not None else sys.argv[1:])]
            ),
            "ms": {
                n: {w: [1e3 * t for t in ts] for w, ts in ws.items()} for n, ws in times.items()
            },
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if args.plot:
        _plot(
            {n: {w: [1e3 * t for t in ts] for w, ts in ws.items()} for n, ws in times.items()},
            {"model": args.model, "machine": machine_info(), "threads": args.threads},
            args.plot,
        )
    return 0


def _plot(ms: dict[str, dict[int, list[float]]], meta: dict, path: str | None) -> None:
    """Each draft's median forward against its width, over ``vanilla``'s one-token median."""
    if not path:
        raise SystemExit("--from needs --plot FILE.png")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widths = sorted(ms["vanilla"])
    one = statistics.median(ms["vanilla"][widths[0]])
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for name, ws in ms.items():
        ys = [statistics.median(ws[w]) / one for w in widths]
        ax.plot(widths, ys, marker="o", linestyle="--" if name == "vanilla" else "-", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(widths, [str(w) for w in widths])
    ax.set_xlabel("rows in the forward")
    ax.set_ylabel(f"median time / vanilla's at {widths[0]} row")
    machine = meta.get("machine", {})
    cpu = " ".join(str(machine[k]) for k in ("cpu", "cpu_capability") if machine.get(k)) or "CPU"
    ax.set_title(
        f"{meta.get('model', '')}: a whole forward against its width\n{cpu}, "
        f"{machine.get('threads', meta.get('threads', ''))} threads",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
