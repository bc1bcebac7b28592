"""Which compression serves on this CPU: per-layer cost of each backend for 1 and w+1 rows
against the runner's oneDNN-packed float32 layer, the compressed model's argmax agreement
with the original on real dev text (teacher-forced), and the memory the copy adds.

Run: python lab/scripts/fractal_compression.py >
lab/results/smollm2-135m-instruct/fractal-compression-zen4-avx512-2026-11-24/compression.md
"""

import time

import torch
from selfspec_fractal import compress

from selfspec import Decoder
from selfspec.app import format_prompt, load_model, load_task

torch.set_num_threads(1)
loaded = load_model()
model = loaded.model
van = Decoder(model, "vanilla", tokenizer=loaded.tokenizer)
runner = van.runner
BACKENDS = ["none", "dynamic-int8", "int8-weight-only"]
cms = {b: compress.build(runner, b) for b in BACKENDS}


def timed(f, reps):
    f()
    t0 = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - t0) / reps * 1e3


# 1) cost: one decoder layer (attention + MLP) and the LM head, interleaved, median of rounds
rows = {}
with torch.inference_mode():
    for q in (1, 8):
        h = torch.randn(1, q, runner.hidden_size)
        for _round in range(3):
            for b in BACKENDS:
                subs = cms[b].layers or None
                reps = 2 if b == "int8-weight-only" else 10
                layer_ms = (
                    timed(
                        lambda h=h, subs=subs: runner.forward(
                            hidden=h, layers=(10, 20), logits=None, substitutes=subs
                        ),
                        reps,
                    )
                    / 10
                )
                head_ms = timed(lambda h=h, cm=cms[b]: compress.head(cm, runner, h[0]), reps)
                rows.setdefault((b, q), []).append((layer_ms, head_ms))

# 2) accuracy: teacher-forced argmax agreement with the original model on real dev text
agree = {b: [0, 0] for b in BACKENDS}
with torch.inference_mode():
    for task in ("humaneval", "gsm8k", "mtbench", "sharegpt"):
        for s in load_task(task, split="dev", n=1):
            ids = format_prompt(loaded, s.prompt)
            out = van.generate(ids, 48).output_ids
            seq = torch.tensor(ids + out)
            ref = runner.forward(seq).logits.argmax(-1)
            for b in BACKENDS[1:]:
                if b == "int8-weight-only" and task != "humaneval":
                    continue  # its CPU kernel is ~50x slower than dynamic-int8: one task only
                cm = cms[b]
                hid = runner.forward(
                    hidden=compress.embed(cm, runner, seq), logits=None, substitutes=cm.layers
                ).hidden
                pred = compress.head(cm, runner, hid[0]).argmax(-1)
                agree[b][0] += int((pred == ref).sum())
                agree[b][1] += len(seq)

fp32 = sum(p.numel() * p.element_size() for p in model.parameters())
print("| backend | rows | one layer (ms) | LM head (ms) | argmax agreement | memory added |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for (b, q), vals in rows.items():
    layer = sorted(v[0] for v in vals)[1]
    head = sorted(v[1] for v in vals)[1]
    a = agree.get(b, [1, 1])
    ag = "1 (itself)" if b == "none" else f"{a[0] / a[1]:.3f}"
    mem = (
        "0"
        if b == "none"
        else f"{cms[b].nbytes / 1e6:.0f} MB ({cms[b].nbytes / fp32:.0%} of the fp32 model)"
    )
    name = "none (packed fp32, the runner's own)" if b == "none" else b
    print(f"| {name} | {q} | {layer:.2f} | {head:.2f} | {ag} | {mem} |")
