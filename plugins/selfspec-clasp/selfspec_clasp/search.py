"""Layer optimisation: CLaSp's approximate dynamic program (paper §3.4, Algorithm 1).

Given the hidden states ``x_0..x_L`` of one token computed by the full model (``x_0`` the
embedding, ``x_i`` the output of decoder layer ``i-1``), choose ``M`` layers to skip so that
the state after all layers stays as close (cosine) to ``x_L`` as possible.

``g(i, j)`` is the best state found after the first ``i`` layers with ``j`` of them skipped and
``D(i, j) = cos(x_i, g(i, j))``::

    D(i, j) = max{ cos(x_i, g(i-1, j-1)),              # skip layer i-1
                   cos(x_i, f_{i-1}(g(i-1, j))) }       # run layer i-1

with ``g(i, 0) = x_i`` and ``g(i, i) = x_0``. Backtracking the choices from ``(L, M)`` gives the
set. Each ``f_{i-1}`` is layer ``i-1`` of the model run on a candidate state of the token at its
own cache slot: it attends to the full model's cached keys/values of the prefix and to its own
fresh key/value, and writes nothing (read-only attention). All candidates of one layer run in
one forward (sequence parallel, §3.6): they are laid out as a block ``[1, J, H]`` with the
token's position repeated and an identity block mask, so each sees the shared prefix and
itself only, and the cache is never copied. One search therefore costs about one forward of
the model over ``M`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from selfspec import KVCache, Runner


@dataclass(frozen=True)
class Search:
    """One run of the program: the chosen ``skip`` layers (sorted), ``cosine`` = D(L, M),
    ``tokens`` = candidate states pushed through a layer (the work done, in token-layers)."""

    skip: tuple[int, ...]
    cosine: float
    tokens: int


def layer_search(
    runner: Runner, cache: KVCache, states: torch.Tensor, n_skip: int, slot: int
) -> Search:
    """Choose ``n_skip`` layers to skip for the token whose full-model states are ``states``.

    states: ``[L+1, H]``, row ``i`` the input of decoder layer ``i`` (row ``L`` the output of
        the last layer), as the verifier captures them.
    slot: the token's cache slot (= its position); ``cache`` must hold the full model's
        keys/values at slots ``[0, slot)`` in every layer. Nothing is written to it.
    """
    L = runner.n_layers
    M = n_skip
    if not 0 <= M <= L:
        raise ValueError(f"cannot skip {M} of {L} layers")
    if states.shape[0] != L + 1:
        raise ValueError(
            f"expected {L + 1} hidden states (embeddings + every layer), got {states.shape[0]}"
        )
    x = states
    device = x.device
    # g: [M+1, H] states of the previous row; skipped[i][j]: D(i, j) chose to skip layer i-1
    g = torch.zeros(M + 1, x.shape[1], dtype=x.dtype, device=device)
    g[0] = x[0]
    skipped = torch.zeros(L + 1, M + 1, dtype=torch.bool)
    work = 0
    for i in range(1, L + 1):
        new = torch.empty_like(g)
        new[0] = x[i]
        # only j with M - j <= L - i can still reach D(L, M): the rest are not computed
        lo, hi = max(1, M - (L - i)), min(i - 1, M)
        if lo <= hi:
            run = run_layer(runner, cache, i - 1, g[lo : hi + 1], slot)  # run: [hi-lo+1, H]
            skip = g[lo - 1 : hi]  # skip: [hi-lo+1, H], g(i-1, j-1)
            # take: [hi-lo+1] skipping layer i-1 is better
            take = _cos(skip, x[i]) > _cos(run, x[i])
            new[lo : hi + 1] = torch.where(take[:, None], skip, run)
            skipped[i, lo : hi + 1] = take.cpu()
            work += hi - lo + 1
        if i <= M:  # every layer so far skipped
            new[i] = g[i - 1]
            skipped[i, i] = True
        g = new
    chosen: list[int] = []
    j = M
    for i in range(L, 0, -1):
        if j > 0 and skipped[i, j]:
            chosen.append(i - 1)
            j -= 1
    return Search(tuple(sorted(chosen)), float(_cos(g[M : M + 1], x[L])[0]), work)


def run_layer(
    runner: Runner, cache: KVCache, layer: int, cands: torch.Tensor, slot: int
) -> torch.Tensor:
    """``f_layer`` on ``J`` candidate states of the token at ``slot``, in one read-only forward.

    cands: ``[J, H]``. Returns ``[J, H]``: each row is what running layer ``layer`` on that
    candidate alone at ``slot`` would give (the block mask is the identity, the position the
    token's own), attending to the cached prefix ``[0, slot)``; the cache is not written.
    """
    J = cands.shape[0]
    device = cands.device
    positions = torch.full((J,), slot, dtype=torch.long, device=device)  # positions: [J]
    block = torch.eye(J, dtype=torch.bool, device=device)  # block: [J, J]
    out = runner.forward(
        hidden=cands[None],
        layers=(layer, layer + 1),
        cache=cache,
        start=slot,
        positions=positions,
        block_mask=block,
        write=False,
        logits=None,
    )
    return out.hidden[0]


def initial_skip(n_layers: int, n_skip: int) -> tuple[int, ...]:
    """The set used before the first search: ``n_skip`` layers spread evenly over the interior
    (the first and last layers are kept while there is room), a context-free guess."""
    if n_skip <= 0:
        return ()
    if n_skip >= n_layers:
        return tuple(range(n_layers))
    interior = list(range(1, n_layers - 1))
    if n_skip >= len(interior):
        return tuple(sorted(interior + [n_layers - 1, 0][: n_skip - len(interior)]))
    step = len(interior) / n_skip  # >= 1, so the picks below are distinct
    return tuple(interior[int(step * k + step / 2)] for k in range(n_skip))


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine of every row of ``a`` ``[n, H]`` with ``b`` ``[H]``, in at least float32."""
    dt = torch.promote_types(a.dtype, torch.float32)
    return torch.nn.functional.cosine_similarity(a.to(dt), b.to(dt)[None], dim=-1)
