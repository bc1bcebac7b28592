"""Logit error of a verifying block forward against one-token decoding (issue 29's measurement).

For real prompts of the bench's tasks (test split), per dtype, weight layout and block width:
the reference decodes greedily one token at a time with the model's own weights (layout
``model``: bitwise the model's own forward, i.e. what ``model.generate`` computes), keeping the
logits of every position. The runner in layout ``L`` then prefills the prompt but its last
token and verifies the same continuation in consecutive blocks of ``w`` tokens (``[pending,
d_1 .. d_{w-1}]``, as a fully accepted draft is verified), and the logits of the same positions
are compared. Per position it records:

* ``max_abs``: ``max_v |logit_block[v] - logit_ref[v]|``;
* ``margin_err``: how much the block moves the reference's top-1/top-2 margin, ``|(l1 - l2)_ref
  - (l1 - l2)_block|`` at the reference's top-1 and top-2 tokens: a token can flip only where
  the reference's margin is at most this;
* ``top1``: the reference's top-1 logit, ``scale``: ``max_v |logit_ref[v]|``, and ``ulp``: the
  spacing of the dtype's numbers at ``scale`` (errors are also given in those ulps);
* ``flip``: whether the block's argmax differs from the reference's, and the margin there.

``--head fp32`` computes the final norm and the LM head in float32 (a float32 copy of the head)
for both the reference and the block, to see how much of the error the head's rounding is.
``--rowwise`` (an experiment towards a batch-invariant verifier) makes every ``nn.Linear`` of
every forward (the reference's prefill and steps too) compute its rows one at a time (``w``
single-row products instead of one ``w``-row product), and also times a block of each width
both ways, interleaved.

    python lab/scripts/logit_error.py --dtypes float32,bf16,fp16 --layouts model,packed \\
        --widths 1,2,4,8,16,32 --samples 2 --tokens 32 \\
        --out results/<model>/logit-error-<cpu>-<date>

Writes ``records.jsonl`` (one line per position) and ``summary.md`` / ``summary.json``
(percentiles per dtype, layout and width). A dev measurement; the figures are in
``docs/losslessness.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from selfspec._engine.runner import Runner
from selfspec._engine.runner import layout as L
from selfspec.app import _data as data
from selfspec.app import _models as models

MANTISSA = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10, torch.float64: 52}


def ulp(x: float, dtype: torch.dtype) -> float:
    """Spacing of ``dtype``'s numbers at magnitude ``x`` (normal range)."""
    if x <= 0:
        return 0.0
    return 2.0 ** (math.floor(math.log2(x)) - MANTISSA[dtype])


def fp32_head(runner: Runner) -> torch.nn.Module:
    """The LM head as a float32 ``nn.Linear`` (norm applied by the caller in float32)."""
    w = runner.lm_head.weight.detach().to(torch.float32)
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    lin.weight = torch.nn.Parameter(w, requires_grad=False)
    return lin


def logits_of(
    runner: Runner, out_hidden: torch.Tensor, head32: torch.nn.Module | None
) -> torch.Tensor:
    """``[q, H]`` final hidden -> ``[q, V]`` float32 logits (the runner's head or a float32 one)."""
    if head32 is None:
        return runner.head(out_hidden).to(torch.float32)
    h = runner.norm(out_hidden).to(torch.float32)
    return runner.softcap(head32(h))


@torch.inference_mode()
def reference(runner: Runner, prompt: list[int], n: int, head32) -> tuple[list[int], torch.Tensor]:
    """Greedy one-token decoding: ``n`` new tokens and the logits ``[n, V]`` that chose them."""
    cache = runner.new_cache(len(prompt) + n + 1)
    out = runner.forward(torch.tensor(prompt), cache=cache, start=0, logits=None)
    rows = [logits_of(runner, out.hidden[0, -1:], head32)[0]]
    toks = [int(rows[-1].argmax())]
    for _ in range(n - 1):
        out = runner.forward(torch.tensor(toks[-1:]), cache=cache, logits=None)
        rows.append(logits_of(runner, out.hidden[0, -1:], head32)[0])
        toks.append(int(rows[-1].argmax()))
    return toks, torch.stack(rows)


@torch.inference_mode()
def blocks(runner: Runner, prompt: list[int], cont: list[int], w: int, head32) -> torch.Tensor:
    """Logits ``[n, V]`` of the same positions, verified in consecutive blocks of ``w``."""
    n = len(cont)
    seq = prompt + cont
    cache = runner.new_cache(len(seq) + w + 1)
    runner.forward(torch.tensor(prompt[:-1]), cache=cache, start=0, logits=None)
    rows = []
    pos = len(prompt) - 1  # the pending token's slot
    while len(rows) < n:
        ids = seq[pos : pos + min(w, n - len(rows))]
        out = runner.forward(torch.tensor(ids), cache=cache, start=pos, logits=None)
        rows.extend(logits_of(runner, out.hidden[0], head32))
        pos += len(ids)
    return torch.stack(rows[:n])


class rowwise:
    """While active, ``nn.Linear`` computes a ``[.., q, in]`` input row by row (each row as a
    one-token forward computes it): the products no longer depend on the block width."""

    def __enter__(self) -> None:
        self.forward = torch.nn.Linear.forward

        def fwd(mod: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
            flat = x.reshape(-1, x.shape[-1])
            rows = [
                torch.nn.functional.linear(flat[i : i + 1], mod.weight, mod.bias)
                for i in range(flat.shape[0])
            ]
            return torch.cat(rows).reshape(*x.shape[:-1], -1)

        torch.nn.Linear.forward = fwd

    def __exit__(self, *exc: object) -> None:
        torch.nn.Linear.forward = self.forward


def runner_for(model: torch.nn.Module, layout: str) -> Runner:
    L._COPIES.pop(model, None)  # its own copies
    return Runner(model, weight_layout=layout)


def measure(
    args: argparse.Namespace,
    dtype_name: str,
    prompts: list[tuple[str, list[int]]],
    loaded,
    out: list[dict],
) -> None:
    model = loaded.model
    dtype = loaded.dtype
    ref_runner = runner_for(model, "model")
    head32 = fp32_head(ref_runner) if args.head == "fp32" else None
    runners = {}
    for lay in args.layouts.split(","):
        try:
            runners[lay] = ref_runner if lay == "model" else runner_for(model, lay)
        except L.WeightLayoutError as exc:
            print(f"skip {dtype_name}/{lay}: {exc}")
    widths = [int(w) for w in args.widths.split(",")]
    for task, prompt in prompts:
        t0 = time.perf_counter()
        cont, ref = reference(ref_runner, prompt, args.tokens, head32)
        for runner in runners.values():
            for w in widths:
                got = blocks(runner, prompt, cont, w, head32)
                for i in range(len(cont)):
                    r, g = ref[i], got[i]
                    top = torch.topk(r, 2)
                    t1, t2 = int(top.indices[0]), int(top.indices[1])
                    scale = float(r.abs().max())
                    u = ulp(scale, dtype)
                    margin_ref = float(r[t1] - r[t2])
                    margin_got = float(g[t1] - g[t2])
                    max_abs = float((g - r).abs().max())
                    flip = int(g.argmax()) != t1
                    out.append(
                        {
                            "dtype": dtype_name,
                            "layout": runner.weight_layout + ("+rowwise" if args.rowwise else ""),
                            "width": w,
                            "task": task,
                            "pos": i,
                            "top1": float(top.values[0]),
                            "scale": scale,
                            "ulp": u,
                            "max_abs": max_abs,
                            "margin_err": abs(margin_ref - margin_got),
                            "margin": margin_ref,
                            "flip": flip,
                            "head": args.head,
                        }
                    )
        print(
            f"{dtype_name} {task}: {len(prompt)}-token prompt, {time.perf_counter() - t0:.1f} s",
            flush=True,
        )


@torch.inference_mode()
def time_rowwise(
    loaded, prompt: list[int], widths: list[int], out_dir: Path, dtype_name: str, reps: int = 5
) -> None:
    """Median time of a block forward of each width, plain and row-wise, interleaved."""
    runner = runner_for(loaded.model, "model")
    cache = runner.new_cache(len(prompt) + max(widths) + 1)
    runner.forward(torch.tensor(prompt[:-1]), cache=cache, start=0, logits=None)
    base = len(prompt) - 1
    times: dict[tuple[int, str], list[float]] = {}
    for _ in range(reps):
        for w in widths:
            ids = torch.tensor((prompt * 2)[base : base + w])
            for mode in ("plain", "rowwise"):
                t0 = time.perf_counter()
                if mode == "rowwise":
                    with rowwise():
                        runner.forward(ids, cache=cache, start=base)
                else:
                    runner.forward(ids, cache=cache, start=base)
                times.setdefault((w, mode), []).append(time.perf_counter() - t0)
    lines = [
        "| width | plain ms | row-wise ms | row-wise / plain |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for w in widths:
        a, b = sorted(times[(w, "plain")])[reps // 2], sorted(times[(w, "rowwise")])[reps // 2]
        lines.append(f"| {w} | {a * 1000:.1f} | {b * 1000:.1f} | {b / a:.2f}x |")
    (out_dir / f"rowwise-time-{dtype_name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


@torch.inference_mode()
def time_head(loaded, prompt: list[int], out_dir: Path, dtype_name: str, steps: int = 48) -> None:
    """One-token decode steps with the model's head against a float32 head, interleaved step by
    step (the same cache, the same tokens): the cost of float32 logits."""
    runner = runner_for(loaded.model, "auto")
    head32 = fp32_head(runner)
    cache = runner.new_cache(len(prompt) + steps + 2)
    runner.forward(torch.tensor(prompt), cache=cache, start=0, logits=None)
    pos = len(prompt)
    times: dict[str, list[float]] = {"model head": [], "float32 head": []}
    for i in range(steps):
        for mode in ("model head", "float32 head") if i % 2 else ("float32 head", "model head"):
            t0 = time.perf_counter()
            out = runner.forward(
                torch.tensor(prompt[i % len(prompt) : i % len(prompt) + 1]),
                cache=cache,
                start=pos,
                logits=None,
            )
            logits_of(runner, out.hidden[0], head32 if mode == "float32 head" else None)
            times[mode].append(time.perf_counter() - t0)
        pos += 1
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    text = (
        f"one-token step, {runner.weight_layout} layout, {dtype_name}, "
        f"median of {steps} interleaved: "
        f"model head {med['model head'] * 1000:.1f} ms, "
        f"float32 head {med['float32 head'] * 1000:.1f} ms "
        f"({med['float32 head'] / med['model head']:.2f}x)\n"
    )
    (out_dir / f"head-time-{dtype_name}.md").write_text(text)
    print(text)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def summarize(records: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["dtype"], r["layout"], r["width"], r["head"]), []).append(r)
    rows = []
    for (dt, lay, w, head), rs in groups.items():
        me = [r["margin_err"] for r in rs]
        me_u = [r["margin_err"] / r["ulp"] for r in rs]
        ma_u = [r["max_abs"] / r["ulp"] for r in rs]
        flips = [r for r in rs if r["flip"]]
        rows.append(
            {
                "dtype": dt,
                "layout": lay,
                "width": w,
                "head": head,
                "n": len(rs),
                "scale_median": pct([r["scale"] for r in rs], 0.5),
                "ulp_median": pct([r["ulp"] for r in rs], 0.5),
                "max_abs_p50": pct([r["max_abs"] for r in rs], 0.5),
                "max_abs_max": max(r["max_abs"] for r in rs),
                "margin_err_p50": pct(me, 0.5),
                "margin_err_p99": pct(me, 0.99),
                "margin_err_max": max(me),
                "margin_err_ulp_p99": pct(me_u, 0.99),
                "margin_err_ulp_max": max(me_u),
                "max_abs_ulp_max": max(ma_u),
                "flips": len(flips),
                "flip_margins": [round(r["margin"], 6) for r in flips],
            }
        )
    rows.sort(key=lambda r: (r["head"], r["dtype"], r["layout"], r["width"]))
    return rows


def write_summary(rows: list[dict], path: Path, command: str) -> None:
    lines = [
        f"Command: `{command}`",
        "",
        "| head | dtype | layout | width | n | median max abs(logit) | ulp there | max abs err p50 "
        "| max abs err max "
        "| margin err p50 | margin err p99 | margin err max | margin err max (ulp) "
        "| max abs err max (ulp) "
        "| argmax flips (ref margin) |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['head']} | {r['dtype']} | {r['layout']} | {r['width']} | {r['n']} | "
            f"{r['scale_median']:.3g} | "
            f"{r['ulp_median']:.3g} | {r['max_abs_p50']:.3g} | {r['max_abs_max']:.3g} | "
            f"{r['margin_err_p50']:.3g} | "
            f"{r['margin_err_p99']:.3g} | {r['margin_err_max']:.3g} | "
            f"{r['margin_err_ulp_max']:.2f} | "
            f"{r['max_abs_ulp_max']:.2f} | {r['flips']} {r['flip_margins'] or ''} |"
        )
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtypes", default="float32,bf16,fp16")
    ap.add_argument("--layouts", default="model,packed")
    ap.add_argument("--widths", default="1,2,4,8,16,32")
    ap.add_argument("--tasks", default="humaneval,gsm8k,mtbench,sharegpt")
    ap.add_argument("--samples", type=int, default=2, help="prompts per task (test split)")
    ap.add_argument("--tokens", type=int, default=32, help="positions compared per prompt")
    ap.add_argument("--head", choices=("model", "fp32"), default="model")
    ap.add_argument("--rowwise", action="store_true", help="block forwards with row-by-row linears")
    ap.add_argument(
        "--time-head", action="store_true", help="only time decode steps with a float32 head"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    for dtype_name in args.dtypes.split(","):
        loaded = models.load(args.model, dtype=dtype_name)
        prompts = [
            (task, data.encode_sample(loaded, s))
            for task in args.tasks.split(",")
            for s in data.load_task(task, "test", n=args.samples)
        ]
        if args.time_head:
            time_head(loaded, prompts[0][1], out_dir, dtype_name)
            continue
        if args.rowwise:  # every forward, the reference's too: a batch-invariant mode
            with rowwise():
                measure(args, dtype_name, prompts, loaded, records)
        else:
            measure(args, dtype_name, prompts, loaded, records)
        if args.rowwise:
            time_rowwise(
                loaded, prompts[0][1], [int(w) for w in args.widths.split(",")], out_dir, dtype_name
            )
        del loaded
    if args.time_head:
        return
    tag = args.head + ("-rowwise" if args.rowwise else "")
    with open(out_dir / f"records-{tag}.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    rows = summarize(records)
    (out_dir / f"summary-{tag}.json").write_text(json.dumps(rows, indent=1))
    import sys

    write_summary(rows, out_dir / f"summary-{tag}.md", "python " + " ".join(sys.argv))
    print((out_dir / f"summary-{tag}.md").read_text())


if __name__ == "__main__":
    main()
