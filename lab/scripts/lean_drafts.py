#!/usr/bin/env python3
"""Draft passes on lean blocks against the layers' own modules: a pass's cost, and decodes.

    python lab/scripts/lean_drafts.py [--model qwen2.5-coder-1.5b] [--backends int8,int4]
        [--widths 1,2,4,8] [--repeats 9] [--plugins qspec,selfsd]
        [--tasks humaneval,gsm8k,mtbench,sharegpt] [--samples 2] [--max-new-tokens 64] [--threads 2]
        [--json FILE]

The runner runs draft weights' layers as lean blocks (``runner/lean.py``) where the adapter
recognises them, and through the layers' own modules with ``runner.lean_drafts = False``. Both
give bitwise the same logits. This script times, after a cached prompt, a draft pass of each
``--widths`` through every layer on each backend's compressed copy both ways, interleaved per
repetition (median ms, and as a fraction of the model's own one-token forward), and checks the
logits are equal. With ``--plugins``, it then decodes ``--samples`` test prompts of each task
(the first turn, greedy, every default) with each plugin both ways, interleaved, and reports
each side's wall time, their ratio (geo-mean over tasks) and whether the tokens are the same.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence

import torch

from selfspec import Decoder
from selfspec._engine.drafting.draftweights import draft_weights
from selfspec._engine.runner import Runner
from selfspec._engine.tuning.machine import machine_info
from selfspec.app._data import load_task
from selfspec.app._models import format_prompt, load

PROMPT = (
    "Write a Python function that checks whether a number is prime, with tests and a docstring."
)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="lab/scripts/lean_drafts.py", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--backends", default="int8,int4")
    ap.add_argument("--widths", default="1,2,4,8")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument(
        "--plugins", default="", help="comma-separated plugins to decode with, both ways"
    )
    ap.add_argument("--tasks", default="humaneval,gsm8k,mtbench,sharegpt")
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load(args.model)
    runner = Runner(loaded.model)
    blob: dict = {
        "model": args.model,
        "layout": runner.weight_layout,
        "machine": {**machine_info(), "threads": args.threads},
        "command": " ".join(
            ["python lab/scripts/lean_drafts.py", *(argv if argv is not None else sys.argv[1:])]
        ),
    }
    blob["passes"] = passes(
        runner,
        loaded,
        args.backends.split(","),
        [int(w) for w in args.widths.split(",")],
        args.repeats,
    )
    if args.plugins:
        blob["decodes"] = decodes(
            loaded,
            args.plugins.split(","),
            args.tasks.split(","),
            args.samples,
            args.max_new_tokens,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(blob, f, indent=2)
    return 0


def passes(runner: Runner, loaded, backends: list[str], widths: list[int], repeats: int) -> dict:
    """Median ms of a draft pass per backend, width and side; prints a table."""
    ids = torch.tensor(format_prompt(loaded, PROMPT))
    start = len(ids)
    cache = runner.new_cache(start + max(widths))
    with torch.inference_mode():
        runner.forward(ids, cache=cache, start=0, logits=None)
    weights = {b: draft_weights(runner, b) for b in backends}
    ms: dict[str, dict[int, list[float]]] = {"vanilla": {1: []}}
    ms.update(
        {f"{b} {side}": {w: [] for w in widths} for b in backends for side in ("modules", "lean")}
    )
    equal = True

    def timed(width: int, w, lean: bool) -> tuple[float, torch.Tensor]:
        runner.lean_drafts = lean
        block = torch.full((width,), 100)
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = runner.forward(
                block, cache=cache, start=start, logits="all", weights=w, write=False
            )
            return (time.perf_counter() - t0) * 1e3, out.logits

    for _ in range(repeats):
        ms["vanilla"][1].append(timed(1, None, True)[0])
        for b, w in weights.items():
            for width in widths:
                t_mod, y_mod = timed(width, w, False)
                t_lean, y_lean = timed(width, w, True)
                ms[f"{b} modules"][width].append(t_mod)
                ms[f"{b} lean"][width].append(t_lean)
                equal &= torch.equal(y_mod, y_lean)
    runner.lean_drafts = True
    step = statistics.median(ms["vanilla"][1])
    print(
        f"vanilla one-token forward: {step:.1f} ms (median of {repeats}); "
        f"logits equal both ways: {equal}"
    )
    print(f"{'draft pass':>18}  " + "  ".join(f"{w:>3} rows: ms (x vanilla)" for w in widths))
    for name, by_width in ms.items():
        if name == "vanilla":
            continue
        cells = [
            f"{statistics.median(ts):7.1f} ({statistics.median(ts) / step:.3f})    "
            for ts in by_width.values()
        ]
        print(f"{name:>18}  " + "  ".join(f"{c:>22}" for c in cells))
    return {
        "ms": {n: {str(w): ts for w, ts in bw.items()} for n, bw in ms.items()},
        "vanilla_ms": step,
        "logits_equal": equal,
    }


def decodes(loaded, plugins: list[str], tasks: list[str], samples: int, max_new: int) -> dict:
    """Each plugin's decodes both ways, interleaved per prompt; prints times and ratios."""
    out: dict = {}
    for plugin in plugins:
        dec = Decoder(loaded.model, plugin, tokenizer=loaded.tokenizer)
        dec.generate(format_prompt(loaded, PROMPT), 8)  # builds the draft weights and calibrations
        per_task: dict[str, dict[str, float]] = {}
        same = True
        for task in tasks:
            wall = {"modules": 0.0, "lean": 0.0}
            for sample in load_task(task, "test", n=samples):
                ids = format_prompt(loaded, sample.text(loaded.chat))
                tokens = {}
                for side in ("modules", "lean"):
                    dec.runner.lean_drafts = side == "lean"
                    t0 = time.perf_counter()
                    tokens[side] = list(dec.generate(ids, max_new).output_ids)
                    wall[side] += time.perf_counter() - t0
                same &= tokens["modules"] == tokens["lean"]
            per_task[task] = {**wall, "ratio": wall["modules"] / wall["lean"]}
            print(
                f"{plugin:>10} {task:>10}: modules {wall['modules']:6.2f} s, "
                f"lean {wall['lean']:6.2f} s, "
                f"lean {per_task[task]['ratio']:.3f}x as fast",
                flush=True,
            )
        geo = math.exp(statistics.fmean(math.log(t["ratio"]) for t in per_task.values()))
        print(f"{plugin:>10} geo-mean: lean {geo:.3f}x as fast; the same tokens both ways: {same}")
        out[plugin] = {"tasks": per_task, "geo_mean_ratio": geo, "same_tokens": same}
        dec.runner.lean_drafts = True
    return out


if __name__ == "__main__":
    sys.exit(main())
