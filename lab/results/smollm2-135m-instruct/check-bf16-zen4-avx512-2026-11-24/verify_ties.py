import torch

from selfspec import models
from selfspec.cli.settings import DEFAULT_CHECK_PROMPTS
from selfspec.reference import next_logits, reference_generate
from selfspec.tiebound import tie_bound

torch.set_num_threads(1)
L = models.load(None, dtype="bf16")
cases = {2: [(27, 36875), (8, 99)], 3: [(9, 492)], 4: [(18, 4856)]}
for p, cs in cases.items():
    ids = models.format_prompt(L, DEFAULT_CHECK_PROMPTS[p - 1])
    ref = reference_generate(L.model, ids, 32, L.eos_token_ids)
    for i, got in cs:
        lg = next_logits(L.model, ids + ref[:i])
        top = torch.topk(lg, 2)
        b = tie_bound(L.dtype, lg)
        print(p, i, got, "ref", ref[i], "top2", top.indices.tolist(), top.values.tolist(), "got logit", float(lg[got]), "bound", b, "within", float(lg[got]) >= float(top.values[0]) - b)
