"""Speed of the host loop with ``vanilla`` against Hugging Face ``generate`` (greedy).

``python -m selfspec.bench.vanilla [--model PATH] [--prompts N] [--max-new-tokens N]
[--threads 2] [--repeats R] [--json FILE]``

Method: load the model once, warm both paths up, then for every repeat and every prompt time
``model.generate(do_sample=False)`` (through :func:`selfspec.reference.reference_generate`)
and ``Decoder(model, "vanilla").generate`` back to back, alternating which one goes first, so
that both see the same machine load. Both decode exactly ``--max-new-tokens`` tokens (EOS is
ignored unless ``--eos``). Reported: tokens/s of each (from the median time per prompt), the
speed ratio host/HF per prompt and its median, and whether every host output equals the HF
output token for token. The exit status is 1 when any output differs.

The prompts are SMOKE PROMPTS: a handful of short, realistic instructions hard-coded here to
exercise the loop. They are not the benchmark data set (that is ``specdec bench``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

from ..loop import Decoder
from ..reference import compare, reference_generate

DEFAULT_MODEL = "/tmp/x/smol"

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


def load_model(path: str, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, Any]:
    """The model and its tokenizer (``None`` when the folder has none).

    Kept in one place: it will switch to ``selfspec.models.load()`` (which also knows the
    embedded default model) once that exists.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        tokenizer = None
    return model, tokenizer


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
) -> dict[str, Any]:
    """Time HF ``generate`` and the host with ``vanilla``, interleaved; see the module doc."""
    decoder = Decoder(model, "vanilla")

    def hf(ids: Sequence[int]) -> list[int]:
        return reference_generate(model, ids, max_new_tokens, eos_token_ids=eos_token_ids)

    def host(ids: Sequence[int]) -> list[int]:
        return decoder.generate(ids, max_new_tokens, eos_token_ids=eos_token_ids).output_ids

    # warm-up: first calls allocate and pick kernels
    for fn in (hf, host):
        fn(prompts[0])

    times: dict[str, list[list[float]]] = {"hf": [[] for _ in prompts], "host": [[] for _ in prompts]}
    outputs: dict[str, list[list[int]]] = {"hf": [[] for _ in prompts], "host": [[] for _ in prompts]}
    equal = [True] * len(prompts)
    order = (("hf", hf), ("host", host))
    for r in range(repeats):
        for p, ids in enumerate(prompts):
            got = {}
            for name, fn in order if (r + p) % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                got[name] = fn(ids)
                times[name][p].append(time.perf_counter() - t0)
            outputs["hf"][p], outputs["host"][p] = got["hf"], got["host"]
            equal[p] = equal[p] and got["hf"] == got["host"]

    rows = []
    for p, ids in enumerate(prompts):
        n_hf, n_host = len(outputs["hf"][p]), len(outputs["host"][p])
        t_hf, t_host = statistics.median(times["hf"][p]), statistics.median(times["host"][p])
        row = {
            "prompt": p,
            "prompt_tokens": len(ids),
            "new_tokens": n_host,
            "hf_tokens_per_s": n_hf / t_hf,
            "host_tokens_per_s": n_host / t_host,
            "ratio": (n_host / t_host) / (n_hf / t_hf),
            "hf_times_s": times["hf"][p],
            "host_times_s": times["host"][p],
            "equal": equal[p],
        }
        if not equal[p]:
            c = compare(model, ids, outputs["host"][p], outputs["hf"][p])
            row.update(first_difference=c.index, margin=c.margin, near_tie=c.near_tie)
        rows.append(row)
    total_hf = sum(len(outputs["hf"][p]) for p in range(len(prompts)))
    total_host = sum(len(outputs["host"][p]) for p in range(len(prompts)))
    sum_hf = sum(statistics.median(times["hf"][p]) for p in range(len(prompts)))
    sum_host = sum(statistics.median(times["host"][p]) for p in range(len(prompts)))
    return {
        "prompts": rows,
        "hf_tokens_per_s": total_hf / sum_hf,
        "host_tokens_per_s": total_host / sum_host,
        "median_ratio": statistics.median(r["ratio"] for r in rows),
        "all_equal": all(equal),
    }


def _machine(threads: int) -> dict[str, Any]:
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "threads": threads,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def format_table(res: dict[str, Any]) -> str:
    lines = [
        f"{'prompt':>6} {'in':>4} {'new':>4} {'HF tok/s':>9} {'host tok/s':>10} {'ratio':>6}  equal",
    ]
    for r in res["prompts"]:
        eq = "yes" if r["equal"] else f"NO (at {r['first_difference']}, margin {r['margin']:.2e})"
        lines.append(
            f"{r['prompt']:>6} {r['prompt_tokens']:>4} {r['new_tokens']:>4} {r['hf_tokens_per_s']:>9.2f} "
            f"{r['host_tokens_per_s']:>10.2f} {r['ratio']:>6.3f}  {eq}"
        )
    lines.append(
        f"{'all':>6} {'':>4} {'':>4} {res['hf_tokens_per_s']:>9.2f} {res['host_tokens_per_s']:>10.2f} "
        f"{res['median_ratio']:>6.3f}  {'all equal' if res['all_equal'] else 'DIFFERENCES'}"
    )
    lines.append("(ratio = host tok/s / HF tok/s per prompt; the 'all' row shows the median ratio)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m selfspec.bench.vanilla", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="a Hugging Face model folder (default: %(default)s)")
    ap.add_argument("--prompts", type=int, default=4, help=f"how many smoke prompts (max {len(SMOKE_PROMPTS)})")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"])
    ap.add_argument("--eos", action="store_true", help="stop at the model's EOS tokens (default: always decode N)")
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
    res = run(model, prompts, args.max_new_tokens, args.repeats, eos)
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
        command=" ".join(["python -m selfspec.bench.vanilla", *(argv if argv is not None else sys.argv[1:])]),
    )
    m = res["machine"]
    print(f"model {args.model} ({args.dtype}), {len(prompts)} smoke prompts, {args.max_new_tokens} new tokens, "
          f"{args.repeats} repeats, {m['threads']} threads on {m['cpu']} ({m['cpu_count']} cores), "
          f"torch {m['torch']}, transformers {m['transformers']}")
    print(format_table(res))
    print(f"load average before/after: {res['load_average_before']} / {res['load_average_after']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0 if res["all_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
