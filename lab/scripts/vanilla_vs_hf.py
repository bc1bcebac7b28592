#!/usr/bin/env python3
"""Time the host loop with ``vanilla`` against Hugging Face ``generate`` (docs/performance.md).

    python lab/scripts/vanilla_vs_hf.py [--model PATH] [--prompts N] [--max-new-tokens N]
        [--threads 2] [--repeats R] [--layouts model,transposed,packed] [--eos] [--json FILE]

The measurement is :func:`selfspec.app._bench.vanilla.run` (its docstring says how it times); this
script loads the model with :func:`selfspec.app._models.load`, encodes the smoke prompts with
:func:`selfspec.app._models.format_prompt`, prints the table and the load average, and exits 1 when
any host output differs from HF's. Both decode exactly ``--max-new-tokens`` tokens unless
``--eos`` (then both stop at the model's EOS ids, :func:`selfspec.app._models.eos_token_ids`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

import torch

from selfspec._engine.tuning.machine import machine_info
from selfspec.app._bench.vanilla import SMOKE_PROMPTS, format_table, prompt_ids, run, usable_layouts
from selfspec.app._models import load


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="lab/scripts/vanilla_vs_hf.py", description=__doc__.splitlines()[0]
    )
    ap.add_argument(
        "--model",
        default=None,
        help="a model directory, .gguf file or alias (default: the embedded SmolLM2-135M-Instruct)",
    )
    ap.add_argument(
        "--prompts", type=int, default=4, help=f"how many smoke prompts (max {len(SMOKE_PROMPTS)})"
    )
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument(
        "--threads", type=int, default=2, help="torch CPU threads (default: %(default)s)"
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"]
    )
    ap.add_argument(
        "--layouts",
        help="comma-separated runner weight layouts (default: every one the dtype allows)",
    )
    ap.add_argument(
        "--eos",
        action="store_true",
        help="stop at the model's EOS tokens (default: always decode N)",
    )
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    loaded = load(args.model, dtype=args.dtype)
    load_s = time.perf_counter() - t0
    model = loaded.model
    prompts = prompt_ids(loaded, args.prompts, int(model.config.vocab_size))
    eos = sorted(loaded.eos_token_ids) if args.eos else []
    load_before = _load_average()
    layouts = args.layouts.split(",") if args.layouts else usable_layouts(model)
    res = run(model, prompts, args.max_new_tokens, args.repeats, eos, layouts)
    res.update(
        model=args.model,
        dtype=args.dtype,
        max_new_tokens=args.max_new_tokens,
        repeats=args.repeats,
        smoke_prompts=True,
        load_s=load_s,
        load_average_before=load_before,
        load_average_after=_load_average(),
        machine={**machine_info(), "threads": args.threads},
        command=" ".join(
            ["python lab/scripts/vanilla_vs_hf.py", *(argv if argv is not None else sys.argv[1:])]
        ),
    )
    m = res["machine"]
    print(
        f"model {args.model} ({args.dtype}), {len(prompts)} smoke prompts, "
        f"{args.max_new_tokens} new tokens, "
        f"{args.repeats} repeats, {m['threads']} threads on {m['cpu']} [{m['cpu_capability']}] "
        f"({m['cores']} cores), "
        f"torch {m['torch']}, transformers {m['transformers']}"
    )
    print(format_table(res))
    print(f"load average before/after: {res['load_average_before']} / {res['load_average_after']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0 if res["all_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
