#!/usr/bin/env python3
"""Are a draft tree's probabilities calibrated? The assumption ``draft_tree`` sizes trees on.

``draft_tree`` expects a node with cumulative draft probability ``p`` to be on the accepted
path with probability ``p``, so a tree's expected committed tokens are ``1 + sum(p)``. This
decodes dev prompts with a tree drafter (a plugin's skip set, a fixed node budget, so the
size rule does not filter what is measured), and reports, per bucket of ``p``, how often such
nodes were accepted, and the mean expected vs. committed tokens per step. Losslessness is the
host's business; this only measures.

    python lab/scripts/tree_calibration.py --plugin selfsd --prompts 4 --tokens 48 --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import selfspec

BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 0.9, 1.0001)


class Recorder:
    """A tree drafter with a given skip set that records each tree and what was accepted."""

    def __init__(self, skip_attn, skip_mlp, budget: int, topk: int, depth: int) -> None:
        self.skip_attn, self.skip_mlp = skip_attn, skip_mlp
        self.budget, self.topk, self.depth = budget, topk, depth
        self.trees: list[selfspec.DraftTree] = []
        self.steps: list[tuple[selfspec.DraftTree, tuple[int, ...]]] = []

    @selfspec.hookimpl
    def selfspec_propose(self, state):
        base = state.length - 1
        step = selfspec.skip_layer_step(
            state.runner, state.cache, skip_attn=self.skip_attn, skip_mlp=self.skip_mlp
        )
        tree = selfspec.draft_tree(
            step,
            state.tokens[base : base + 1],
            base,
            budget=self.budget,
            topk=self.topk,
            max_depth=min(self.depth, state.max_draft_depth),
            room=state.cache.capacity - base - 1,
        )
        self.trees.append(tree)
        return tree.draft()

    @selfspec.hookimpl
    def selfspec_update_policy(self, state, verdict):
        tree = self.trees[-1]
        if len(tree):
            self.steps.append((tree, tuple(verdict.accepted_nodes)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument(
        "--plugin", default="selfsd", help="whose skip set drafts (selfsd: its profile)"
    )
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = selfspec.load_model(args.model)
    owner = selfspec.Decoder(loaded.model, args.plugin, tokenizer=loaded.tokenizer).plugin
    skip_attn, skip_mlp = (
        tuple(getattr(owner, "skip_attn", ())),
        tuple(getattr(owner, "skip_mlp", ())),
    )
    rec = Recorder(skip_attn, skip_mlp, args.budget, args.topk, args.depth)
    dec = selfspec.Decoder(
        loaded.model, "tree-calibration", plugin_object=rec, tokenizer=loaded.tokenizer
    )
    tasks = ("humaneval", "gsm8k", "mtbench", "sharegpt")
    samples = [
        s
        for t in tasks
        for s in selfspec.load_task(t, split="dev", n=max(1, args.prompts // len(tasks)))
    ]
    for sample in samples[: args.prompts]:
        dec.generate(selfspec.encode_sample(loaded, sample), args.tokens)
    hits = [[0, 0, 0.0] for _ in BUCKETS[:-1]]  # per bucket: nodes, accepted, sum of p
    expected = committed = 0.0
    for tree, path in rec.steps:
        on_path = set(path)
        for i, p in enumerate(tree.probs.tolist()):
            b = next(j for j in range(len(BUCKETS) - 1) if p < BUCKETS[j + 1])
            hits[b][0] += 1
            hits[b][1] += i in on_path
            hits[b][2] += p
        expected += 1 + float(tree.probs.sum())
        committed += 1 + len(path)
    rows = [
        {
            "p_from": BUCKETS[j],
            "p_to": min(BUCKETS[j + 1], 1.0),
            "nodes": n,
            "mean_p": s / n if n else None,
            "accepted_rate": a / n if n else None,
        }
        for j, (n, a, s) in enumerate(hits)
    ]
    steps = max(1, len(rec.steps))
    summary = {
        "model": args.model or "default",
        "plugin_skip_set": args.plugin,
        "skip_attn": skip_attn,
        "skip_mlp": skip_mlp,
        "budget": args.budget,
        "topk": args.topk,
        "depth": args.depth,
        "prompts": len(samples[: args.prompts]),
        "tokens": args.tokens,
        "steps": len(rec.steps),
        "expected_per_step": expected / steps,
        "committed_per_step": committed / steps,
        "buckets": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "calibration.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = [
        f"expected tokens per step {summary['expected_per_step']:.2f}, "
        f"committed {summary['committed_per_step']:.2f}"
        f" ({len(rec.steps)} steps)",
        "",
        "| draft probability p | nodes | mean p | accepted |",
        "| --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        if r["nodes"]:
            lines.append(
                f"| [{r['p_from']:.2f}, {r['p_to']:.2f}) | {r['nodes']} | {r['mean_p']:.3f} | "
                f"{r['accepted_rate']:.3f} |"
            )
    (args.out / "calibration.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
