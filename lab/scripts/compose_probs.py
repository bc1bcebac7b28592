#!/usr/bin/env python3
"""Composed drafts valued by the members' own node probabilities (``Draft.probs``) or by their
depth rates alone (docs/composition.md, "Budget"): each composition decodes both
ways, beside its members and ``vanilla``, interleaved prompt by prompt on one loaded model.

    python lab/scripts/compose_probs.py [--model M] [--tasks humaneval,gsm8k,mtbench,sharegpt]
        [--samples 2] [--max-new-tokens 64] [--methods qspec,selfdraft+qspec] [--json FILE]

The "depth rates" variant is the composer with every member's ``probs`` dropped before the
merge (what the host did before drafts carried them). Prints, per method and task, tokens/s
against ``vanilla``, tau (tokens per full-model forward) and, for compositions, each member's
counters (steps proposed and skipped, nodes verified, tokens accepted); checks every output
against ``vanilla``'s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from collections.abc import Iterator, Sequence

from selfspec import Decoder
from selfspec._engine.contract.composetree import Trie
from selfspec._engine.tuning.machine import machine_info
from selfspec.app._data import load_task
from selfspec.app._models import format_prompt, load

DEPTH_RATES = "[depth rates]"


@contextlib.contextmanager
def depth_rates_only() -> Iterator[None]:
    """The composer merges members' drafts without their ``probs``."""
    real = Trie.add

    def add(self, tokens, parents, owner, probs=None):
        return real(self, tokens, parents, owner, None)

    Trie.add = add
    try:
        yield
    finally:
        Trie.add = real


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="lab/scripts/compose_probs.py", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--model", default=None)
    ap.add_argument("--tasks", default="humaneval,gsm8k,mtbench,sharegpt")
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument(
        "--methods", default="qspec,selfsd,lookup,selfdraft+qspec,lookup+qspec,lookup+selfsd"
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    loaded = load(args.model, dtype="float32")
    tasks = [t.strip() for t in args.tasks.split(",")]
    prompts = [
        (t, format_prompt(loaded, s.text(True)))
        for t in tasks
        for s in load_task(t, "test", n=args.samples)
    ]
    methods = ["vanilla"] + [m.strip() for m in args.methods.split(",")]
    runs = [(m, False) for m in methods] + [(m, True) for m in methods if "+" in m]
    decoders = {
        (m, rates): Decoder(loaded.model, m, tokenizer=loaded.tokenizer) for m, rates in runs
    }
    for d in decoders.values():  # warm-up (the cost curve, the draft weights)
        d.generate(prompts[0][1], 8, eos_token_ids=())
    rows: dict = {
        k: {t: {"s": 0.0, "tokens": 0, "forwards": 0.0, "members": {}} for t in tasks}
        for k in decoders
    }
    outputs: dict = {k: [] for k in decoders}
    for task, ids in prompts:
        for k, d in decoders.items():
            with depth_rates_only() if k[1] else contextlib.nullcontext():
                t0 = time.perf_counter()
                r = d.generate(ids, args.max_new_tokens)
                dt = time.perf_counter() - t0
            row = rows[k][task]
            row["s"] += dt
            row["tokens"] += len(r.output_ids)
            row["forwards"] += r.stats.forwards
            for name, counters in (getattr(r.stats, "members", None) or {}).items():
                mine = row["members"].setdefault(name, {})
                for c, v in counters.items():
                    mine[c] = mine.get(c, 0) + v
            outputs[k].append(r.output_ids)
    m = machine_info()
    print(
        f"{args.model} float32, tasks {','.join(tasks)} x {args.samples} samples, "
        f"{args.max_new_tokens} new tokens, "
        f"{m['cpu']} [{m['cpu_capability']}], {m['torch_threads']} threads"
    )
    base = rows[("vanilla", False)]
    table = []
    for k, per in rows.items():
        label = k[0] + (DEPTH_RATES if k[1] else "")
        speed = {
            t: (per[t]["tokens"] / per[t]["s"]) / (base[t]["tokens"] / base[t]["s"]) for t in tasks
        }
        geo = math.exp(sum(math.log(v) for v in speed.values()) / len(speed))
        tokens = sum(per[t]["tokens"] for t in tasks)
        tau = tokens / max(sum(per[t]["forwards"] for t in tasks), 1e-9)
        same = outputs[k] == outputs[("vanilla", False)]
        table.append(
            {
                "method": label,
                "vs_vanilla": speed,
                "geo_mean": geo,
                "tau": tau,
                "equals_vanilla": same,
                "members": {t: per[t]["members"] for t in tasks},
            }
        )
        cells = "  ".join(f"{t} {speed[t]:.2f}" for t in tasks)
        print(
            f"{label:<34} x vanilla: {cells}  geo {geo:.2f}  tau {tau:.2f}  equals vanilla: {same}"
        )
        totals: dict = {}
        for t in tasks:
            for name, counters in per[t]["members"].items():
                mine = totals.setdefault(name, {})
                for c, v in counters.items():
                    mine[c] = mine.get(c, 0) + v
        for name, c in totals.items():
            print(f"    {name:<12} " + ", ".join(f"{key} {value}" for key, value in c.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": table, "machine": m, "argv": sys.argv}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
