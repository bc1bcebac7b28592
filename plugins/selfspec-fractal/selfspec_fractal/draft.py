"""The draft pass (FractalLLM §3.2): one forward of the original layers with compressed
copies injected before the fractal layers.

The original layers run over ``[prefix rows..., w placeholders]``. Before each fractal layer
``f`` the hidden state ``h`` (the input of layer ``f``) goes through the compressed upper
layers ``L'_f..L'_{L-1}`` and the compressed head; the argmax at the last prefix row and at
every draft row gives ``m + 1`` tokens (``m`` draft rows so far). They are re-embedded (the
model's own embedding: a lookup of a few rows, nothing to save by compressing it), run through
the compressed lower layers ``L'_0..L'_{f-1}``, and
replace the draft rows of ``h`` (the prefix rows are kept as they are): one more draft row
per fractal layer. After ``n`` fractal layers the original head reads ``w + n + 1`` tokens.

KV cache (``kv``):

* ``"shared"`` (default): the prefix rows are just the pending token; the original layers
  run over the committed prefix from the decode's own cache, and the compressed layers attend
  to the *original* layers' keys/values of the prefix (an approximation: drafts only need to
  be good, verification is exact). Every write lands at slot ``state.length - 1`` or later,
  which verification overwrites; slots before it are never touched. Work per pass is
  proportional to ``w + n``, not to the sequence.
* ``"none"``: the paper's setting. Every pass recomputes the whole sequence: the original and
  upper compressed layers over ``[committed..., drafts]``, the lower compressed layers over the
  re-embedded ``[committed..., new drafts]``, each with a throwaway cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from selfspec import DraftWeights

MergeHook = Callable[[int, torch.Tensor, torch.Tensor], None]


def evenly_spaced(n_layers: int, n: int) -> list[int]:
    """Appendix D: gap = L // n; fractal layer k (0-based) runs before layer ``(k+1)*gap - 1``
    (0-based), i.e. every ``gap``-th layer counted from 1, as the paper counts."""
    if n <= 0:
        return []
    gap = max(1, n_layers // n)
    return (
        [min(n_layers - 1, (k + 1) * gap - 1) for k in range(n)]
        if n <= n_layers
        else list(range(n_layers))
    )


def merge(h: torch.Tensor, hat: torch.Tensor, r: int) -> torch.Tensor:
    """Keep the ``r`` prefix rows of ``h`` ``[1, r+m, H]`` and replace its draft rows by ``hat``
    ``[1, m', H]``: ``[1, r+m', H]``."""
    return torch.cat([h[:, :r], hat], 1)


@torch.inference_mode()
def draft_pass(
    runner,
    dw: DraftWeights,
    cache,
    committed: torch.Tensor,
    positions: Sequence[int],
    w: int,
    kv: str = "shared",
    on_merge: MergeHook | None = None,
    pick: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Draft ``w + len(positions) + 1`` tokens after ``committed`` ``[T]`` (the last one is the
    pending token, ``cache`` holds the other ``T - 1``). Returns ``[w + n + 1]`` int64.
    ``dw``: the host's draft weights the compressed layers and head come from.

    ``on_merge(f, before, after)`` (tests) sees ``h`` entering fractal layer ``f`` before and
    after the merge. ``pick(logits, positions)`` chooses the tokens (``state.pick``: coupled
    with the target under sampling); ``None``: the argmax.
    """
    choose = pick or (lambda logits, at: logits.argmax(-1))
    T = int(committed.shape[0])
    L = runner.n_layers
    subs = dw.layers or None
    if kv == "shared":
        r, s0 = 1, T - 1  # prefix rows: the pending token, at its own slot
        prefix = committed[-1:]
    elif kv == "none":
        r, s0 = T, 0
        cache = runner.new_cache(T + w + len(positions) + 1)
        prefix = committed
    else:
        raise ValueError(f"unknown kv mode {kv!r}")
    emb = runner.embed(prefix)  # [1, r, H]
    h = torch.cat([emb, emb.new_zeros(1, w, emb.shape[-1])], 1)  # [1, r+w, H]: w placeholders
    done = 0  # original layers [0, done) have run
    for f in positions:
        if f > done:
            h = runner.forward(
                hidden=h, cache=cache, start=s0, layers=(done, f), logits=None
            ).hidden
            done = f
        # upper compressed layers L'_f..L'_{L-1} + compressed head at the last prefix row and the
        # drafts
        if kv == "shared":
            up = runner.forward(
                hidden=h, cache=cache, start=s0, layers=(f, L), logits=None, substitutes=subs
            )
        else:
            up = runner.forward(hidden=h, layers=(f, L), logits=None, substitutes=subs)
        rows = dw.head(runner, up.hidden[0, r - 1 :])  # rows: [m+1, V], predicting positions T..
        new = choose(rows, torch.arange(T, T + rows.shape[0], device=rows.device))  # new: [m+1]
        # re-embed and run the compressed lower layers L'_0..L'_{f-1}
        if kv == "shared":
            x = runner.embed(new, weights=dw)  # [1, m+1, H] at positions s0+1..
            low = runner.forward(
                hidden=x, cache=cache, start=s0 + 1, layers=(0, f), logits=None, substitutes=subs
            ).hidden
        else:
            x = runner.embed(torch.cat([committed, new]), weights=dw)
            low = runner.forward(hidden=x, layers=(0, f), logits=None, substitutes=subs).hidden[
                :, r:
            ]
        merged = merge(h, low, r)  # [1, r+m+1, H]
        if on_merge is not None:
            on_merge(f, h, merged)
        h = merged
    out = runner.forward(hidden=h, cache=cache, start=s0, layers=(done, L), logits=None).hidden
    logits = runner.head(out[0, r - 1 :])  # [w+n+1, V]
    return choose(logits, torch.arange(T, T + logits.shape[0], device=logits.device))  # [w+n+1]
