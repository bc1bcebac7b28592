"""FractalLLM as a selfspec plugin: compressed (8-bit) copies of the model's own layers,
injected before ``n`` of its layers, draft ``w + n + 1`` tokens in one pass; the host's
plain full forward verifies them, so the output is exactly greedy decoding.

The compressed copy is the host's draft weights (:func:`selfspec.draft_weights`, shared with
every other plugin over the model); :mod:`.draft` is the draft pass.
"""

from __future__ import annotations

from typing import Any

import selfspec
from selfspec import DRAFT_WEIGHTS, Draft, Layers, Option, check_layers

KV_MODES = ("shared", "none")
#: Default number of fractal layers. The paper uses n = L/4 with w = n (Appendix D). On a CPU
#: (lab/results/logs/fractal.md) w = 0 beats every w > 0, and n = 4 is the fastest n measured on
#: Qwen2.5-Coder-1.5B (AVX-512 and AVX2 CPUs), while on SmolLM2-135M every n from 1 to 4 is within
#: noise of the others; the paper's n = L/4 = 7 is slower on both.
DEFAULT_N = 4


class Fractal:
    """One instance per decoder: the compressed model is built once in ``selfspec_setup``."""

    def __init__(self) -> None:
        self.dw = None  # selfspec.DraftWeights
        self.positions: list[int] = []
        self.w = 0
        self.kv = "shared"

    @selfspec.hookimpl
    def selfspec_options(self, register) -> None:
        register(
            Option(
                "n",
                int,
                None,
                "number of fractal layers (default: 4, the best measured on CPU; "
                "the paper's is a quarter of the layers)",
                min=0,
                max=4096,
            )
        )
        register(
            Option(
                "w",
                int,
                0,
                "draft window: placeholder tokens appended per pass (the paper's default "
                "is w = n; 0 measured best on CPU)",
                min=0,
                max=64,
            )
        )
        register(
            Option(
                "positions",
                Layers,
                None,
                "0-based indices of the layers the fractal layers run before, e.g. '3,7' or '3-5' "
                "(default: evenly spaced, every L//n-th layer)",
            )
        )
        register(
            Option(
                "draft_weights",
                str,
                "auto",
                "the host's compressed draft weights the injected copy runs: auto (the fastest "
                "copy measured here; a 4-bit one only if its agreement with the model is worth "
                "its speed; bnb-int8 on CUDA), a registered draft format (int8, int8-weights, "
                "int4, bf16, bnb-int8, ...; `specdec plugins` lists them), none (the model's own "
                "weights: a control)",
                choices=DRAFT_WEIGHTS,
            )
        )
        register(
            Option(
                "draft_vocab",
                int,
                0,
                "draft vocabulary: the compressed head "
                "projects onto the N most frequent tokens of the corpus (0: all)",
                min=0,
            )
        )
        register(
            Option(
                "kv",
                str,
                "shared",
                "KV cache of the draft pass: shared (the committed prefix's cache, work ~ new "
                "tokens) or none (recompute the sequence every pass, as in the paper)",
                choices=KV_MODES,
            )
        )

    @selfspec.hookimpl
    def selfspec_setup(self, runner, options: dict[str, Any], tokenizer: Any = None) -> None:
        from . import draft

        L = runner.n_layers
        n, w = options["n"], options["w"]
        # sorted, distinct (the host's layers type)
        pos = check_layers(options["positions"], L, "positions")
        if pos:
            if n is not None and n != len(pos):
                raise ValueError(f"n={n} but {len(pos)} positions were given")
            positions = list(pos)
        else:
            n = min(DEFAULT_N, L) if n is None else n
            if n > L:
                raise ValueError(f"n={n} fractal layers but the model has only {L} layers")
            positions = draft.evenly_spaced(L, n)
        self.positions = positions
        self.w = w
        self.kv = options["kv"]
        # draft_weights wins unless left at auto; then the old alias (default auto) decides
        kind = options["draft_weights"]
        vocab = selfspec.draft_vocab(runner, options["draft_vocab"], tokenizer)
        self.dw = selfspec.draft_weights(runner, kind, vocab)

    @selfspec.hookimpl
    def selfspec_propose(self, state: selfspec.DecodeState) -> Draft:
        from .draft import draft_pass

        depth = state.max_draft_depth
        # a pass drafts w + n + 1 tokens and runs rows up to w + n positions past the pending
        # token: draft no more than the host keeps (within the budget, so within the model's
        # positions), shrinking the window first (the least accurate part), then running only
        # the first fractal layers. Without a fractal layer the pass's one token is the
        # verification's own bonus token: no draft.
        w = max(0, min(self.w, depth - len(self.positions) - 1))
        positions = self.positions[: max(0, depth - w - 1)]
        if not positions or state.length - 1 + w + len(positions) + 2 > state.cache.capacity:
            return Draft.empty(state.runner.device)
        tokens = draft_pass(
            state.runner,
            self.dw,
            state.cache,
            state.committed,
            positions,
            w,
            self.kv,
            pick=state.pick,
        )
        return Draft(tokens)


__all__ = ["Fractal"]
