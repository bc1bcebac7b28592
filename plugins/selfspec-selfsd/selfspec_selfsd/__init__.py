"""Draft & Verify (Zhang et al., ACL 2024) as a selfspec plugin.

The model drafts for itself with a fixed set of attention and MLP blocks skipped, one token at
a time, until ``num_draft`` tokens (the paper's K) or until the draft's top probability falls
below the threshold gamma (adaptive, Algorithm 3); the full model then verifies the chain in one
forward. The skip set comes from a profile tuned by Bayesian optimisation (``specdec --plugin
selfsd tune``), a shipped profile for the default model, or a documented heuristic.
"""

from __future__ import annotations

import sys
from typing import Any

import selfspec
from selfspec import (
    Draft,
    Layers,
    Option,
    TreeConfig,
    check_layers,
    format_layers,
    model_identity,
    register_draft_options,
    register_tree_options,
    resolve_profile,
    skip_layer_draft,
    skip_layer_step,
    verify_from_layer,
)

from .policy import Threshold

__all__ = ["SelfSD", "Threshold"]


def _unit(x: float) -> str | None:
    return None if 0.0 <= x <= 1.0 else "must lie in [0, 1]"


class SelfSD:
    """One instance per decoder: the skip set, the threshold and the per-decode logs."""

    #: Joins compositions (``lookup+selfsd``): its verifier is only a shortcut (verifying from the
    #: first skipped layer) and its policy reads nothing that verifier leaves.
    composable = True

    def __init__(self) -> None:
        self.num_draft = 12
        self.skip_attn: tuple[int, ...] = ()
        self.skip_mlp: tuple[int, ...] = ()
        self.reuse = True
        # the draft model's weights (host's draft_weights)
        self.weights: selfspec.DraftWeights | None = None
        self.threshold = Threshold()
        self.tree = TreeConfig()  # tree drafts (the host's draft_tree), off by default
        self.source = ""  # where the skip set came from: a profile path, "heuristic", "options"
        self.note: str | None = None  # said once on stderr when falling back to the heuristic
        # length of this step's draft (set in propose: a composition never calls verify)
        self.drafted = 0
        self.log: list[tuple[int, int]] = []  # per step of the last decode: (drafted, accepted)
        self.gammas: list[float] = []  # gamma before every step of the last decode
        self._first_skip = 0

    # ------------------------------------------------------------------------------ options
    @selfspec.hookimpl
    def selfspec_options(self, register) -> None:
        register(
            Option(
                "num_draft", int, 12, "most draft tokens per step (the paper's K)", min=1, max=64
            )
        )
        register(
            Option(
                "gamma",
                float,
                0.6,
                "draft-exit threshold gamma (its start value when adaptive)",
                check=_unit,
            )
        )
        register(Option("adaptive", bool, True, "adapt gamma to the acceptance rate (Algorithm 3)"))
        register(
            Option("alpha", float, 0.9, "target acceptance rate of the gamma update", check=_unit)
        )
        register(Option("epsilon", float, 0.01, "gamma update step", min=0.0, max=1.0))
        register(Option("beta1", float, 0.5, "smoothing of the acceptance rate", check=_unit))
        register(Option("beta2", float, 0.9, "smoothing of gamma", check=_unit))
        register(
            Option(
                "profile",
                str,
                "auto",
                "skip-set profile: 'auto' (tuned or shipped for this model, else the heuristic), "
                "'none' (the heuristic; 'heuristic' is the same), or a profile JSON path",
            )
        )
        register(
            Option(
                "skip_attn",
                Layers,
                None,
                "attention blocks to skip, e.g. '15-28' (overrides the profile)",
            )
        )
        register(
            Option(
                "skip_mlp", Layers, None, "MLP blocks to skip, e.g. '16,18' (overrides the profile)"
            )
        )
        register(
            Option(
                "reuse",
                bool,
                True,
                "verify from the first skipped layer on, reusing the draft's exact lower-layer "
                "states (only when the draft runs the model's own weights: draft_weights=none)",
            )
        )
        register_draft_options(register)  # draft_weights, draft_vocab: the host's defaults
        register_tree_options(register)  # tree, tree_budget, tree_topk, tree_calibrate

    @selfspec.hookimpl
    def selfspec_setup(self, runner, options: dict[str, Any], tokenizer: Any = None) -> None:
        self.num_draft = options["num_draft"]
        vocab = selfspec.draft_vocab(runner, options["draft_vocab"], tokenizer)
        self.weights = selfspec.draft_weights(runner, options["draft_weights"], vocab)
        # compressed layers change every state, so none is exact for verification to reuse
        self.reuse = options["reuse"] and not self.weights.layers
        self.threshold = Threshold(
            gamma0=options["gamma"],
            epsilon=options["epsilon"],
            beta1=options["beta1"],
            beta2=options["beta2"],
            alpha=options["alpha"],
            adaptive=options["adaptive"],
        )
        L = runner.n_layers
        attn_o = check_layers(options["skip_attn"], L, "skip_attn")
        mlp_o = check_layers(options["skip_mlp"], L, "skip_mlp")
        attn: tuple[int, ...] = ()
        mlp: tuple[int, ...] = ()
        if attn_o is None or mlp_o is None:  # the profile supplies what the options do not
            attn, mlp, self.source, self.note = _resolve_profile(options["profile"], runner)
            if self.note:
                print(f"selfsd: {self.note}", file=sys.stderr)
        else:
            self.source = "options"
        self.set_skips(attn if attn_o is None else attn_o, mlp if mlp_o is None else mlp_o, L)
        # with the draft passes' curve
        self.tree = TreeConfig.from_options(options, runner, weights=self.weights)

    @selfspec.hookimpl
    def selfspec_commands(self, register) -> None:
        from .tune import commands

        for command in commands():
            register(command)

    # ------------------------------------------------------------------------------ decode
    @selfspec.hookimpl
    def selfspec_start(self, state: selfspec.DecodeState) -> None:
        self.threshold.reset()
        self.log = []
        self.gammas = []

    @selfspec.hookimpl
    def selfspec_propose(self, state: selfspec.DecodeState) -> Draft:
        runner = state.runner
        base = state.length - 1  # the pending token's slot
        kmax = min(self.num_draft, state.max_draft_depth)
        self.gammas.append(self.threshold.gamma)
        self.drafted = 0
        if kmax <= 0:
            return Draft.empty(runner.device)
        # a dynamic tree from the same draft model, verified by the host's verify_tree
        if self.tree.enabled:
            L = runner.n_layers
            step = skip_layer_step(
                runner,
                state.cache,
                skip_attn=self.skip_attn,
                skip_mlp=self.skip_mlp,
                weights=self.weights,
            )
            # blocks the draft runs
            share = 1.0 - (len(self.skip_attn) + len(self.skip_mlp)) / (2 * L)
            # on the draft weights: as measured against a full forward
            cost = self.tree.pass_cost(share)
            tree = self.tree.draft(step, state, max_depth=kmax, draft_cost=cost).draft(owner=self)
            self.drafted = len(tree)  # within the depth and room the host keeps: never cut
            return tree
        f = self._first_skip
        reuse = self.reuse and 0 < f
        # the draft model writes keys/values at slots base.. in the layers whose attention runs;
        # skipped layers keep base valid slots and are never viewed past them. It stops after a
        # token whose probability is below gamma (Algorithm 3, line 5); that token is verified too
        out = skip_layer_draft(
            runner,
            state.cache,
            state.tokens[base : base + 1],
            base,
            max_tokens=kmax,
            skip_attn=self.skip_attn,
            skip_mlp=self.skip_mlp,
            exit_below=self.threshold.gamma,
            capture=f if reuse else None,
            pick=state.pick,
            weights=self.weights,
        )
        self.drafted = len(out.tokens)  # at most kmax: the host never cuts it
        # the exact input of layer f of every token run, for verification from layer f
        return Draft(out.tokens, meta={"hidden": out.captured} if reuse else {}, owner=self)

    @selfspec.hookimpl
    def selfspec_verify(self, state: selfspec.DecodeState, draft: Draft) -> selfspec.Verdict | None:
        hidden = draft.meta.get("hidden") if draft.is_from(self) else None
        if (
            not self.reuse
            or not hidden
            or draft.parents is not None
            or state.capture_layers
            or len(draft) == 0
        ):
            return None  # the host's greedy verifier
        # layers below the first skipped block ran unchanged in the draft: verify from there
        return verify_from_layer(state, draft, hidden, self._first_skip)

    @selfspec.hookimpl
    def selfspec_update_policy(
        self, state: selfspec.DecodeState, verdict: selfspec.Verdict
    ) -> None:
        # tree drafts: learn how often nodes of each draft probability pass
        self.tree.observe(verdict)
        self.log.append((self.drafted, len(verdict.accepted)))
        self.threshold.update(self.drafted, len(verdict.accepted))

    # ------------------------------------------------------------------------------ helpers
    def set_skips(self, skip_attn, skip_mlp, n_layers: int) -> None:
        """Use this skip set from now on (the tuner changes it between trials)."""
        self.skip_attn = tuple(sorted(set(int(i) for i in skip_attn)))
        self.skip_mlp = tuple(sorted(set(int(i) for i in skip_mlp)))
        skipped = set(self.skip_attn) | set(self.skip_mlp)
        self._first_skip = min(skipped) if skipped else n_layers


def _resolve_profile(
    spec: str, runner: Any
) -> tuple[tuple[int, ...], tuple[int, ...], str, str | None]:
    """``(skip_attn, skip_mlp, source, note)`` for the ``profile`` option."""
    from . import profiles

    L = runner.n_layers
    spec = "none" if spec.strip().lower() == "heuristic" else spec
    identity = model_identity(runner)
    path = resolve_profile(spec, profiles.STORE, profiles.file_name(identity))
    if path is None:
        attn, mlp = profiles.heuristic(L)
        note = None
        if spec.strip().lower() != "none":
            note = (
                f"no tuned profile for this model ({identity.key}); using the heuristic "
                f"skip set (attention {format_layers(attn)}, MLP {format_layers(mlp)}). "
                f"Run `specdec --plugin selfsd tune` to find a better one."
            )
        return attn, mlp, "heuristic", note
    prof = profiles.load(path, identity.as_dict())
    return prof.skip_attn, prof.skip_mlp, prof.source, None
