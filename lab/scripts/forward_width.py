"""Forward cost against block width, for the runner's weight layouts (a dev measurement).

A block of ``q`` new tokens over a cached prompt of 150 tokens, with an explicit causal block
mask (as drafts are verified), on the default model. Every variant is timed in turn for every
width and repetition (interleaved, so all see the same machine load); prints the median ms.

Variants: ``model``, ``transposed``, ``packed`` (the runner's), and ``packed:HINT``, a packed
copy whose oneDNN reorder is given ``batch_size=HINT`` (``packed:1`` is what the runner used
before 2026-11-23). Run on an idle machine::

    python lab/scripts/forward_width.py --variants packed:1,packed \
        --widths 1,2,4,8,16,32 --repeats 21
"""

from __future__ import annotations

import argparse
import time

import torch

from selfspec._engine.runner import Runner
from selfspec._engine.runner import layout as L
from selfspec.app import _models as models


def runner_for(model: torch.nn.Module, variant: str) -> Runner:
    """A runner over ``model`` with its own copies for ``variant`` (never shared)."""
    L._COPIES.pop(model, None)
    if not variant.startswith("packed:"):
        return Runner(model, weight_layout=variant)
    hint = int(variant.split(":", 1)[1])

    class Hinted(L.PackedLinear):
        def __init__(self, linear: torch.nn.Linear) -> None:
            super().__init__(linear)
            self.packed = torch.ops.mkldnn._reorder_linear_weight(
                linear.weight.detach(), batch_size=hint
            )

    original, L.PackedLinear = L.PackedLinear, Hinted
    try:
        return Runner(model, weight_layout="packed")
    finally:
        L.PackedLinear = original
        L._COPIES.pop(model, None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="packed:1,packed")
    ap.add_argument("--widths", default="1,2,4,8,12,16,24,32,48")
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--prefix", type=int, default=150)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="model to load (default: the embedded default)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = models.load(args.model).model
    variants = args.variants.split(",")
    widths = [int(w) for w in args.widths.split(",")]
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 49000, (args.prefix,), generator=gen)
    setups = {}
    for v in variants:
        r = runner_for(model, v)
        cache = r.new_cache(args.prefix + max(widths))
        r.forward(prompt, cache=cache, logits=None)
        setups[v] = (r, cache)
    times: dict[tuple[str, int], list[float]] = {(v, q): [] for v in variants for q in widths}
    for rep in range(args.repeats):
        for q in widths:
            block = torch.randint(0, 49000, (q,), generator=gen)
            mask = torch.ones(q, q, dtype=torch.bool).tril_()
            for v in variants if rep % 2 == 0 else variants[::-1]:
                r, cache = setups[v]
                t = time.perf_counter()
                r.forward(block, cache=cache, start=args.prefix, block_mask=mask, logits="all")
                times[(v, q)].append(time.perf_counter() - t)
    # one token without the LM head: how much of a forward the head is (drafts that exit early
    # still pay it; the head of an untied 150k vocabulary is a large share of a small model)
    head_free: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.repeats):
        for v in variants:
            r, cache = setups[v]
            t = time.perf_counter()
            r.forward(prompt[:1], cache=cache, start=args.prefix, logits=None)
            head_free[v].append(time.perf_counter() - t)
    print("ms, median of", args.repeats, "| width:", " ".join(f"{q:>6}" for q in widths))
    for v in variants:
        med = [sorted(times[(v, q)])[args.repeats // 2] * 1000 for q in widths]
        print(
            f"{v:>12}",
            " ".join(f"{m:6.1f}" for m in med),
            "| x one token:",
            " ".join(f"{m / med[0]:.2f}" for m in med),
        )
        layers_only = sorted(head_free[v])[args.repeats // 2] * 1000
        print(
            f"{'':>12} one token without the LM head {layers_only:.1f} ms: the head is "
            f"{1 - layers_only / med[0]:.0%} of a one-token forward"
        )


if __name__ == "__main__":
    main()
