#!/usr/bin/env python3
"""Where each method's time goes, in units of one ``vanilla`` step, from a bench's records.

For every selfspec method of a ``specdec bench`` directory (its ``results.jsonl``), summed over
all prompts: steps (full-model verifications), τ (tokens per step), drafted tokens per step,
and the measured cost of a draft token and of a verification pass, each relative to one
``vanilla`` step (``vanilla``'s verify time per step in the same run). A method beats
``vanilla`` when τ exceeds its step cost ``r``::

    r = drafted per step × draft-token cost + verify-pass cost + other phases
    speedup over vanilla ≈ τ / r   (prefill excluded; the measured column includes it)

    python lab/scripts/cost_breakdown.py lab/results/qwen2.5-coder-1.5b/bench-zen3-avx2-2026-11-24
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def breakdown(directory: Path) -> list[dict[str, float | str]]:
    recs = [
        json.loads(line)
        for line in (directory / "results.jsonl").read_text().splitlines()
        if line.strip()
    ]
    acc: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in recs:
        if r.get("plugin") is None:  # HF methods have no phases
            continue
        a = acc[r["method"]]
        a["steps"] += r["forwards"]
        a["tokens"] += r["new_tokens"]
        a["drafted"] += r["drafted"] or 0
        a["wall"] += r["wall_time"]
        for k, v in (r.get("phase_s") or {}).items():
            a[k] += v
    if "vanilla" not in acc:
        raise SystemExit(f"{directory}: no vanilla records")
    v = acc["vanilla"]
    step = v["verify"] / v["steps"]  # one vanilla step (a one-token forward + head)
    rows = []
    for name, a in acc.items():
        other = sum(a[k] for k in ("cache", "update")) / a["steps"] / step
        draft_tok = a["propose"] / a["drafted"] / step if a["drafted"] else 0.0
        verify = a["verify"] / a["steps"] / step
        r = (a["propose"] / a["steps"]) / step + verify + other
        tau = a["tokens"] / a["steps"]
        rows.append(
            {
                "method": name,
                "tau": tau,
                "drafted_per_step": a["drafted"] / a["steps"],
                "draft_token_cost": draft_tok,
                "verify_cost": verify,
                "other_cost": other,
                "r": r,
                "model_speedup": tau / r,
                "measured_speedup": (v["wall"] / v["tokens"]) / (a["wall"] / a["tokens"]),
            }
        )
    return rows


def markdown(rows: list[dict[str, float | str]]) -> str:
    lines = [
        "| method | τ | drafted / step | draft token (× vanilla step) | "
        "verify pass (× vanilla step) | "
        "step cost r | τ / r | measured vs vanilla |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for x in rows:
        lines.append(
            f"| {x['method']} | {x['tau']:.2f} | {x['drafted_per_step']:.1f} | "
            f"{x['draft_token_cost']:.2f} | "
            f"{x['verify_cost']:.2f} | {x['r']:.2f} | {x['model_speedup']:.2f}× | "
            f"{x['measured_speedup']:.2f}× |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directory", type=Path)
    args = ap.parse_args()
    print(markdown(breakdown(args.directory)))


if __name__ == "__main__":
    main()
