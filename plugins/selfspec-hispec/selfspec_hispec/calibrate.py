"""Self-distillation of exit heads: teach an exit layer to guess the full model's greedy token.

Data: the model's own greedy continuations of development prompts (and, cheaply, more
development texts read without generating). One full forward over each sequence captures the
hidden states at the chosen exit layers and the last layer; the targets are the full model's
greedy tokens at every position. Per exit layer, an affine map ``h -> h @ W + b`` (before the
shared final norm + LM head) is fitted in two stages:

1. ridge regression of the last layer's state on the exit's state (closed form; the penalty
   that agrees best on held-out sequences);
2. a few hundred Adam steps on the cross-entropy of the exit's logits (over the vocabulary
   subset the heads will score) against the full model's greedy tokens.

The stage (or the plain head) that agrees best with the full model on held-out sequences wins.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from selfspec import greedy

from .heads import ExitHeads


@dataclass
class Collected:
    """``states``: ``{layer: [N, H]}`` exit states; ``final``: ``[N, H]`` last layer's states;
    ``targets``: ``[N]`` the full model's greedy tokens; ``seq``: ``[N]`` sequence index."""

    states: dict[int, torch.Tensor]
    final: torch.Tensor
    targets: torch.Tensor
    seq: torch.Tensor


@torch.inference_mode()
def collect(
    runner: Any,
    sequences: Iterable[Sequence[int]],
    layers: Sequence[int],
    skip_first: int = 4,
    progress: Callable[[Iterable[Any]], Iterable[Any]] = iter,
) -> Collected:
    """Run every sequence through the full model once, capturing ``layers`` and the last layer.

    The first ``skip_first`` positions of each sequence are left out: attention-sink tokens
    carry huge activations that would dominate a regression and never get drafted anyway.
    """
    n = runner.n_layers
    want = sorted(set(int(x) for x in layers) | {n})
    states: dict[int, list[torch.Tensor]] = {x: [] for x in want}
    targets, seq = [], []
    for i, ids in enumerate(progress(list(sequences))):
        t = torch.as_tensor(list(ids), dtype=torch.long, device=runner.device)
        if t.numel() <= skip_first:
            continue
        out = runner.forward(t, capture=want, logits=None)
        for x in want:
            states[x].append(out.captured[x][skip_first:].clone())
        targets.append(greedy(runner.head(out.captured[n][skip_first:])))
        seq.append(torch.full((t.numel() - skip_first,), i, dtype=torch.long))
    if not targets:
        raise ValueError("no sequence is long enough to calibrate on")
    final = torch.cat(states.pop(n))
    return Collected(
        {x: torch.cat(v) for x, v in states.items() if x != n},
        final,
        torch.cat(targets),
        torch.cat(seq),
    )


def dev_texts(
    tokenizer: Any, per_kind: dict[str, int], max_tokens: int = 256, min_tokens: int = 32
) -> list[list[int]]:
    """Token ids of development texts, ``per_kind[kind]`` of each kind (``sharegpt``,
    ``humaneval``, ``gsm8k``; the benchmark's dev split only), each cut to its first
    ``max_tokens`` tokens; texts shorter than ``min_tokens`` are skipped."""
    from selfspec.app import corpus_texts

    out: list[list[int]] = []
    for kind, want in per_kind.items():
        for text in corpus_texts((kind,)):
            if want <= 0:
                break
            ids = tokenizer(text, add_special_tokens=False)["input_ids"][:max_tokens]
            if len(ids) >= min_tokens:
                out.append(ids)
                want -= 1
    return out


def agreement(
    runner: Any,
    heads: ExitHeads,
    layer: int,
    states: torch.Tensor,
    targets: torch.Tensor,
    chunk: int = 512,
) -> float:
    """Fraction of positions where the exit's guess equals the full model's greedy token."""
    hits = 0
    for s in range(0, states.shape[0], chunk):
        hits += int(
            (heads.predict(runner, layer, states[s : s + chunk]) == targets[s : s + chunk]).sum()
        )
    return hits / max(1, states.shape[0])


def ridge(x: torch.Tensor, y: torch.Tensor, lam: float = 1e-3) -> tuple[torch.Tensor, torch.Tensor]:
    """Least-squares affine map ``x @ W + b ≈ y`` with a relative ridge penalty (float64 solve)."""
    xa = torch.cat([x.double(), torch.ones(x.shape[0], 1, dtype=torch.float64)], 1)  # [N, H+1]
    a = xa.T @ xa
    a += lam * a.diagonal().mean() * torch.eye(a.shape[0], dtype=torch.float64)
    sol = torch.linalg.solve(a, xa.T @ y.double())  # [H+1, H]
    return sol[:-1].to(x.dtype), sol[-1].to(x.dtype)


def fit_layer(
    runner: Any,
    data: Collected,
    layer: int,
    vocab: torch.Tensor | None,
    *,
    steps: int = 200,
    batch: int = 256,
    lr: float = 1e-3,
    holdout: float = 0.2,
    seed: int = 0,
    lams: Sequence[float] = (1e-3, 1e-2, 1e-1),
    progress: Callable[[Iterable[Any]], Iterable[Any]] = iter,
) -> tuple[tuple[torch.Tensor, torch.Tensor] | None, dict[str, float]]:
    """Fit one exit layer's map; returns ``(map or None for the plain head, report)``."""
    x_all, y_all, t_all = data.states[layer], data.final, data.targets
    n_seq = int(data.seq.max()) + 1
    if holdout <= 0 or n_seq < 2:  # judged on the data it was fitted to
        train = test = torch.ones_like(data.seq, dtype=torch.bool)
    else:  # every k-th sequence is held out
        k = max(2, int(round(1 / holdout)))
        test = data.seq % k == k - 1
        train = ~test
    x, y, t = x_all[train], y_all[train], t_all[train]
    xt, tt = x_all[test], t_all[test]

    def score(m: tuple[torch.Tensor, torch.Tensor] | None) -> float:
        h = ExitHeads(maps={} if m is None else {layer: m}, vocab=vocab).bind(runner)
        return agreement(runner, h, layer, xt, tt)

    report = {"positions": float(x.shape[0]), "plain": score(None)}
    fits = [(score(m), m) for m in (ridge(x, y, lam) for lam in lams)]
    report["ridge"], (w0, b0) = max(fits, key=lambda f: f[0])
    w, b = _refine(
        runner, x, t, vocab, w0, b0, steps=steps, batch=batch, lr=lr, seed=seed, progress=progress
    )
    report["refined"] = score((w, b))
    best = max(("plain", "ridge", "refined"), key=lambda k: report[k])
    report["chosen"] = {"plain": 0.0, "ridge": 1.0, "refined": 2.0}[best]
    return {"plain": None, "ridge": (w0, b0), "refined": (w, b)}[best], report


def _refine(
    runner: Any,
    x: torch.Tensor,
    t: torch.Tensor,
    vocab: torch.Tensor | None,
    w0: torch.Tensor,
    b0: torch.Tensor,
    *,
    steps: int,
    batch: int,
    lr: float,
    seed: int,
    progress: Callable[[Iterable[Any]], Iterable[Any]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Adam on the cross-entropy of the exit logits (over ``vocab``) against the greedy targets."""
    head = runner.lm_head
    with runner.loaded(head):  # an LM head offloaded to disk: read once for the fit
        emb = head.weight.detach()  # kept after the block: the loaded values stay valid
    if vocab is not None:
        pos = torch.full((emb.shape[0],), -1, dtype=torch.long)
        pos[vocab.cpu()] = torch.arange(vocab.numel())
        tv = pos[t.cpu()].to(t.device)
        keep = tv >= 0  # a target outside the subset cannot be guessed: no signal
        x, tv = x[keep], tv[keep]
        emb = emb.index_select(0, vocab)
    else:
        tv = t
    if steps <= 0 or x.shape[0] == 0:
        return w0, b0
    norm = runner.final_norm
    flags = [p.requires_grad for p in norm.parameters()]
    for p in norm.parameters():
        p.requires_grad_(False)
    x = x.clone()  # a normal tensor (the captures are inference tensors)
    emb = emb.clone()
    w = w0.clone().requires_grad_(True)
    b = b0.clone().requires_grad_(True)
    opt = torch.optim.Adam([w, b], lr=lr)
    gen = torch.Generator().manual_seed(seed)
    try:
        with torch.enable_grad():
            for _ in progress(range(steps)):
                idx = torch.randint(0, x.shape[0], (min(batch, x.shape[0]),), generator=gen).to(
                    x.device
                )
                logits = norm(x[idx] @ w + b) @ emb.T  # [B, K]
                loss = torch.nn.functional.cross_entropy(logits.float(), tv[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
    finally:
        for p, f in zip(norm.parameters(), flags):
            p.requires_grad_(f)
    return w.detach(), b.detach()


def top_vocab(counts: torch.Tensor, size: int, must: torch.Tensor | None = None) -> torch.Tensor:
    """The ``size`` most frequent token ids by ``counts`` ``[V]``, plus every id in ``must``;
    sorted."""
    ids = torch.argsort(counts, descending=True, stable=True)[: max(0, size)]
    if must is not None:
        ids = torch.cat([ids, must.reshape(-1).cpu()])
    return torch.unique(ids)
