#!/usr/bin/env python3
"""Exact mode's cost and agreement (docs/losslessness.md): each method in today's mode and in
exact mode, interleaved prompt by prompt on one loaded model.

    python lab/scripts/exact_cost.py [--model M] [--dtype float32] [--plugins vanilla,selfsd]
        [--prompts 2] [--max-new-tokens 32] [--repeats 1] [--json FILE]

Prints tokens/s and tau (tokens per full-model forward) per method and mode, the exact/default
speed ratio, whether every plugin's exact-mode output equals ``vanilla``'s in exact mode, and
how often exact ``vanilla`` differs from HF ``generate`` (a rounding difference between two
programs, not a speculation error).

With ``--repeats R`` every prompt runs R times in each mode, the two modes back to back with
the first of them alternating between repeats (so a slow spell of a shared machine falls on
both); the ratio is over all repeats' time, and each repeat's own ratio is printed beside it,
as the spread to read it against.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from selfspec import Decoder
from selfspec._engine.contract.reference import reference_generate
from selfspec._engine.tuning.machine import machine_info
from selfspec.app._bench.vanilla import SMOKE_PROMPTS
from selfspec.app._models import format_prompt, load


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="lab/scripts/exact_cost.py", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--plugins", default="vanilla,selfsd")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    loaded = load(args.model, dtype=args.dtype)
    prompts = [format_prompt(loaded, t) for t in SMOKE_PROMPTS[: args.prompts]]
    names = [p.strip() for p in args.plugins.split(",")]
    decoders = {
        (n, exact): Decoder(loaded.model, n, tokenizer=loaded.tokenizer, exact=exact)
        for n in names
        for exact in (False, True)
    }
    for d in decoders.values():  # warm-up
        d.generate(prompts[0], 8, eos_token_ids=())
    times = {k: 0.0 for k in decoders}
    tokens = {k: 0 for k in decoders}
    outputs: dict = {k: [] for k in decoders}
    forwards = {k: 0.0 for k in decoders}
    per_repeat: dict = {k: [0.0] * args.repeats for k in decoders}
    for rep in range(args.repeats):
        for ids in prompts:
            for n in names:
                for exact in (False, True) if rep % 2 == 0 else (True, False):
                    k = (n, exact)
                    t0 = time.perf_counter()
                    r = decoders[k].generate(ids, args.max_new_tokens, eos_token_ids=())
                    dt = time.perf_counter() - t0
                    times[k] += dt
                    per_repeat[k][rep] += dt
                    tokens[k] += len(r.output_ids)
                    forwards[k] += r.stats.forwards
                    outputs[k].append(r.output_ids)  # (repeat, prompt) order
    hf = [reference_generate(loaded.model, ids, args.max_new_tokens) for ids in prompts]
    rows = []
    for n, exact in decoders:
        rows.append(
            {
                "method": n,
                "exact": exact,
                "tokens_per_s": tokens[(n, exact)] / times[(n, exact)],
                "tau": tokens[(n, exact)] / forwards[(n, exact)] if forwards[(n, exact)] else None,
                "vs_default": (times[(n, False)] / times[(n, True)]) if exact else 1.0,
                "vs_default_by_repeat": [
                    a / b for a, b in zip(per_repeat[(n, False)], per_repeat[(n, True)])
                ]
                if exact
                else None,
                "equals_vanilla_exact": outputs[(n, True)] == outputs[("vanilla", True)]
                if exact
                else None,
            }
        )
    differs = sum(a != b for a, b in zip(outputs[("vanilla", True)][: len(prompts)], hf))
    m = machine_info()
    print(
        f"{args.model} {args.dtype}, {len(prompts)} prompts x {args.max_new_tokens} tokens "
        f"x {args.repeats} repeats, "
        f"{m['cpu']} "
        f"[{m['cpu_capability']}], {m['torch_threads']} threads"
    )
    for r in rows:
        eq = (
            ""
            if r["equals_vanilla_exact"] is None
            else f"  equals vanilla --exact: {r['equals_vanilla_exact']}"
        )
        tau = "" if r["tau"] is None else f"  tau {r['tau']:.2f}"
        spread = ""
        if r["vs_default_by_repeat"] and len(r["vs_default_by_repeat"]) > 1:
            spread = " (repeats " + ", ".join(f"{x:.2f}" for x in r["vs_default_by_repeat"]) + ")"
        print(
            f"{r['method']:<10} {'exact' if r['exact'] else 'default':<8} "
            f"{r['tokens_per_s']:7.2f} tok/s{tau}  "
            f"exact/default speed {r['vs_default']:.2f}{spread}{eq}"
        )
    print(f"vanilla --exact differs from HF generate on {differs} of {len(prompts)} prompts")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"rows": rows, "hf_differs": differs, "machine": m, "argv": sys.argv}, f, indent=1
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
