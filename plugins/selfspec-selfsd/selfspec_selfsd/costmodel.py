"""A deterministic cost model of drafting + verification, for the skip-set search.

Per-block costs are measured once on the model (one token over a short cached prefix):
an attention block, an MLP block, the embedding + final norm + LM head (``head``), and a
full verification forward over ``q = 1..K+1`` tokens. A decode's cost is then

    sum over steps of (drafted_s * draft_token_cost(z) + verify[drafted_s + 1])

where ``draft_token_cost(z) = head + attn * (attention blocks run) + mlp * (MLP blocks run)``.
The draft blocks and head are timed on the weights the draft reads (the host's draft weights,
``draft_weights``: an int8 draft token costs about half a float32 one at 1.5B, so the best skip
set skips fewer blocks), the verification forwards on the model's own.
Divided by the committed tokens and by ``verify[1]`` (one plain greedy step), it is the cost
per token relative to vanilla decoding: below 1 means faster. Greedy decoding makes the
drafted/accepted counts of a skip set deterministic, so the objective is too.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class BlockCosts:
    """Seconds: one attention block, one MLP block (1 token, averaged over the layers), the
    embedding + head of one token, and ``verify[q-1]`` = a full forward over ``q`` tokens."""

    n_layers: int
    attn: float
    mlp: float
    head: float
    verify: tuple[float, ...]
    meta: dict[str, Any] | None = None

    def draft_token(self, skip_attn: Sequence[int], skip_mlp: Sequence[int]) -> float:
        """Cost of one draft forward with these blocks skipped."""
        run_attn = self.n_layers - len(set(skip_attn))
        run_mlp = self.n_layers - len(set(skip_mlp))
        return self.head + self.attn * run_attn + self.mlp * run_mlp

    def verify_cost(self, q: int) -> float:
        """A full forward over ``q`` tokens (linear extrapolation past the measured sizes)."""
        v = self.verify
        if q <= len(v):
            return v[q - 1]
        slope = (v[-1] - v[-2]) if len(v) > 1 else v[-1]
        return v[-1] + slope * (q - len(v))

    def relative_cost(
        self,
        steps: Sequence[tuple[int, int]],
        skip_attn: Sequence[int],
        skip_mlp: Sequence[int],
        reuse: bool = False,
    ) -> float:
        """Cost per committed token relative to vanilla, for ``steps`` = ``(drafted, committed)``.

        With ``reuse`` (the plugin's default), a step with drafts verifies only the layers from
        the first skipped one ``f`` on over ``k+1`` tokens and runs layers ``[0, f)`` for one
        token: ``(1 - f/L) * verify[k+1] + f/L * verify[1]``, taking layers as equally costly."""
        committed = sum(c for _, c in steps)
        if committed == 0:
            return float("inf")
        d = self.draft_token(skip_attn, skip_mlp)
        skipped = set(skip_attn) | set(skip_mlp)
        share = (min(skipped) if skipped else self.n_layers) / self.n_layers if reuse else 0.0
        total = 0.0
        for k, _ in steps:
            verify = self.verify_cost(k + 1)
            if k and share:
                verify = (1 - share) * verify + share * self.verify[0]
            total += k * d + verify
        return total / committed / self.verify[0]

    def save(self, path: Path) -> None:
        from selfspec import ArtefactStore

        ArtefactStore.save(
            path, lambda tmp: tmp.write_text(json.dumps(asdict(self), indent=1) + "\n")
        )

    @classmethod
    def load(cls, path: Path) -> BlockCosts:
        d = json.loads(path.read_text())
        return cls(
            int(d["n_layers"]),
            float(d["attn"]),
            float(d["mlp"]),
            float(d["head"]),
            tuple(float(x) for x in d["verify"]),
            d.get("meta"),
        )


def measure(
    runner: Any, max_q: int = 13, prefix: int = 64, reps: int = 7, weights: Any = None
) -> BlockCosts:
    """Time the blocks of ``runner``'s model (medians of ``reps`` runs after a warm-up).

    ``weights``: the :class:`selfspec.DraftWeights` draft forwards read (``None``: the model's
    own); the attention, MLP and head costs are timed on them, ``verify`` on the model's own."""
    import torch

    L = runner.n_layers
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, runner.vocab_size, (prefix + max_q,), generator=g).to(runner.device)
    cache = runner.new_cache(prefix + max_q + 1)
    runner.forward(ids[:prefix], cache=cache, start=0, logits=None)
    every = tuple(range(L))

    def timed(
        q: int, skip_attn: Sequence[int] = (), skip_mlp: Sequence[int] = (), draft: bool = False
    ) -> float:
        times = []
        for r in range(reps + 1):
            t0 = time.perf_counter()
            runner.forward(
                ids[prefix : prefix + q],
                cache=cache,
                start=prefix,
                skip_attn=skip_attn,
                skip_mlp=skip_mlp,
                logits="all",
                weights=weights if draft else None,
            )
            if runner.device.type == "cuda":
                torch.cuda.synchronize()
            if r:
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    full = timed(1)
    # the same forward: time it once
    draft_full = full if weights_name(weights) == "none" else timed(1, draft=True)
    no_attn = timed(1, skip_attn=every, draft=True)
    no_mlp = timed(1, skip_mlp=every, draft=True)
    none = timed(1, skip_attn=every, skip_mlp=every, draft=True)
    verify = [full] + [timed(q) for q in range(2, max_q + 1)]
    return BlockCosts(
        L,
        max(0.0, (draft_full - no_attn) / L),
        max(0.0, (draft_full - no_mlp) / L),
        none,
        tuple(verify),
        {
            "prefix": prefix,
            "reps": reps,
            "threads": torch.get_num_threads(),
            "dtype": str(runner.dtype),
            "layout": runner.weight_layout,
            "draft_weights": weights_name(weights),
        },
    )


def costs_for(
    runner: Any, identity_key: str, *, remeasure: bool = False, max_q: int = 13, weights: Any = None
) -> BlockCosts:
    """The stored block costs of this model/dtype/threads/layout/draft weights, measured on first
    use."""
    import torch

    from .profiles import STORE

    draft = weights_name(weights)
    suffix = "" if draft == "none" else f"-draft-{draft}"
    name = (
        f"{identity_key}-{str(runner.dtype).replace('torch.', '')}-{runner.weight_layout}"
        f"-t{torch.get_num_threads()}{suffix}.json"
    )
    path = STORE.path("costs", name)
    if path.is_file() and not remeasure:
        c = BlockCosts.load(path)
        if len(c.verify) >= max_q:
            return c
    c = measure(runner, max_q=max_q, weights=weights)
    c.save(path)
    return c


def weights_name(weights: Any) -> str:
    """``none`` for the model's own weights, else the backend (and draft vocabulary size)."""
    if weights is None or (not weights.layers and weights.head_module is None):
        return "none"
    return weights.backend if weights.vocab is None else f"{weights.backend}-v{len(weights.vocab)}"
