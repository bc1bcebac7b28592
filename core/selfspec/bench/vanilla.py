"""Speed of the host loop with ``vanilla`` against Hugging Face ``generate`` (greedy).

``python -m selfspec.bench.vanilla [--model PATH] [--prompts N] [--max-new-tokens N]
[--threads 2] [--repeats R] [--json FILE]``

Method: load the model once, warm both paths up, then for every repeat and every prompt time
``model.generate(do_sample=False)`` (through :func:`selfspec.reference.reference_generate`)
and ``Decoder(model, "vanilla", weight_layout=L).generate`` for every runner weight layout L
(``--layouts``; default every layout the dtype allows) back to back, rotating which one
goes first, so that all see the same machine load. Both decode exactly ``--max-new-tokens`` tokens (EOS is
ignored unless ``--eos``). Reported: tokens/s of each (from the median time per prompt), the
speed ratio host/HF per prompt and its median, and whether every host output equals the HF
output token for token (a difference is reported with the reference's top-1/top-2 margin
there). The exit status is 1 when any output differs.

The prompts are SMOKE PROMPTS: a handful of short, realistic instructions hard-coded here to
exercise the loop. They are not the benchmark data set (that is ``specdec bench``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch

from ..loop import Decoder
from ..reference import compare, reference_generate
from ..runner.layout import LAYOUTS, check_layout

DEFAULT_MODEL = None  # the embedded default model (SmolLM2-135M-Instruct)

#: SMOKE PROMPTS, not benchmark data: short instructions of the kinds a chat model gets.
SMOKE_PROMPTS: tuple[str, ...] = (
    "Write a Python function that checks whether a number is prime.",
    "Explain in two sentences why the sky is blue.",
    "Give me three tips for writing a good cover letter.",
    "Summarize the plot of Romeo and Juliet in one paragraph.",
    "What is the difference between a list and a tuple in Python?",
    "Translate 'Where is the train station?' into French and Spanish.",
    "Write a short poem about autumn leaves.",
    "How do I make a simple tomato sauce?",
)


def load_model(path: str | None, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, Any]:
    """The model and its tokenizer, through :func:`selfspec.models.load` (``None`` = the
    embedded default model)."""
    from ..models import load

    loaded = load(path, dtype=str(dtype).removeprefix("torch."))
    return loaded.model, loaded.tokenizer


def prompt_ids(tokenizer: Any, n: int, vocab_size: int) -> list[list[int]]:
    """Token ids of the first ``n`` smoke prompts with the chat template applied (a model
    without a tokenizer gets fixed pseudo-random ids of similar lengths instead)."""
    if n > len(SMOKE_PROMPTS):
        raise ValueError(f"only {len(SMOKE_PROMPTS)} smoke prompts are defined")
    out = []
    for i, text in enumerate(SMOKE_PROMPTS[:n]):
        if tokenizer is None:
            g = torch.Generator().manual_seed(i)
            out.append(torch.randint(0, vocab_size, (20 + 3 * i,), generator=g).tolist())
        elif getattr(tokenizer, "chat_template", None):
            msgs = [{"role": "user", "content": text}]
            ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            out.append([int(t) for t in ids])
        else:
            out.append(tokenizer(text)["input_ids"])
    return out


def run(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    repeats: int,
    eos_token_ids: Sequence[int] = (),
    layouts: Sequence[str] = ("model",),
) -> dict[str, Any]:
    """Time HF ``generate`` and the host with ``vanilla`` (one decoder per weight layout),
    interleaved; see the module doc. Returns per-prompt rows and per-method summaries."""
    methods: dict[str, Callable[[Sequence[int]], list[int]]] = {
        "hf": lambda ids: reference_generate(
            model, ids, max_new_tokens, eos_token_ids=eos_token_ids
        )
    }
    for layout in layouts:
        decoder = Decoder(model, "vanilla", weight_layout=layout)
        methods[f"host[{layout}]"] = partial(_host, decoder, max_new_tokens, eos_token_ids)
    names = list(methods)

    for fn in methods.values():  # warm-up: first calls allocate and pick kernels
        fn(prompts[0])

    times = {name: [[] for _ in prompts] for name in names}
    outputs: dict[str, list[list[int]]] = {name: [[] for _ in prompts] for name in names}
    equal = {name: [True] * len(prompts) for name in names}
    for r in range(repeats):
        for p, ids in enumerate(prompts):
            shift = (r + p) % len(names)  # rotate who goes first
            for name in names[shift:] + names[:shift]:
                t0 = time.perf_counter()
                outputs[name][p] = methods[name](ids)
                times[name][p].append(time.perf_counter() - t0)
            for name in names:
                equal[name][p] = equal[name][p] and outputs[name][p] == outputs["hf"][p]

    rows = []
    for p, ids in enumerate(prompts):
        row: dict[str, Any] = {
            "prompt": p,
            "prompt_tokens": len(ids),
            "new_tokens": len(outputs["hf"][p]),
        }
        hf_tps = len(outputs["hf"][p]) / statistics.median(times["hf"][p])
        for name in names:
            tps = len(outputs[name][p]) / statistics.median(times[name][p])
            m = {
                "tokens_per_s": tps,
                "ratio": tps / hf_tps,
                "times_s": times[name][p],
                "equal": equal[name][p],
            }
            if not equal[name][p]:
                c = compare(model, ids, outputs[name][p], outputs["hf"][p])
                m.update(first_difference=c.index, margin=c.margin, near_tie=c.near_tie)
            row[name] = m
        rows.append(row)
    summary = {}
    for name in names:
        n = sum(len(outputs[name][p]) for p in range(len(prompts)))
        t = sum(statistics.median(times[name][p]) for p in range(len(prompts)))
        summary[name] = {
            "tokens_per_s": n / t,
            "median_ratio": statistics.median(row[name]["ratio"] for row in rows),
            "all_equal": all(equal[name]),
        }
    return {
        "methods": names,
        "prompts": rows,
        "summary": summary,
        "all_equal": all(s["all_equal"] for s in summary.values()),
    }


def _host(
    decoder: Decoder, max_new_tokens: int, eos: Sequence[int], ids: Sequence[int]
) -> list[int]:
    return decoder.generate(ids, max_new_tokens, eos_token_ids=eos).output_ids


def _usable_layouts(model: torch.nn.Module) -> list[str]:
    p = next(model.parameters())
    usable = []
    for layout in LAYOUTS:
        try:
            usable.append(check_layout(layout, p.device, p.dtype))
        except ValueError:
            pass
    return usable


def _machine(threads: int) -> dict[str, Any]:
    from ..machine import machine_info

    return {**machine_info(), "threads": threads}


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def format_table(res: dict[str, Any]) -> str:
    hosts = [n for n in res["methods"] if n != "hf"]
    head = f"{'prompt':>6} {'in':>4} {'new':>4} {'HF tok/s':>9}"
    for n in hosts:
        head += f" {n + ' tok/s':>24} {'ratio':>6} {'equal':>5}"
    lines = [head]

    def cells(m: dict[str, Any]) -> str:
        eq = "yes" if m["equal"] else ("tie" if m.get("near_tie") else "NO")
        return f" {m['tokens_per_s']:>24.2f} {m['ratio']:>6.3f} {eq:>5}"

    for r in res["prompts"]:
        line = f"{r['prompt']:>6} {r['prompt_tokens']:>4} {r['new_tokens']:>4} {r['hf']['tokens_per_s']:>9.2f}"
        lines.append(line + "".join(cells(r[n]) for n in hosts))
    s = res["summary"]
    line = f"{'all':>6} {'':>4} {'':>4} {s['hf']['tokens_per_s']:>9.2f}"
    for n in hosts:
        eq = "yes" if s[n]["all_equal"] else "NO"
        line += f" {s[n]['tokens_per_s']:>24.2f} {s[n]['median_ratio']:>6.3f} {eq:>5}"
    lines.append(line)
    lines.append(
        "ratio: host tok/s / HF tok/s, per prompt; row 'all': total tok/s and the median ratio."
    )
    lines.append(
        "equal: host output == HF generate output token for token ('tie': differs at a near-tie)."
    )
    for r in res["prompts"]:
        for n in hosts:
            if not r[n]["equal"]:
                lines.append(
                    f"prompt {r['prompt']} {n}: first difference at new token {r[n]['first_difference']}, "
                    f"reference top-2 margin {r[n]['margin']:.3e}"
                )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m selfspec.bench.vanilla", description=__doc__.split("\n")[0]
    )
    ap.add_argument(
        "--model", default=DEFAULT_MODEL, help="a model directory, .gguf file or alias (default: the embedded SmolLM2-135M-Instruct)"
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
        help="comma-separated runner weight layouts to time (default: every layout the dtype allows)",
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
    model, tokenizer = load_model(args.model, getattr(torch, args.dtype))
    load_s = time.perf_counter() - t0
    vocab = int(model.config.vocab_size)
    prompts = prompt_ids(tokenizer, args.prompts, vocab)
    eos: list[int] = []
    if args.eos:
        eos = sorted(Decoder(model, "vanilla")._default_eos())
    load_before = _load_average()
    layouts = args.layouts.split(",") if args.layouts else _usable_layouts(model)
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
        machine=_machine(args.threads),
        command=" ".join(
            ["python -m selfspec.bench.vanilla", *(argv if argv is not None else sys.argv[1:])]
        ),
    )
    m = res["machine"]
    print(
        f"model {args.model} ({args.dtype}), {len(prompts)} smoke prompts, {args.max_new_tokens} new tokens, "
        f"{args.repeats} repeats, {m['threads']} threads on {m['cpu']} [{m['cpu_capability']}] ({m['cores']} cores), "
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
