#!/usr/bin/env python3
"""The agreement gate of ``draft_weights=auto`` on a real model: what it measures, what it
costs the first time, and how much its agreements move with the text.

    python lab/scripts/agreement_gate.py [--model qwen2.5-coder-1.5b] [--seeds 0,1,2] [--threads 2]
        [--json FILE]

Loads the model in float32 on the runner ``specdec`` builds (``auto`` layout, adopted), takes
``auto``'s timed draft-weights choice (cached or measured now), and runs the gate as a first use
does, against an empty store: the seconds it takes (building the copies, the model's own text,
the forwards) and the process's peak resident memory before and after it. Then, for each of
``--seeds`` (the text's sampling seed), the two copies' agreement and the rule's rates with
today's timings, so the verdict's margin can be read against the text's noise.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time

import torch

import selfspec
from selfspec._engine.drafting.draftweights import agreement, shadow
from selfspec._engine.tuning.artefacts import ArtefactStore
from selfspec.app._models.load import load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = load(a.model, dtype="float32").model
    runner = selfspec.Runner(model, adopt=True)
    choice = shadow.measured_backend(runner)  # the timed choice (and today's gate, cached or not)
    timed = runner.choices["draft_weights"]
    gated = min(
        (c for c in timed.seconds if agreement.gated(c)),
        default=None,
        key=lambda c: sum(timed.seconds[c].values()),
    )
    if gated is None:
        sys.exit(f"no 4-bit copy was timed here ({', '.join(timed.seconds)}): the gate never runs")
    fallback, draft_s, verify_s = agreement.gate_terms(timed.seconds)
    print(f"auto runs {choice}: {timed.note()}", flush=True)

    shadow._LAYERS.pop(model, None)  # a first use: no copy built yet
    shadow._HEADS.pop(model, None)
    rss0 = _peak_gb()
    agreement._MEMO.clear()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        first = agreement.gate(
            runner,
            gated,
            fallback,
            draft_s,
            verify_s,
            measure=shadow.agreement_measure(runner),
            store=ArtefactStore("calibration", root=tmp),
        )
    spent = time.perf_counter() - t0
    rss1 = _peak_gb()
    print(
        f"first use: {spent:.1f} s, peak RSS {rss0:.2f} -> {rss1:.2f} GB; {first.note()}",
        flush=True,
    )

    rows = []
    for seed in (int(s) for s in a.seeds.split(",")):
        agreement.SEED = seed
        t0 = time.perf_counter()
        agree = shadow.agreement_measure(runner)(runner, (gated, fallback))
        rates = {b: agreement.rate(agree[b], draft_s[b], verify_s) for b in agree}
        rows.append(
            {
                "seed": seed,
                "agreement": agree,
                "rate": rates,
                "admitted": rates[gated] >= rates[fallback],
                "seconds": time.perf_counter() - t0,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    out = {
        "model": a.model,
        "machine": _machine(),
        "gated": gated,
        "fallback": fallback,
        "timed": timed.as_dict(),
        "draft_s": draft_s,
        "verify_s": verify_s,
        "first_use_s": spent,
        "peak_rss_gb_before": rss0,
        "peak_rss_gb_after": rss1,
        "first": {"agreement": first.agreement, "rate": first.rate, "admitted": first.admitted},
        "seeds": rows,
        "positions": agreement.POSITIONS,
        "tokens": agreement.TOKENS,
    }
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)


def _peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def _machine() -> dict:
    from selfspec._engine.tuning.machine import machine_info

    return machine_info()


if __name__ == "__main__":
    main()
