#!/usr/bin/env python3
"""A one-token product as 1 row or as 4 rows, in the packed layout (docs/performance.md,
"Measured choices"): ``vanilla`` decodes with each width, interleaved prompt by prompt on one
loaded model, beside what the runner's calibration measured and chose.

    python lab/scripts/one_row_width.py [--model M] [--prompts 4] [--max-new-tokens 32]
        [--repeats 2] [--json FILE]

Prints tokens/s per width, the ratio, whether the outputs agree, and the calibration's choice.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from selfspec import Decoder
from selfspec._engine.runner.layout import set_one_row_width
from selfspec._engine.tuning.machine import machine_info
from selfspec.app._bench.vanilla import SMOKE_PROMPTS
from selfspec.app._models import format_prompt, load

WIDTHS = (1, 4)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="lab/scripts/one_row_width.py", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    loaded = load(args.model, dtype="float32")
    dec = Decoder(loaded.model, "vanilla", tokenizer=loaded.tokenizer, weight_layout="packed")
    runner = dec.runner
    chosen = runner.choices.get("one_row_width")
    products = [*runner._run_layers, runner.adapter.lm_head]
    prompts = [format_prompt(loaded, t) for t in SMOKE_PROMPTS[: args.prompts]]
    times = dict.fromkeys(WIDTHS, 0.0)
    tokens = dict.fromkeys(WIDTHS, 0)
    outputs: dict[int, list[list[int]]] = {w: [] for w in WIDTHS}
    for w in WIDTHS:  # warm-up
        set_one_row_width(products, w)
        dec.generate(prompts[0], 8, eos_token_ids=())
    for r in range(args.repeats):
        for p, ids in enumerate(prompts):
            order = WIDTHS if (r + p) % 2 == 0 else WIDTHS[::-1]  # who goes first alternates
            for w in order:
                set_one_row_width(products, w)
                t0 = time.perf_counter()
                out = dec.generate(ids, args.max_new_tokens, eos_token_ids=())
                times[w] += time.perf_counter() - t0
                tokens[w] += len(out.output_ids)
                if r == 0:
                    outputs[w].append(out.output_ids)
    if chosen is not None:
        set_one_row_width(products, int(chosen.chosen))
    m = machine_info()
    rate = {w: tokens[w] / times[w] for w in WIDTHS}
    same = sum(a == b for a, b in zip(outputs[1], outputs[4]))
    print(
        f"{args.model} float32, packed, {len(prompts)} prompts x {args.max_new_tokens} tokens "
        f"x {args.repeats} "
        f"repeats, {m['cpu']} [{m['cpu_capability']}], {m['torch_threads']} threads"
    )
    for w in WIDTHS:
        print(f"one-token products as {w} row{'s' if w > 1 else ''}: {rate[w]:.2f} tok/s")
    print(
        f"4 rows / 1 row: {rate[4] / rate[1]:.3f}; "
        f"outputs equal on {same} of {len(prompts)} prompts"
    )
    print(f"calibration: {chosen.note() if chosen is not None else 'not measured'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "tokens_per_s": {str(w): rate[w] for w in WIDTHS},
                    "equal_outputs": same,
                    "prompts": len(prompts),
                    "choice": chosen.as_dict() if chosen else None,
                    "machine": m,
                    "argv": sys.argv,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
