"""Drafting with the layer set ``S`` skipped, one token at a time."""

from __future__ import annotations

from collections.abc import Collection

import torch

from selfspec.runner import KVCache, Runner


def draft_chain(
    runner: Runner, cache: KVCache, pending: torch.Tensor, slot: int, skip: Collection[int], k: int, det: float,
    keep_exit: bool = True,
) -> torch.Tensor:
    """Up to ``k`` greedy draft tokens after ``pending`` from the model with ``skip`` left out.

    pending: ``[1]`` the pending token, fed at cache ``slot`` (its position); draft token ``n``
    goes to ``slot + 1 + n``. Both sub-blocks of every layer in ``skip`` are skipped: those
    layers write no keys/values, the others write theirs at the draft slots (past the committed
    prefix, so verification overwrites them). Drafting stops at a token whose probability
    under the draft model is below ``det`` (the draft-exit threshold). With ``keep_exit`` that
    token is still drafted (its forward is already paid, and verifying one more row costs little;
    Draft & Verify's Algorithm 3 does the same); without it the token is dropped. Returns ``[n]``
    int64, ``n <= k``.
    """
    out_tokens: list[torch.Tensor] = []
    tok = pending  # tok: [1]
    for n in range(k):
        out = runner.forward(tok, cache=cache, start=slot + n, skip_attn=skip, skip_mlp=skip, logits="last")
        logits = out.logits[-1].float()  # logits: [V]
        top = torch.argmax(logits)
        tok = top.reshape(1)
        # the draft exit: the probability of the top token is 1 / sum(exp(logits - max))
        exits = det > 0 and 1.0 / float(torch.exp(logits - logits[top]).sum()) < det
        if not exits or keep_exit:
            out_tokens.append(tok)
        if exits:
            break
    if not out_tokens:
        return torch.empty(0, dtype=torch.long, device=pending.device)
    return torch.cat(out_tokens)
