#!/usr/bin/env python3
"""Cost of one draft token, in vanilla steps, and the agreement it keeps, per draft-weights
backend and draft-vocabulary size (``selfspec.draft_weights``).

For each backend, interleaved with a plain one-token forward of the model (a ``vanilla``
step) in the same loop, so the ratio holds on a shared, noisy machine: the median time of a
one-token draft forward (the model with every layer, and with the ``selfsd`` skip set of this
model) over the median vanilla step. Agreement: teacher-forced over dev-split texts (never a
test prompt), one token at a time over the model's own cache of the prefix (as a draft runs),
the fraction of positions where the draft's argmax equals the model's own.

    python lab/scripts/draft_cost.py --model qwen2.5-coder-1.5b --out lab/results/.../draft-cost
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import selfspec
from selfspec._engine.drafting.draftweights import shadow
from selfspec.app._data import load_task
from selfspec.app._models.load import load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--backends", default="none,int8,int8-weights,bf16")
    ap.add_argument("--vocab", default="0,32768,16384")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--texts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument(
        "--prefix", type=int, default=64, help="tokens of each text before agreement is counted"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    loaded = load(a.model, dtype="float32")
    model, tok = loaded.model, loaded.tokenizer
    runner = selfspec.Runner(model, adopt=True)
    dec = selfspec.Decoder(model, "selfsd", tokenizer=tok)
    skip = {"attn": dec.plugin.skip_attn, "mlp": dec.plugin.skip_mlp}
    del dec
    sizes = [int(s) for s in a.vocab.split(",")]
    vocabs = {s: selfspec.draft_vocab(runner, s, tok) for s in sizes}

    # dev texts for agreement; a dev prompt for timing
    texts = [
        s.prompt + "\n" + (s.meta.get("answer") or "")
        for t in ("humaneval", "gsm8k")
        for s in load_task(t, split="dev")[: a.texts // 2]
    ]
    seqs = [torch.tensor(tok(t, add_special_tokens=False)["input_ids"][: a.tokens]) for t in texts]
    caches = [runner.new_cache(len(ids)) for ids in seqs]
    # [n] each
    refs = [runner.forward(ids, cache=c).logits.argmax(-1) for ids, c in zip(seqs, caches)]
    coverage = {
        s: sum(
            float(torch.isin(r[a.prefix :], v).float().mean()) if v is not None else 1.0
            for r in refs
        )
        / len(refs)
        for s, v in vocabs.items()
    }

    prompt = seqs[0][:128]
    cache = runner.new_cache(256)
    runner.forward(prompt[:-1], cache=cache, start=0, logits=None)
    T = len(prompt) - 1
    pending = prompt[-1:]

    def step(**kw) -> float:
        t0 = time.perf_counter()
        runner.forward(pending, cache=cache, start=T, logits="last", **kw)
        return time.perf_counter() - t0

    rows = []
    for backend in a.backends.split(","):
        t0 = time.perf_counter()
        dws = {s: selfspec.draft_weights(runner, backend, v) for s, v in vocabs.items()}
        build_s = time.perf_counter() - t0
        configs = {
            (s, depth): dict(
                weights=dws[s],
                **(
                    {"skip_attn": skip["attn"], "skip_mlp": skip["mlp"]}
                    if depth == "selfsd"
                    else {}
                ),
            )
            for s in sizes
            for depth in ("full", "selfsd")
        }
        times: dict = {k: [] for k in configs}
        van: list[float] = []
        for _ in range(2):  # warm-up
            step()
            for kw in configs.values():
                step(**kw)
        for _ in range(a.reps):  # interleaved
            van.append(step())
            for k, kw in configs.items():
                times[k].append(step(**kw))
        v = statistics.median(van)
        # agreement, teacher-forced one token at a time as a draft runs: the prefix in the
        # model's own cache, each position a read-only one-token forward with the draft weights
        for depth in ("full", "selfsd"):
            kw = {"skip_attn": skip["attn"], "skip_mlp": skip["mlp"]} if depth == "selfsd" else {}
            agree = {s: 0.0 for s in sizes}
            n = 0
            for ids, ref, c in zip(seqs, refs, caches):
                for t in range(a.prefix, len(ids)):
                    h = runner.forward(
                        ids[t : t + 1],
                        cache=c,
                        start=t,
                        write=False,
                        logits=None,
                        weights=dws[sizes[0]],
                        **kw,
                    ).hidden[0]
                    for s in sizes:
                        agree[s] += float(dws[s].head(runner, h).argmax(-1)[0] == ref[t])
                    n += 1
            for s in sizes:
                rows.append(
                    {
                        "backend": dws[s].backend,
                        "vocab": s or runner.vocab_size,
                        "depth": depth,
                        "cost_vs_vanilla": statistics.median(times[(s, depth)]) / v,
                        "agreement": agree[s] / n,
                        "ref_in_vocab": coverage[s],
                        "draft_weights_gb": dws[s].nbytes / 1e9,
                        "vanilla_ms": v * 1e3,
                        "build_s": build_s,
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
        del dws, configs
        shadow._LAYERS.pop(model, None)  # free this backend's copies before the next
        shadow._HEADS.pop(model, None)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    info = {
        "model": a.model,
        "skip": {k: list(v) for k, v in skip.items()},
        "machine": _machine(),
        "texts": len(seqs),
        "tokens_per_text": a.tokens,
        "prefix": a.prefix,
        "reps": a.reps,
    }
    (out / "draft_cost.json").write_text(json.dumps({"info": info, "rows": rows}, indent=1))
    lines = [
        f"Model {a.model}, float32; "
        f"{info['machine']['cpu']} [{info['machine']['cpu_capability']}], "
        f"{a.threads} threads; shared machine: ratios interleaved in one loop.",
        "",
        f"selfsd skip set: attention {selfspec.format_layers(skip['attn'])}, "
        f"MLP {selfspec.format_layers(skip['mlp'])}",
        "",
        "| draft weights | vocab | layers | one draft token (vanilla steps) | draft token ms | "
        "vanilla step ms | agreement | model's token in vocab | draft weights GB |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    # the ms beside the ratio: a compute-bound draft's ratio moves with the memory's speed
    for r in rows:
        lines.append(
            f"| {r['backend']} | {r['vocab']} | {r['depth']} | {r['cost_vs_vanilla']:.2f} | "
            f"{r['cost_vs_vanilla'] * r['vanilla_ms']:.1f} | {r['vanilla_ms']:.1f} | "
            f"{r['agreement']:.3f} | {r['ref_in_vocab']:.3f} | {r['draft_weights_gb']:.2f} |"
        )
    (out / "draft_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _machine() -> dict:
    from selfspec._engine.tuning.machine import machine_info

    return machine_info()


if __name__ == "__main__":
    main()
