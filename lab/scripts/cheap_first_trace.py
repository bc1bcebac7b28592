#!/usr/bin/env python3
"""What the composer's cheap-first rule saw and what each step then gave, step by step.

    python lab/scripts/cheap_first_trace.py [--model M] [--method lookup+qspec]
        [--tasks gsm8k,mtbench] [--samples 2] [--max-new-tokens 64] [--json FILE]

For every call of the rule (:func:`selfspec._engine.contract.composetree.worth_calling`) it
records the inputs (the draft so far: expected accepted tokens ``covered``, merged nodes, proposing
cost ``spent``; the member's expected gain, mean proposing cost and draft size, in one-token
forwards) and the two ratios the rule compares. For every step it records which members
proposed, the tokens committed and the step's wall time in one-token forwards (propose to
commit). It then prints, per task, the steps where the rule skipped a member beside those where
it called every member (by the members that ran) and those it did not judge: measured tokens
per forward beside the rule's predicted ones. One decoder, one warm-up
decode; outputs are checked against ``vanilla``'s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from selfspec import Decoder
from selfspec._engine.contract import compose as compose_mod
from selfspec._engine.tuning.machine import machine_info
from selfspec.app._data import load_task
from selfspec.app._models import format_prompt, load


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="lab/scripts/cheap_first_trace.py", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--model", default=None)
    ap.add_argument("--method", default="lookup+qspec")
    ap.add_argument("--tasks", default="gsm8k,mtbench")
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    loaded = load(args.model, dtype="float32")
    tasks = [t.strip() for t in args.tasks.split(",")]
    prompts = [
        (t, format_prompt(loaded, s.text(True)))
        for t in tasks
        for s in load_task(t, "test", n=args.samples)
    ]
    calls: list[dict] = []
    steps: list[dict] = []
    real_rule = compose_mod.worth_calling

    def rule(stats, covered, nodes, spent, cost):
        gain, own, size = stats.expected_gain(covered), stats.mean_cost(), stats.mean_size()
        verdict = real_rule(stats, covered, nodes, spent, cost)
        row = {
            "covered": covered,
            "nodes": nodes,
            "spent": spent,
            "gain": gain,
            "own": own,
            "size": size,
            "call": verdict,
        }
        if gain is not None and own is not None:
            row["without"] = (1.0 + covered) / (spent + cost(nodes + 1))
            row["with"] = (1.0 + covered + gain) / (spent + own + cost(nodes + 1 + round(size)))
        calls.append(row)
        return verdict

    compose_mod.worth_calling = rule
    real_update = compose_mod.Composer.selfspec_update_policy
    real_propose = compose_mod.Composer.selfspec_propose

    def propose(self, state):
        self._trace_t0 = time.perf_counter()
        self._trace_calls = len(calls)
        return real_propose(self, state)

    def update(self, state, verdict):
        members = [p.member.name for p in self._step]
        real_update(self, state, verdict)
        seconds = time.perf_counter() - self._trace_t0
        steps.append(
            {
                "task": self._trace_task,
                "members": members,
                "committed": len(verdict.committed),
                "forwards": self.forwards(seconds),
                "rule": calls[self._trace_calls :],
            }
        )

    compose_mod.Composer.selfspec_propose = propose
    compose_mod.Composer.selfspec_update_policy = update
    dec = Decoder(loaded.model, args.method, tokenizer=loaded.tokenizer)
    ref = Decoder(loaded.model, "vanilla", tokenizer=loaded.tokenizer)
    dec.plugin._trace_task = "warm-up"
    dec.generate(prompts[0][1], 8, eos_token_ids=())
    same = True
    for task, ids in prompts:
        dec.plugin._trace_task = task
        out = dec.generate(ids, args.max_new_tokens).output_ids
        same &= out == ref.generate(ids, args.max_new_tokens).output_ids
    size = len(dec.plugin.members)
    m = machine_info()
    print(
        f"{args.method}, {args.model} float32, {m['cpu']} [{m['cpu_capability']}], "
        f"{m['torch_threads']} threads; outputs equal vanilla's: {same}"
    )
    for task in tasks:
        mine = [s for s in steps if s["task"] == task]
        # by what ran (the members that proposed), not by the rule's prediction
        for label, pick in (
            ("a member skipped", lambda s: s["rule"] and len(s["members"]) < size),
            ("judged, all called", lambda s: s["rule"] and len(s["members"]) == size),
            ("not judged", lambda s: not s["rule"]),
        ):
            sel = [s for s in mine if pick(s)]
            if not sel:
                continue
            tok = sum(s["committed"] for s in sel)
            fw = sum(s["forwards"] for s in sel)
            judged = [r for s in sel for r in s["rule"] if "with" in r]
            pred_without = (
                sum(r["without"] for r in judged) / len(judged) if judged else float("nan")
            )
            pred_with = sum(r["with"] for r in judged) / len(judged) if judged else float("nan")
            mean = {
                k: sum(r[k] for r in judged) / len(judged) if judged else float("nan")
                for k in ("covered", "gain", "own", "size", "nodes")
            }
            print(
                f"{task:<10} {label:<20} steps {len(sel):3d}: "
                f"measured {tok / len(sel):.2f} tokens, "
                f"{fw / len(sel):.2f} forwards, {tok / max(fw, 1e-9):.2f} tokens/forward; "
                f"rule predicted "
                f"without {pred_without:.2f}, with {pred_with:.2f} tokens/forward; mean covered "
                f"{mean['covered']:.2f}, gain {mean['gain']:.2f}, own {mean['own']:.2f}, size "
                f"{mean['size']:.1f}, nodes {mean['nodes']:.1f}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"machine": m, "argv": sys.argv, "equals_vanilla": same, "steps": steps},
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
