"""Drafting a chain with the model itself, some of its blocks skipped, until a probability exit.

The draft model of layer-skipping methods (Draft & Verify's skipped attention/MLP blocks,
CLaSp's skipped layers): the model's own forward one token at a time with the blocks in
``skip_attn``/``skip_mlp`` left out, greedy, stopping after ``max_tokens`` tokens or at a token
whose probability under the draft model is below ``exit_below`` (the draft exit of Draft &
Verify's Algorithm 3).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from selfspec._engine.runner import KVCache, Runner

if TYPE_CHECKING:  # pragma: no cover
    from selfspec._engine.drafting.draftweights import DraftWeights


@dataclass(frozen=True)
class SkipDraft:
    """``tokens``: ``[n]`` int64, the draft. ``captured``: when a layer was asked for, the input
    of that layer (``[H]`` each) of every token the draft model ran, in order: the pending token,
    then each draft token fed back (never the last one kept), one per forward; else empty."""

    tokens: torch.Tensor
    captured: list[torch.Tensor] = field(default_factory=list)


def skip_layer_draft(
    runner: Runner,
    cache: KVCache,
    pending: torch.Tensor,
    slot: int,
    *,
    max_tokens: int,
    skip_attn: Collection[int] = (),
    skip_mlp: Collection[int] = (),
    exit_below: float = 0.0,
    keep_exit: bool = True,
    capture: int | None = None,
    pick: Callable[[torch.Tensor, list[int]], torch.Tensor] | None = None,
    weights: DraftWeights | None = None,
) -> SkipDraft:
    """Up to ``max_tokens`` greedy draft tokens after ``pending`` from the model with
    blocks skipped.

    pending: ``[1]`` int64, fed at cache ``slot`` (its position); the draft model's ``n``-th
    input goes to ``slot + n``. Layers whose attention runs write their keys/values at those
    slots (past the committed prefix, so verification overwrites them); a skipped attention
    block writes none, so its layer keeps ``slot`` valid slots. Nothing before ``slot`` is
    written.

    The exit: the draft model's top probability is ``1 / sum(exp(logits - max))``, computed in
    at least float32; drafting stops at a token whose top probability is below ``exit_below``
    (``0`` never exits). With ``keep_exit`` that token is still in the draft (its forward is
    paid; Draft & Verify's Algorithm 3 keeps it), else it is dropped.

    capture: a layer index whose input to return in :attr:`SkipDraft.captured` (for
    :func:`selfspec.verify_from_layer`: exact when no block below it is skipped, and with
    ``weights``, never: compressed layers change every state).

    pick: how a draft token is chosen from the draft logits ``[1, V]`` and its absolute
    position ``[slot + n + 1]``; pass ``state.pick`` so that a sampling decode drafts with the
    target's noise (coupled drafts; :meth:`selfspec.DecodeState.pick`). ``None``: the argmax.

    weights: the model's draft weights (:func:`selfspec.draft_weights`): the draft model runs
    their compressed layers and head (a token outside their draft vocabulary is never drafted).

    Draft & Verify's draft exit, one token per forward; used by selfsd and clasp.
    """
    tokens: list[torch.Tensor] = []
    captured: list[torch.Tensor] = []
    want = (capture,) if capture is not None else ()
    tok = pending  # tok: [1]
    for n in range(max_tokens):
        out = runner.forward(
            tok,
            cache=cache,
            start=slot + n,
            skip_attn=skip_attn,
            skip_mlp=skip_mlp,
            capture=want,
            logits="last",
            weights=weights,
        )
        if want:
            captured.append(out.captured[capture][0])  # [H]
        logits = out.logits[-1]  # logits: [V]
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        top = torch.argmax(logits)
        tok = top.reshape(1) if pick is None else pick(logits[None], [slot + n + 1]).reshape(1)
        exits = 1.0 / float(torch.exp(logits - logits[top]).sum()) < exit_below
        if not exits or keep_exit:
            tokens.append(tok)
        if exits:
            break
    if not tokens:
        return SkipDraft(torch.empty(0, dtype=torch.long, device=pending.device), captured)
    return SkipDraft(torch.cat(tokens), captured)
