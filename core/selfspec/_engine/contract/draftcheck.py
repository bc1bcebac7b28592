"""The host's checks of a proposed draft, shared by the decode loop and the composer (which
checks each member's draft under that member's name): the propose contract, then the cut to
the depth budget and the cache's spare room."""

from __future__ import annotations

from typing import Any

import torch

from selfspec._engine.contract.plugins import PluginError
from selfspec._engine.contract.types import DecodeState, Draft


def check_draft(draft: Any, state: DecodeState, name: str) -> Draft:
    """``draft`` checked against the propose contract (a ``PluginError`` naming ``name``), then
    cut to the depth and room the host keeps."""
    return check_draft_kept(draft, state, name)[0]


def check_draft_kept(draft: Any, state: DecodeState, name: str) -> tuple[Draft, tuple[int, ...]]:
    """:func:`check_draft`, and for each node of the checked draft its index in ``draft`` as
    proposed (``0..len-1`` when nothing was cut): ``selfspec_update_policy``'s ``kept``."""
    if not isinstance(draft, Draft):
        raise PluginError(name, f"selfspec_propose returned {type(draft).__name__}, not a Draft")
    t = draft.tokens
    if not isinstance(t, torch.Tensor) or t.dtype != torch.long or t.dim() != 1:
        raise PluginError(name, "draft tokens must be a 1-D int64 tensor")
    if t.device != state.runner.device:
        raise PluginError(
            name, f"draft tokens are on {t.device}, the model on {state.runner.device}"
        )
    if len(draft) and (int(t.min()) < 0 or int(t.max()) >= state.runner.vocab_size):
        raise PluginError(name, f"draft token ids must lie in [0, {state.runner.vocab_size})")
    if draft.parents is not None:
        p = draft.parents
        if not isinstance(p, torch.Tensor) or p.dtype != torch.long or p.shape != t.shape:
            raise PluginError(name, "draft parents must be an int64 tensor shaped like the tokens")
        pl = p.tolist()
        if any(not -1 <= q < i for i, q in enumerate(pl)):
            raise PluginError(name, "draft parents must satisfy -1 <= parents[i] < i")
    pr = draft.probs
    if pr is not None:
        if not isinstance(pr, torch.Tensor) or not pr.is_floating_point() or pr.shape != t.shape:
            raise PluginError(name, "draft probs must be a floating tensor shaped like the tokens")
        if len(draft) and not bool(((pr >= 0) & (pr <= 1)).all()):
            raise PluginError(name, "draft probs must lie in [0, 1]")
    return cut_draft_kept(draft, state)


def cut_draft(draft: Draft, state: DecodeState) -> Draft:
    """Drop nodes deeper than the budget allows or past the cache's spare room."""
    return cut_draft_kept(draft, state)[0]


def cut_draft_kept(draft: Draft, state: DecodeState) -> tuple[Draft, tuple[int, ...]]:
    """:func:`cut_draft`, and the proposed index of every node it kept (parents before
    children, so the kept nodes are a tree of their own)."""
    limit = state.max_draft_depth
    room = state.cache.capacity - (state.length - 1) - 1
    if draft.parents is None:
        if len(draft) <= min(limit, room):
            return draft, tuple(range(len(draft)))
        state.stats.truncated_drafts += 1
        n = min(limit, room)
        return (
            Draft(
                draft.tokens[:n],
                None,
                draft.meta,
                draft.owner,
                None if draft.probs is None else draft.probs[:n],
            ),
            tuple(range(n)),
        )
    depths = draft.depths()
    keep = [i for i, d in enumerate(depths) if d <= limit][:room]
    if len(keep) == len(draft):
        return draft, tuple(keep)
    state.stats.truncated_drafts += 1
    remap = {old: new for new, old in enumerate(keep)}
    remap[-1] = -1
    parents = [remap[p] for p in draft.parents[keep].tolist()]
    idx = torch.tensor(keep, dtype=torch.long, device=draft.tokens.device)
    probs = None if draft.probs is None else draft.probs[idx.to(draft.probs.device)]
    return (
        Draft(
            draft.tokens[idx],
            torch.tensor(parents, dtype=torch.long, device=idx.device),
            draft.meta,
            draft.owner,
            probs,
        ),
        tuple(keep),
    )
