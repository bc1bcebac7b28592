"""Draft & Verify (Zhang et al., ACL 2024) as a selfspec plugin.

The model drafts for itself with a fixed set of attention and MLP blocks skipped, one token at
a time, until ``k`` tokens or until the draft's top probability falls below the threshold
gamma (adaptive, Algorithm 3); the full model then verifies the chain in one forward. The skip
set comes from a profile tuned by Bayesian optimisation (``specdec --plugin selfsd tune``), a
shipped profile for the default model, or a documented heuristic.
"""

from __future__ import annotations

import sys
from typing import Any

import selfspec
from selfspec import Draft, Option

from .policy import Threshold

__all__ = ["SelfSD", "Threshold"]


def _unit(x: float) -> str | None:
    return None if 0.0 <= x <= 1.0 else "must lie in [0, 1]"


class SelfSD:
    """One instance per decoder: the skip set, the threshold and the per-decode logs."""

    def __init__(self) -> None:
        self.k = 12
        self.skip_attn: tuple[int, ...] = ()
        self.skip_mlp: tuple[int, ...] = ()
        self.reuse = True
        self.threshold = Threshold()
        self.source = ""  # where the skip set came from: a profile path, "heuristic", "options"
        self.note: str | None = None  # said once on stderr when falling back to the heuristic
        self.drafted = 0  # length of the draft being verified (after the host's cut)
        self.log: list[tuple[int, int]] = []  # per step of the last decode: (drafted, accepted)
        self.gammas: list[float] = []  # gamma before every step of the last decode
        self._first_skip = 0

    # ------------------------------------------------------------------------------ options
    @selfspec.hookimpl
    def selfspec_options(self, register) -> None:
        register(Option("k", int, 12, "most draft tokens per step (K)", min=1, max=64))
        register(Option("gamma", float, 0.6, "draft-exit threshold gamma (its start value when adaptive)", check=_unit))
        register(Option("adaptive", bool, True, "adapt gamma to the acceptance rate (Algorithm 3)"))
        register(Option("alpha", float, 0.9, "target acceptance rate of the gamma update", check=_unit))
        register(Option("epsilon", float, 0.01, "gamma update step", min=0.0, max=1.0))
        register(Option("beta1", float, 0.5, "smoothing of the acceptance rate", check=_unit))
        register(Option("beta2", float, 0.9, "smoothing of gamma", check=_unit))
        register(Option("profile", str, "auto",
                        "skip-set profile: 'auto' (tuned or shipped for this model, else the heuristic), "
                        "'heuristic', or a profile JSON path"))
        register(Option("skip_attn", str, None, "attention blocks to skip, e.g. '15-28' (overrides the profile)"))
        register(Option("skip_mlp", str, None, "MLP blocks to skip, e.g. '16,18' (overrides the profile)"))
        register(Option("reuse", bool, True,
                        "verify from the first skipped layer on, reusing the draft's exact lower-layer states"))

    @selfspec.hookimpl
    def selfspec_setup(self, runner, options: dict[str, Any]) -> None:
        from . import profiles

        self.k = options["k"]
        self.reuse = options["reuse"]
        self.threshold = Threshold(gamma0=options["gamma"], epsilon=options["epsilon"], beta1=options["beta1"],
                                   beta2=options["beta2"], alpha=options["alpha"], adaptive=options["adaptive"])
        L = runner.n_layers
        attn_o = profiles.parse_layers(options["skip_attn"], L, "skip_attn")
        mlp_o = profiles.parse_layers(options["skip_mlp"], L, "skip_mlp")
        attn: tuple[int, ...] = ()
        mlp: tuple[int, ...] = ()
        if attn_o is None or mlp_o is None:  # the profile supplies what the options do not
            attn, mlp, self.source, self.note = _resolve_profile(options["profile"], runner)
            if self.note:
                print(f"selfsd: {self.note}", file=sys.stderr)
        else:
            self.source = "options"
        self.set_skips(attn if attn_o is None else attn_o, mlp if mlp_o is None else mlp_o, L)

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
        runner, cache = state.runner, state.cache
        base = state.length - 1  # the pending token's slot
        kmax = min(self.k, state.max_draft_depth)
        self.gammas.append(self.threshold.gamma)
        if kmax <= 0:
            return Draft.empty(runner.device)
        f = self._first_skip
        capture = (f,) if self.reuse and 0 < f else ()
        tok = state.tokens[base : base + 1]  # tok: [1]
        tokens: list[int] = []
        hidden: list = []  # the exact input of layer f of every token run, for verification
        gamma = self.threshold.gamma
        for i in range(kmax):
            # a) the draft model writes keys/values at slot base+i in the layers whose attention
            # runs; skipped layers keep base valid slots and are never viewed past them
            out = runner.forward(tok, cache=cache, start=base + i, skip_attn=self.skip_attn,
                                 skip_mlp=self.skip_mlp, capture=capture, logits="last")
            if capture:
                hidden.append(out.captured[f][0])  # [H]
            logits = out.logits[-1]  # [V]
            top, idx = logits.max(-1)
            p_top = float(1.0 / (logits - top).exp().sum())  # the draft's top probability
            nxt = int(idx)
            tokens.append(nxt)
            if p_top < gamma:  # draft exit (Algorithm 3, line 5); the token is still verified
                break
            tok = idx.reshape(1)
        meta = {"selfsd_hidden": hidden} if capture else {}
        return Draft.chain(tokens, device=runner.device, **meta)

    @selfspec.hookimpl
    def selfspec_verify(self, state: selfspec.DecodeState, draft: Draft) -> selfspec.Verdict | None:
        self.drafted = len(draft)
        hidden = draft.meta.get("selfsd_hidden")
        if not self.reuse or not hidden or draft.parents is not None or state.capture_layers or len(draft) == 0:
            return None  # the host's greedy verifier
        return _verify_from(state, draft, hidden, self._first_skip)

    @selfspec.hookimpl
    def selfspec_update_policy(self, state: selfspec.DecodeState, verdict: selfspec.Verdict) -> None:
        self.log.append((self.drafted, len(verdict.accepted)))
        self.threshold.update(self.drafted, len(verdict.accepted))

    # ------------------------------------------------------------------------------ helpers
    def set_skips(self, skip_attn, skip_mlp, n_layers: int) -> None:
        """Use this skip set from now on (the tuner changes it between trials)."""
        self.skip_attn = tuple(sorted(set(int(i) for i in skip_attn)))
        self.skip_mlp = tuple(sorted(set(int(i) for i in skip_mlp)))
        skipped = set(self.skip_attn) | set(self.skip_mlp)
        self._first_skip = min(skipped) if skipped else n_layers


def _resolve_profile(spec: str, runner: Any) -> tuple[tuple[int, ...], tuple[int, ...], str, str | None]:
    """``(skip_attn, skip_mlp, source, note)`` for the ``profile`` option."""
    from . import profiles

    L = runner.n_layers
    if spec == "heuristic":
        return (*profiles.heuristic(L), "heuristic", None)
    identity = profiles.model_identity(runner)
    if spec == "auto":
        prof = profiles.find(identity)
        if prof is None:
            attn, mlp = profiles.heuristic(L)
            note = (f"no tuned profile for this model ({profiles.identity_key(identity)}); using the heuristic "
                    f"skip set (attention {profiles.format_layers(attn)}, MLP {profiles.format_layers(mlp)}). "
                    f"Run `specdec --plugin selfsd tune` to find a better one.")
            return attn, mlp, "heuristic", note
    else:
        prof = profiles.load(spec, identity)
    return prof.skip_attn, prof.skip_mlp, prof.source, None


def _verify_from(state: selfspec.DecodeState, draft: Draft, hidden: list, f: int) -> selfspec.Verdict:
    """Greedy verification of a chain that starts at layer ``f``.

    Layers below the first skipped block ``f`` ran unchanged in the draft, so the draft already
    computed the full model's input of layer ``f`` (and the keys/values of layers ``[0, f)``) for
    the pending token and every draft token it ran; only the last draft token still needs layers
    ``[0, f)``. The verdict is the built-in greedy verifier's: the longest matching prefix plus
    the full model's next token.
    """
    import torch

    from selfspec.builtin.verify import chain_verdict

    runner, cache = state.runner, state.cache
    base = state.length - 1
    n = len(draft)
    rows = list(hidden[: n + 1])  # inputs of layer f for [pending, d_1, ...]
    if len(rows) < n + 1:  # the last draft token was never run: layers [0, f) for it alone
        out = runner.forward(draft.tokens[n - 1 : n], cache=cache, start=base + n, layers=(0, f), logits=None)
        rows.append(out.hidden[0, 0])
    h = torch.stack(rows)[None]  # h: [1, n+1, H]
    out = runner.forward(hidden=h, cache=cache, start=base, layers=(f, runner.n_layers))
    return chain_verdict(draft, out.logits)  # logits: [n+1, V], the full model's after each input
