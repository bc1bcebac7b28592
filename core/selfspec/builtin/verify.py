"""The greedy verifier: one full-model forward over ``[pending, draft...]``."""

from __future__ import annotations

import torch

from ..plugins import hookimpl
from ..reference import greedy
from ..runner import masks
from ..types import DecodeState, Draft, Verdict


class GreedyVerifier:
    @hookimpl(trylast=True)
    def selfspec_verify(self, state: DecodeState, draft: Draft) -> Verdict:
        return verify_greedy(state, draft)


def verify_greedy(state: DecodeState, draft: Draft) -> Verdict:
    """Verify a chain or tree draft with the full model; see ``selfspec_verify``."""
    runner, base = state.runner, state.length - 1
    pending = state.tokens[base : base + 1]  # [1]
    ids = torch.cat([pending, draft.tokens])  # ids: [k+1]
    capture = state.capture_layers or ()
    if draft.parents is None:
        out = runner.forward(ids, cache=state.cache, start=base, capture=capture)
        pred = greedy(out.logits)  # pred: [k+1], pred[i] = model's token after ids[i]
        path = list(range(accepted_length(pred, draft.tokens)))
    else:
        block = masks.tree(draft.parents)  # [k+1, k+1] ancestors
        positions = masks.tree_positions(draft.parents, base)  # [k+1]
        out = runner.forward(ids, cache=state.cache, start=base, positions=positions, block_mask=block, capture=capture)
        pred = greedy(out.logits)
        path = _tree_path(draft.parents.tolist(), draft.tokens.tolist(), pred.tolist())
    slots = [0] + [n + 1 for n in path]
    bonus = int(pred[slots[-1]])
    hidden = None
    if capture:
        idx = torch.tensor(slots, device=ids.device)
        hidden = {layer: h.index_select(0, idx) for layer, h in out.captured.items()}
    accepted = tuple(int(t) for t in draft.tokens[path].tolist()) if path else ()
    return Verdict(accepted=accepted, bonus=bonus, accepted_nodes=tuple(path), kv_slots=tuple(slots), hidden=hidden)


def accepted_length(pred: torch.Tensor, tokens: torch.Tensor) -> int:
    """How many leading chain tokens ``tokens`` ``[k]`` equal the model's predictions ``pred``
    ``[k+1]`` (``pred[i]`` = the full model's token after the pending token and ``tokens[:i]``)."""
    return int((pred[:-1] == tokens).to(torch.int64).cumprod(0).sum())


def chain_verdict(draft: Draft, logits: torch.Tensor, **fields) -> Verdict:
    """The greedy verdict of a chain draft from the full model's logits ``[k+1, V]`` of
    ``[pending, draft...]``: the longest matching prefix plus the model's token after it.

    For verifiers that compute those logits their own way (from reused hidden states, say);
    ``fields`` go to the :class:`Verdict` as they are (``forwards=...``).
    """
    pred = greedy(logits)  # pred: [k+1]
    a = accepted_length(pred, draft.tokens)
    return Verdict(accepted=tuple(int(t) for t in draft.tokens[:a].tolist()), bonus=int(pred[a]),
                   accepted_nodes=tuple(range(a)), **fields)


def _tree_path(parents: list[int], tokens: list[int], pred: list[int]) -> list[int]:
    """Longest root-to-node path whose tokens equal the model's predictions.

    ``pred[n+1]`` is the model's token after node n (``pred[0]`` after the pending token).
    Among children with the right token the first in draft order wins (they are identical
    continuations, so any choice is lossless).
    """
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        children.setdefault(p, []).append(i)
    path: list[int] = []
    cur = -1
    while True:
        want = pred[cur + 1]
        nxt = next((c for c in children.get(cur, ()) if tokens[c] == want), None)
        if nxt is None:
            return path
        path.append(nxt)
        cur = nxt
