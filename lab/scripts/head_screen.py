#!/usr/bin/env python3
"""How many tokens an int8 copy of the LM head leaves in doubt: a rigorous screen for the argmax.

    python lab/scripts/head_screen.py [--model qwen2.5-coder-1.5b]
        [--tasks humaneval,gsm8k,mtbench,sharegpt] [--samples 2] [--tokens 200] [--repeats 9]
        [--threads 2] [--json FILE]

A greedy step needs the argmax of the head's logits, not the logits. Where ``W`` is the head
(``[V, H]``) and ``Ŵ`` its int8 copy (each row rounded to 255 steps of ``s_v = max|w_v| / 127``),
``|x·w_v − x·ŵ_v| <= s_v / 2 · ||x||_1``, and a float32 product of ``H`` terms is within
``γ_H · ||x||_1 · max|w_v|`` of the exact one (``γ_H = H u / (1 − H u)``, ``u = 2^-24``, taken
twice: both products). So only the tokens whose int8 logit plus that bound reaches the largest
int8 logit minus its bound can be the float32 argmax; the float32 logits of those few rows then
decide it exactly. This script counts those candidates over the final-norm states of test
prompts (teacher-forced, the first ``--tokens`` tokens of each), checks that the exact argmax
(float64) is always among them, and does the same for int8 activations as PyTorch's dynamic
int8 kernel rounds them (one scale per row: ``(max − min) / 255``), whose bound adds
``step / 2 · ||ŵ_v||_1``. It then times, at 1 and 8 rows, the runner's float32 head against
the int8-weights head (float32 activations) plus the float32 rows of 32 candidates.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from selfspec._engine.drafting.draftweights.layers import draft_linear
from selfspec._engine.runner import Runner
from selfspec._engine.tuning.machine import machine_info
from selfspec.app._data import load_task
from selfspec.app._models import format_prompt, load


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="lab/scripts/head_screen.py", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--tasks", default="humaneval,gsm8k,mtbench,sharegpt")
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load(args.model)
    runner = Runner(loaded.model)
    W = runner.lm_head.weight.detach().float()  # [V, H]
    X = final_states(runner, loaded, args.tasks.split(","), args.samples, args.tokens)
    print(f"{X.shape[0]} final-norm states of {args.model}, head {tuple(W.shape)}")
    counts = {
        "int8 weights, float32 activations": screen(X, W, activations=False),
        "int8 weights, int8 activations (dynamic)": screen(X, W, activations=True),
    }
    for name, c in counts.items():
        print(
            f"{name}: candidates per state median {c['median']:g}, p90 {c['p90']:g}, "
            f"p99 {c['p99']:g}, max {c['max']:g} of {W.shape[0]}; "
            f"the exact argmax always among them: {c['argmax_kept']}"
        )
    times = timings(runner, W, X, args.repeats)
    for rows, t in times.items():
        print(
            f"{rows} rows: float32 head {t['float32_ms']:.1f} ms; "
            f"int8 head {t['int8_ms']:.1f} ms + "
            f"32 float32 rows {t['rows_ms']:.2f} ms"
        )
    if args.json:
        blob = {
            "model": args.model,
            "states": int(X.shape[0]),
            "candidates": counts,
            "ms": {str(r): t for r, t in times.items()},
            "layout": runner.weight_layout,
            "machine": {**machine_info(), "threads": args.threads},
            "command": " ".join(
                ["python lab/scripts/head_screen.py", *(argv if argv is not None else sys.argv[1:])]
            ),
        }
        with open(args.json, "w") as f:
            json.dump(blob, f, indent=2)
    return 0


def final_states(
    runner: Runner, loaded, tasks: list[str], samples: int, tokens: int
) -> torch.Tensor:
    """``[N, H]`` final-norm states of the first ``tokens`` tokens of each test prompt."""
    states = []
    with torch.inference_mode():
        for task in tasks:
            for sample in load_task(task, "test", n=samples):
                ids = torch.tensor(format_prompt(loaded, sample.text(loaded.chat)))[:tokens]
                states.append(runner.norm(runner.forward(ids, logits=None).hidden[0]))
    return torch.cat(states).float()


def screen(X: torch.Tensor, W: torch.Tensor, *, activations: bool) -> dict:
    """Candidates per state of the int8 screen (see the module docstring) and whether the exact
    (float64) argmax was always one of them."""
    H = W.shape[1]
    u = 2.0**-24
    gamma = H * u / (1 - H * u)
    scale = W.abs().amax(1) / 127
    Wq = torch.round(W / scale[:, None]).clamp(-127, 127) * scale[:, None]
    wmax, wq_l1 = W.abs().amax(1), Wq.abs().sum(1)
    counts, kept = [], True
    with torch.inference_mode():
        for x in X.split(64):
            l1 = x.abs().sum(1, keepdim=True)
            bound = scale[None] / 2 * l1 + 2 * gamma * l1 * (wmax[None] + scale[None] / 2)
            if activations:
                step = (
                    x.amax(1, keepdim=True).clamp(min=0) - x.amin(1, keepdim=True).clamp(max=0)
                ) / 255
                bound = bound + step / 2 * wq_l1[None]
            approx = x @ Wq.T
            candidate = approx + bound >= (approx - bound).amax(1, keepdim=True)
            counts.append(candidate.sum(1))
            exact = (x.double() @ W.double().T).argmax(1)
            kept &= bool(candidate.gather(1, exact[:, None]).all())
    c = torch.cat(counts).double()
    return {
        "median": float(c.median()),
        "p90": float(c.quantile(0.9)),
        "p99": float(c.quantile(0.99)),
        "max": float(c.max()),
        "argmax_kept": kept,
    }


def timings(runner: Runner, W: torch.Tensor, X: torch.Tensor, repeats: int) -> dict:
    """Median ms of the runner's float32 head, the int8-weights head and 32 float32 rows."""
    head = runner.adapter.lm_head
    int8 = draft_linear("int8-weights", W, None)
    rows = W[:32].clone()
    out = {}
    with torch.inference_mode():
        for n in (1, 8):
            x = X[:n].contiguous()
            t = {"float32_ms": [], "int8_ms": [], "rows_ms": []}
            for _ in range(repeats):
                for key, fn, arg in (
                    ("float32_ms", head, x),
                    ("int8_ms", int8, x),
                    ("rows_ms", lambda a: F.linear(a, rows), x),
                ):
                    t0 = time.perf_counter()
                    fn(arg)
                    t[key].append((time.perf_counter() - t0) * 1e3)
            out[n] = {k: statistics.median(v) for k, v in t.items()}
    return out


if __name__ == "__main__":
    sys.exit(main())
