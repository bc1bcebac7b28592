"""How much of SmolLM2-135M can a draft skip? Teacher-forced top-1 agreement of skip sets.

Decodes 2 dev prompts x 40 tokens greedily, then runs the whole sequence once with the full
model and once with blocks skipped, and reports how often the skipped model's top-1 equals the
full model's on the generated positions (an estimate of the draft acceptance rate; the real
draft attends to the full model's keys/values of the prefix, so it is only a rough one).

    python lab/scripts/selfsd_agreement.py
"""

import torch
from selfspec_selfsd.tune import TASKS, dev_prompts

from selfspec import Decoder
from selfspec.app import load_model

torch.set_num_threads(1)
loaded = load_model()
van = Decoder(loaded.model, "vanilla")
runner = van.runner
seqs = []
for p in dev_prompts(loaded, TASKS, 2):
    r = van.generate(p, 40)
    seqs.append((len(p), torch.tensor(p + r.output_ids)))


def agree(skip_attn=(), skip_mlp=()):
    ok = total = 0
    for T, s in seqs:
        full = runner.forward(s).logits.argmax(-1)
        draft = runner.forward(s, skip_attn=skip_attn, skip_mlp=skip_mlp).logits.argmax(-1)
        m = draft[T - 1 : -1] == full[T - 1 : -1]
        ok += int(m.sum())
        total += m.numel()
    return ok / total


for layer in [1, 5, 10, 15, 20, 25, 28, 29]:
    print(
        f"skip attention {layer}: {agree(skip_attn=(layer,)):.2f}   "
        f"skip MLP {layer}: {agree(skip_mlp=(layer,)):.2f}"
    )
for attn in [range(24, 29), range(20, 29), range(15, 29), range(10, 29, 2), range(16, 29, 2)]:
    print(f"skip attention {list(attn)}: {agree(skip_attn=tuple(attn)):.2f}")
