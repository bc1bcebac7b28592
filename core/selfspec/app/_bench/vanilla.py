"""Speed of the host loop with ``vanilla`` against Hugging Face ``generate`` (greedy).

The measurement behind docs/performance.md; ``lab/scripts/vanilla_vs_hf.py`` is its command line.

Method (:func:`run`): warm both paths up, then for every repeat and every prompt time
``model.generate(do_sample=False)`` (through
:func:`selfspec._engine.contract.reference.reference_generate`) and
``Decoder(model, "vanilla", weight_layout=L).generate`` for every runner weight layout L back to
back, rotating which one goes first, so that all see the same machine load.
Reported: tokens/s of each (from the median time per prompt), the speed ratio host/HF per
prompt and its median, and whether every host output equals the HF output token for token (a
difference is reported with the reference's top-1/top-2 margin there).

The prompts are SMOKE PROMPTS: a handful of short, realistic instructions hard-coded here to
exercise the loop. They are not the benchmark data set (that is ``specdec bench``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch

from selfspec._engine.contract.loop import Decoder
from selfspec._engine.contract.reference import compare, reference_generate
from selfspec._engine.runner.formats import check_layout, format_names
from selfspec.app._models import Loaded, format_prompt

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


def prompt_ids(loaded: Loaded | None, n: int, vocab_size: int) -> list[list[int]]:
    """Token ids of the first ``n`` smoke prompts through :func:`selfspec.app._models.format_prompt`
    (the chat template for chat models); without a loaded tokenizer (``None``), fixed
    pseudo-random ids of similar lengths instead."""
    if n > len(SMOKE_PROMPTS):
        raise ValueError(f"only {len(SMOKE_PROMPTS)} smoke prompts are defined")
    out = []
    for i, text in enumerate(SMOKE_PROMPTS[:n]):
        if loaded is None:
            g = torch.Generator().manual_seed(i)
            out.append(torch.randint(0, vocab_size, (20 + 3 * i,), generator=g).tolist())
        else:
            out.append(format_prompt(loaded, text))
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
                equal[name][p] = equal[name][p] and same_output(
                    outputs[name][p], outputs["hf"][p], max_new_tokens
                )

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
                m.update(
                    first_difference=c.index, margin=c.margin, near_tie=c.near_tie, bound=c.bound
                )
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


def same_output(host: Sequence[int], hf: Sequence[int], max_new_tokens: int) -> bool:
    """Whether the host's output is HF's. HF ``generate`` may stop before the budget at an EOS
    id from the model's own generation config even when none was asked for; the host decodes
    on. A host output that runs past HF's early stop with HF's tokens as its prefix is the same
    decode, not a divergence."""
    host, hf = list(host), list(hf)
    if host == hf:
        return True
    return len(hf) < max_new_tokens and len(host) > len(hf) and host[: len(hf)] == hf


def _host(
    decoder: Decoder, max_new_tokens: int, eos: Sequence[int], ids: Sequence[int]
) -> list[int]:
    return decoder.generate(ids, max_new_tokens, eos_token_ids=eos).output_ids


def usable_layouts(model: torch.nn.Module) -> list[str]:
    """Every runner weight layout that can run the model on its device and dtype."""
    p = next(model.parameters())
    usable = []
    for layout in format_names("layout"):
        try:
            usable.append(check_layout(layout, p.device, p.dtype))
        except ValueError:
            pass
    return usable


def format_table(res: dict[str, Any]) -> str:
    """The per-prompt table of a :func:`run` result, its summary row and any differences."""
    hosts = [n for n in res["methods"] if n != "hf"]
    head = f"{'prompt':>6} {'in':>4} {'new':>4} {'HF tok/s':>9}"
    for n in hosts:
        head += f" {n + ' tok/s':>24} {'ratio':>6} {'equal':>5}"
    lines = [head]

    def cells(m: dict[str, Any]) -> str:
        eq = "yes" if m["equal"] else ("tie" if m.get("near_tie") else "NO")
        return f" {m['tokens_per_s']:>24.2f} {m['ratio']:>6.3f} {eq:>5}"

    for r in res["prompts"]:
        line = (
            f"{r['prompt']:>6} {r['prompt_tokens']:>4} {r['new_tokens']:>4} "
            f"{r['hf']['tokens_per_s']:>9.2f}"
        )
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
                    f"prompt {r['prompt']} {n}: first difference at new token "
                    f"{r[n]['first_difference']}, "
                    f"reference top-2 margin {r[n]['margin']:.3e}"
                )
    return "\n".join(lines)
