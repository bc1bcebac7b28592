"""The demo's main job: decode one prompt with `vanilla` and with a speculative method on the
same model, and print both speeds, the method's tokens per step (tau) and whether the two
outputs are identical (they must be: the method is lossless).

    python scripts/compare.py [--plugin qspec] [--max-new-tokens 96] [--model M] "prompt"
"""

from __future__ import annotations

import argparse
import sys

from selfspec import Decoder
from selfspec.app import format_prompt, load_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "prompt",
        nargs="?",
        default="Write a Python function that returns the n-th Fibonacci number.",
    )
    ap.add_argument(
        "--plugin", default="qspec", help="the speculative method to show beside vanilla"
    )
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument(
        "--model", default=None, help="as specdec --model (default: the embedded default model)"
    )
    args = ap.parse_args()
    loaded = load_model(args.model)
    ids = format_prompt(loaded, args.prompt)
    eos = getattr(loaded, "eos_token_ids", None)
    results = {}
    for plugin in ("vanilla", args.plugin):
        # first use measures this machine once
        decoder = Decoder(loaded.model, plugin, tokenizer=loaded.tokenizer)
        # warm-up: the timed decode below pays no first-call cost
        decoder.generate(ids, 8, eos_token_ids=eos)
        results[plugin] = decoder.generate(ids, args.max_new_tokens, eos_token_ids=eos)
    base, spec = results["vanilla"], results[args.plugin]
    rate = {p: r.stats.new_tokens / max(r.stats.wall_time_s, 1e-9) for p, r in results.items()}
    tau = spec.stats.new_tokens / max(spec.stats.steps, 1)
    same = base.output_ids == spec.output_ids
    print(loaded.tokenizer.decode(spec.output_ids, skip_special_tokens=True).strip())
    print()
    print(
        f"vanilla          {rate['vanilla']:7.1f} tokens/s  "
        f"({base.stats.new_tokens} tokens, one forward each)"
    )
    print(
        f"{args.plugin:16} {rate[args.plugin]:7.1f} tokens/s  tau {tau:.2f} tokens per step, "
        f"{rate[args.plugin] / rate['vanilla']:.2f}x vanilla"
    )
    # float32 rounding can flip a near-tie between a one-row and a block forward; `specdec check`
    # tells a near-tie from a divergence (docs/losslessness.md)
    print(
        f"identical output: "
        f"{'yes' if same else 'no (run specdec check --plugin ' + args.plugin + ')'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
