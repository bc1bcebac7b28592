"""Greedy verification, for the built-in verifier and for plugins that verify their own way.

Every function here returns the verdict greedy decoding of the full model would produce (see
``selfspec_verify``): the longest draft path whose tokens equal the full model's argmax, plus
the model's own token after it (the bonus). They differ in where the full model's logits come
from:

* :func:`verify_greedy`: one forward over ``[pending, draft...]`` from layer 0 (chain or tree);
* :func:`verify_tree`: the same forward with extra rows after the draft (tokens that ride along
  in the verifying pass without being verified, e.g. draft branches), whose predictions come
  back too;
* :func:`verify_from_layer`: a chain whose input of layer ``f`` the proposer already computed
  exactly (its layers ``[0, f)`` ran unchanged): only layers ``[f, L)`` run over the block;
* :func:`chain_verdict`: logits computed by the caller.

"The full model's token" is ``state.pick`` of its logits (:meth:`DecodeState.pick`): the argmax
when the decode is greedy, the argmax of the position-keyed perturbed logits when it samples
(:mod:`selfspec._engine.contract.sampling`), so the same verifiers are lossless under sampling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from selfspec._engine.contract.reference import greedy
from selfspec._engine.contract.types import DecodeState, Draft, Verdict
from selfspec._engine.runner import masks


@dataclass(frozen=True)
class ExtraBlock:
    """Tokens that ride along in a verifying forward, after the draft's nodes: the extra
    tokens of :func:`verify_tree` (a Lookahead window, selfdraft's branches).

    ``ids``/``positions``: ``[e]`` int64, positions absolute (the pending token is at
    ``state.length - 1``, so a token right after it is at ``state.length``) and below
    ``state.runner.max_positions``; ``mask``: ``[e, e]`` bool,
    which extra tokens each extra token sees (besides the cached prefix and the pending token,
    which every extra token sees; it never sees a draft node); ``rows``: ``[r]`` indices into
    ``ids`` whose predictions are wanted: ``state.pick`` for position ``positions[row] + 1``
    (the greedy token, or the decode's sampled one). The draft's nodes never see the extra
    tokens, so the verdict is the one :func:`verify_greedy` gives. ``[pending, nodes...,
    extra...]`` is written from cache slot ``state.length - 1`` and must fit in
    ``state.cache.capacity`` (else a ``ValueError`` from the runner). See
    [positions, cache room and sampling](docs/faq.md#extrablock-positions-cache-room-and-sampling).
    """

    ids: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    rows: torch.Tensor


def verify_greedy(state: DecodeState, draft: Draft) -> Verdict:
    """Verify a chain or tree draft with one full-model forward over ``[pending, draft...]``
    (causal for a chain, the ancestor mask for a tree); see ``selfspec_verify``. The built-in
    verifier: call it from your own ``selfspec_verify`` to fall back to plain verification.

    Writes the keys/values of ``[pending, draft...]`` at cache slots ``state.length - 1`` on;
    captures ``state.capture_layers`` at the committed positions into ``Verdict.hidden``.
    """
    if draft.parents is None:
        runner, base = state.runner, state.length - 1
        ids = torch.cat([state.tokens[base : base + 1], draft.tokens])  # ids: [k+1]
        capture = state.capture_layers or ()
        out = runner.forward(ids, cache=state.cache, start=base, capture=capture)
        at = torch.arange(base + 1, base + 2 + len(draft), device=ids.device)  # positions picked
        pred = state.pick(out.logits, at)  # pred: [k+1], pred[i] = model's token after ids[i]
        path = list(range(accepted_length(pred, draft.tokens)))
        return _verdict(draft, path, pred.tolist(), out.captured, capture, out.logits)
    return verify_tree(state, draft)[0]


def verify_tree(
    state: DecodeState, draft: Draft, extra: ExtraBlock | None = None
) -> tuple[Verdict, list[int]]:
    """Verify a tree draft (a chain is the tree ``parents[i] = i - 1``) in one forward over
    ``[pending, nodes..., extra...]``; returns the verdict and the full model's token
    (``state.pick``: greedy, or the decode's sampled choice) after each of ``extra.rows``
    (``[]`` without ``extra``). ``extra`` (an :class:`ExtraBlock`) holds tokens that ride along
    in the same pass without being verified (selfdraft's draft branches).

    Cache: the block is written at slots ``state.length - 1`` on; the verdict's ``kv_slots``
    name the accepted path's slots (the extra tokens' slots are never kept).
    """
    runner, base = state.runner, state.length - 1
    pending = state.tokens[base : base + 1]  # [1]
    parents = (
        draft.parents
        if draft.parents is not None
        else torch.arange(-1, len(draft) - 1, device=pending.device)
    )
    n_tree = len(draft) + 1
    block = masks.tree(parents)  # [k+1, k+1] ancestors
    positions = masks.tree_positions(parents, base)  # [k+1]
    ids = torch.cat([pending, draft.tokens])  # ids: [k+1]
    rows: torch.Tensor | str = "all"
    if extra is not None and len(extra.ids):
        e = int(extra.ids.shape[0])
        full = torch.zeros(n_tree + e, n_tree + e, dtype=torch.bool, device=block.device)
        full[:n_tree, :n_tree] = block
        full[n_tree:, 0] = True  # every extra token sees the pending token
        full[n_tree:, n_tree:] = extra.mask
        block = full
        ids = torch.cat([ids, extra.ids])  # ids: [k+1+e]
        positions = torch.cat([positions, extra.positions])
        rows = torch.cat([torch.arange(n_tree, device=ids.device), extra.rows + n_tree])
    capture = state.capture_layers or ()
    out = runner.forward(
        ids,
        cache=state.cache,
        start=base,
        positions=positions,
        block_mask=block,
        logits=rows,
        capture=capture,
    )
    at = positions[:n_tree] + 1  # the positions each row's token is picked for
    if extra is not None and len(extra.ids):
        at = torch.cat([at, extra.positions[extra.rows] + 1])
    pred = state.pick(out.logits, at).tolist()  # one per logit row: the tree's, then extra.rows'
    tree_pred = pred[:n_tree]
    path = tree_path(parents.tolist(), draft.tokens.tolist(), tree_pred)
    return _verdict(draft, path, tree_pred, out.captured, capture, out.logits[:n_tree]), pred[
        n_tree:
    ]


def verify_from_layer(
    state: DecodeState, draft: Draft, hidden: Sequence[torch.Tensor], layer: int, **fields
) -> Verdict:
    """Greedy verification of a chain whose input of ``layer`` is already known.

    ``hidden``: the exact input of decoder layer ``layer`` (``[H]`` each) of ``[pending,
    d_1, ...]`` as the full model computes it, computed by the proposer while layers
    ``[0, layer)`` ran unchanged and wrote their keys/values at the block's slots; entries
    past ``len(draft)`` are ignored. When the last draft token was never run (``len(hidden) ==
    len(draft)``) it runs layers ``[0, layer)`` alone first. Then ``[pending, draft...]`` runs
    layers ``[layer, L)`` from those states at slot ``state.length - 1``. ``fields`` go to the
    :class:`Verdict` (``forwards=...``). Equal to :func:`verify_greedy` when ``hidden`` is exact.
    Used by selfsd (reuse below the first skipped block) and hispec (from the intermediate
    verifier's layer).
    """
    runner, cache = state.runner, state.cache
    base = state.length - 1
    n = len(draft)
    rows = list(hidden[: n + 1])  # inputs of `layer` for [pending, d_1, ...]
    if len(rows) < n:
        raise ValueError(
            f"verify_from_layer needs the states of at least {n} tokens, got {len(rows)}"
        )
    if len(rows) < n + 1:  # the last draft token was never run: layers [0, layer) for it alone
        out = runner.forward(
            draft.tokens[n - 1 : n], cache=cache, start=base + n, layers=(0, layer), logits=None
        )
        rows.append(out.hidden[0, 0])
    h = torch.stack(rows)[None]  # h: [1, n+1, H]
    out = runner.forward(hidden=h, cache=cache, start=base, layers=(layer, runner.n_layers))
    return chain_verdict(
        draft, out.logits, state=state, **fields
    )  # logits: [n+1, V], after each input


def accepted_length(pred: torch.Tensor, tokens: torch.Tensor) -> int:
    """How many leading chain tokens ``tokens`` ``[k]`` equal the model's predictions ``pred``
    ``[k+1]`` (``pred[i]`` = the full model's token after the pending token and ``tokens[:i]``).
    Also the intermediate check of a hierarchy of verifiers (any ``pred`` from any exit)."""
    return int((pred[: tokens.shape[0]] == tokens).to(torch.int64).cumprod(0).sum())


def chain_verdict(
    draft: Draft, logits: torch.Tensor, *, state: DecodeState | None = None, **fields
) -> Verdict:
    """The verdict of a chain draft from the full model's logits ``[k+1, V]`` of
    ``[pending, draft...]``: the longest matching prefix plus the model's token after it.

    For verifiers that compute those logits their own way (from reused hidden states, say);
    ``fields`` go to the :class:`Verdict` as they are (``forwards=...``); ``logits`` becomes
    ``Verdict.logits`` (a reference) unless ``fields`` name their own. Pass the decode's
    ``state`` so the tokens are picked by ``state.pick`` (required for a sampling decode;
    without it the pick is greedy).
    """
    if state is None:
        pred = greedy(logits)  # pred: [k+1]
    else:
        pred = state.pick(
            logits, torch.arange(state.length, state.length + logits.shape[0], device=logits.device)
        )
    a = accepted_length(pred, draft.tokens)
    fields.setdefault("logits", logits)
    return Verdict(
        accepted=tuple(int(t) for t in draft.tokens[:a].tolist()),
        bonus=int(pred[a]),
        accepted_nodes=tuple(range(a)),
        **fields,
    )


def tree_path(parents: Sequence[int], tokens: Sequence[int], pred: Sequence[int]) -> list[int]:
    """Longest root-to-node path whose tokens equal the model's predictions: the accepted node
    indices, root first (``[]`` when the first token is already wrong).

    ``pred[n+1]`` is the model's token after node n (``pred[0]`` after the pending token).
    Among children with the right token the first in draft order wins (they are identical
    continuations, so any choice is lossless; a trie has at most one).
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


def _verdict(
    draft: Draft,
    path: list[int],
    pred: list[int],
    captured: dict[int, torch.Tensor],
    capture: Sequence[int],
    logits: torch.Tensor | None = None,
) -> Verdict:
    """The verdict of ``path`` (draft nodes) given the predictions ``pred`` ``[k+1]`` and the
    ``[k+1, V]`` logits they came from (kept by reference in ``Verdict.logits``)."""
    slots = [0] + [n + 1 for n in path]
    bonus = int(pred[slots[-1]])
    hidden = None
    if capture:
        idx = torch.tensor(slots, device=draft.tokens.device)
        hidden = {layer: h.index_select(0, idx) for layer, h in captured.items()}
    accepted = tuple(int(t) for t in draft.tokens[path].tolist()) if path else ()
    return Verdict(
        accepted=accepted,
        bonus=bonus,
        accepted_nodes=tuple(path),
        kv_slots=tuple(slots),
        hidden=hidden,
        logits=logits,
    )
