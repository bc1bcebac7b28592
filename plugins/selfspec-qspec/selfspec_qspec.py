"""Quantized self-drafting: the model drafts for itself with *every* layer, on a low-precision
copy of its own weights, and the full-precision model verifies.

The idea of QSpec (Zhao et al. 2024), ML-SpecQD (Georganas et al. 2025, on CPUs) and QuantSpec
(Tiwari et al. 2025): a quantized copy of the target computes almost the same function, so its
greedy tokens agree with the target's most of the time, while a forward on int8 weights reads a
quarter of the bytes. Here the copy is the host's shared draft weights
(:func:`selfspec.draft_weights`: ``int8`` dynamic quantization, or whatever ``auto`` measured
fastest on this machine), so a composition with a layer-skipping drafter shares it. The draft is
a tree (the host's :func:`selfspec.draft_tree` sized by the measured cost curve) or, with
``tree=0``, a chain that stops at the first token whose draft probability is below ``exit``.
Verification is the host's, so the output is exactly the full model's.
"""

from __future__ import annotations

from typing import Any

import selfspec
from selfspec import Draft, Option, TreeConfig, register_draft_options, register_tree_options


class QSpec:
    """One instance per decoder: the draft weights and the tree's online calibration."""

    composable = True  # proposes only: the host's verifier and cache handling

    def __init__(self) -> None:
        self.num_draft = 8
        self.exit = 0.3
        self.weights: selfspec.DraftWeights | None = None
        self.tree = TreeConfig()
        self.draft_cost = 1.0  # a draft pass's cost in full forwards (set in setup)

    @selfspec.hookimpl
    def selfspec_options(self, register) -> None:
        register(Option("num_draft", int, 8, "deepest draft per step", min=1, max=64))
        register(
            Option(
                "exit",
                float,
                0.3,
                "chain drafts (tree=0): stop after a token whose draft probability is below this",
                min=0.0,
                max=1.0,
            )
        )
        # draft_weights (auto: the host's measured choice), draft_vocab
        register_draft_options(register)
        register_tree_options(register)  # tree, tree_budget, tree_topk, tree_calibrate

    @selfspec.hookimpl
    def selfspec_setup(self, runner, options: dict[str, Any], tokenizer: Any = None) -> None:
        if options["draft_weights"] == "none":
            raise ValueError(
                "qspec drafts on compressed weights: draft_weights=none would draft with the "
                "full model itself (auto, or a registered draft format: int8, int8-weights, "
                "int4, bf16 on a CPU; bf16 or bnb-int8 on CUDA)"
            )
        self.num_draft = options["num_draft"]
        self.exit = options["exit"]
        vocab = selfspec.draft_vocab(runner, options["draft_vocab"], tokenizer)
        self.weights = selfspec.draft_weights(runner, options["draft_weights"], vocab)
        # auto where the host has no compressed copy (CUDA without bnb)
        if self.weights.backend == "none":
            self.weights = selfspec.draft_weights(runner, "bf16", vocab)
        # with the draft passes' curve
        self.tree = TreeConfig.from_options(options, runner, weights=self.weights)
        # measured where it can be
        self.draft_cost = self.tree.pass_cost(1.0, default=self._bytes_share(runner))

    @selfspec.hookimpl
    def selfspec_propose(self, state: selfspec.DecodeState) -> Draft:
        runner = state.runner
        kmax = min(self.num_draft, state.max_draft_depth)
        if kmax <= 0:
            return Draft.empty(runner.device)
        if self.tree.enabled:
            step = selfspec.skip_layer_step(runner, state.cache, weights=self.weights)
            return self.tree.draft(step, state, max_depth=kmax, draft_cost=self.draft_cost).draft(
                owner=self
            )
        base = state.length - 1
        out = selfspec.skip_layer_draft(
            runner,
            state.cache,
            state.tokens[base : base + 1],
            base,
            max_tokens=kmax,
            exit_below=self.exit,
            pick=state.pick,
            weights=self.weights,
        )
        return Draft(out.tokens, owner=self)

    @selfspec.hookimpl
    def selfspec_update_policy(
        self, state: selfspec.DecodeState, verdict: selfspec.Verdict
    ) -> None:
        self.tree.observe(verdict)  # tree drafts: how often nodes of each draft probability pass

    # ------------------------------------------------------------------------------ helpers
    def _bytes_share(self, runner) -> float:
        """A draft token's cost in full forwards where it is not measured (a fixed tree budget):
        the draft weights' bytes over the model's layers' (a forward on a CPU is bound by the
        weights it reads), the layers' weights counted in any layout (parameters, or the buffers a
        laid-out product holds)."""
        full = sum(
            t.numel() * t.element_size()
            for layer in runner.layers
            for t in [*layer.parameters(), *layer.buffers()]
            if t.dim() >= 2
        )
        return (
            min(1.0, max(0.05, self.weights.layer_bytes / full))
            if full and self.weights.layers
            else 1.0
        )
