"""How far the history source's candidate is accepted, by the length of its match.

Decodes dev-split prompts greedily (``vanilla``), then replays each output: at every step of
Self-Draft's default schedule (candidates once the output has 3 tokens; the step commits the
longest accepted prefix of the history candidate plus one), it records how many tokens of the
history candidate (up to 16) equal the greedy continuation, grouped by how many tokens of
the output's suffix matched (3, 2, 1; 0 = no match). Prints, per match length, the share of
steps whose candidate is accepted for at least k tokens: the k-th token of a candidate is
worth verifying when that share beats the cost of one more row in the forward.

    python lab/scripts/selfdraft_history_match.py \
        > lab/results/smollm2-135m-instruct/selfdraft-history-match-zen4-avx512-2026-11-24/history_match.txt
"""  # noqa: E501 (the results path above cannot be split)

from __future__ import annotations

import collections

import torch

from selfspec import Decoder, NgramIndex
from selfspec.app import format_prompt, load_model, load_task

TASKS = ("humaneval", "gsm8k", "mtbench", "sharegpt")
KS = (1, 2, 3, 4, 6, 8, 10, 12, 16)


def main() -> None:
    torch.set_num_threads(2)
    loaded = load_model()
    dec = Decoder(loaded.model, "vanilla", tokenizer=loaded.tokenizer)
    accepted: dict[int, list[int]] = collections.defaultdict(list)
    for task in TASKS:
        for sample in load_task(task, "dev", n=5, seed=3):
            prompt = format_prompt(loaded, sample.text(loaded.chat))
            out = dec.generate(prompt, 96, eos_token_ids=loaded.eos_token_ids).output_ids
            h = NgramIndex(3, 1)
            h.extend(prompt)
            i = 0
            while i < len(out):
                a = 0
                if i >= 3:
                    cand = h.continuation(16)
                    while a < len(cand) and i + a < len(out) and cand[a] == out[i + a]:
                        a += 1
                    accepted[h.match()[0]].append(a)
                a = min(a, len(out) - i - 1)
                h.extend(out[i : i + a + 1])
                i += a + 1
    print(
        "dev split, 5 prompts per task (seed 3), 96 new tokens, default model; "
        "history candidate of 16"
    )
    print("match  steps  mean accepted  " + "  ".join(f"P(>={k})" for k in KS))
    for n in sorted(accepted, reverse=True):
        v = accepted[n]
        shares = "  ".join(f"{sum(x >= k for x in v) / len(v):7.2f}" for k in KS)
        print(f"{n:5d}  {len(v):5d}  {sum(v) / len(v):13.2f}  {shares}")


if __name__ == "__main__":
    main()
