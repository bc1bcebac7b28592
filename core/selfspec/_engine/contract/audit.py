"""Audit mode: every step of a decode checked against the full model, as it happens.

With ``SELFSPEC_AUDIT=1`` (or ``Decoder(..., audit=True)``, and always inside
``selfspec.testing.assert_lossless``) the loop hands each step to an :class:`Auditor`, which
keeps a *shadow* KV cache filled only by plain full-model forwards of the committed tokens and
checks, at the step where a plugin goes wrong:

* after ``selfspec_propose``: the committed tokens and the committed KV slots ``[0, base)``
  are untouched (``base = state.length - 1``, the pending token's slot);
* after ``selfspec_verify``: every token the verdict commits (accepted drafts, then the bonus)
  is the full model's greedy token (under sampling: the argmax of its position-keyed perturbed
  logits, :mod:`selfspec._engine.contract.sampling`) given exactly the committed prefix, computed by
  one forward of ``[pending, accepted...]`` on the shadow cache (what the built-in greedy verifier
  decides for that path; a verifier may accept fewer tokens than it could, never a wrong one);
* after ``selfspec_cache`` and the commit: the runner's cache holds, slot by slot and layer by
  layer, the keys/values (and positions) the full forward wrote; the tokens buffer holds what
  was committed;
* after ``selfspec_update_policy``: the committed tokens and every committed KV slot again;
* after every hook (``selfspec_setup`` too, when the :class:`~selfspec.Decoder` is built in
  audit mode, and ``selfspec_end``): the model's weights are the ones it had before
  (:class:`WeightGuard`: the same parameters, no in-place write; on a model of up to
  :data:`EXACT_WEIGHTS` parameters also value for value after setup, start and end). The
  model is not the plugin's to change.

A failure raises :class:`AuditError` (a :class:`~selfspec._engine.contract.plugins.PluginError` and
an ``AssertionError``) naming the hook at fault, the step and the token. Steps are numbered as
``state.step`` reads while the hook runs: from 0, the same number for the propose, verify, cache and
update-policy hooks of one step (the commit between cache and update policy does not renumber it).
float64 is exact; in float32/bf16/float16 a different token is allowed only at a near-tie (the
shadow's top-1/top-2 margin within ``selfspec._engine.contract.tiebound.tie_bound``; under sampling
the margin of the perturbed logits, within the bound divided by the temperature, since the warping
scales rounding differences by ``1 / T``), counted in :attr:`Auditor.near_ties`, after which the
shadow follows the plugin's tokens.

A plugin that implements neither ``selfspec_verify`` nor ``selfspec_cache`` has its verdicts
and kept slots made by the host's own greedy verifier and commit: for it the auditor checks the
tokens and the committed KV after every propose (all a proposer can break) and mirrors the new
slots instead of recomputing them, so auditing costs little more than the comparisons.

The auditor also keeps a per-step log (:attr:`Auditor.steps`) that the testing kit reads to
measure what a property test exercised. Costs about one extra chain forward per step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from selfspec._engine.contract.plugins import PluginError
from selfspec._engine.contract.reference import greedy
from selfspec._engine.contract.tiebound import explain, tie_bound
from selfspec._engine.contract.types import DecodeState, Draft, Verdict
from selfspec._engine.runner.placement import loaded

#: (rtol, atol) of the KV comparison per dtype: forwards of different block shapes round
#: differently; a stale or shifted slot differs by O(1).
KV_TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1e-3, 1e-4),
    torch.bfloat16: (5e-2, 5e-2),
    torch.float16: (2e-2, 2e-2),
}


def audit_from_env() -> bool:
    """``SELFSPEC_AUDIT`` set to anything but ``""``/``0``/``false``/``no``."""
    return os.environ.get("SELFSPEC_AUDIT", "").strip().lower() not in ("", "0", "false", "no")


@dataclass(frozen=True)
class StepRecord:
    """What one step exercised: where it started, the draft's shape and what was accepted."""

    length: int  # committed tokens (prompt + output) at the start of the step
    generated: int  # output tokens at the start of the step
    drafted: int  # draft nodes after the host's cut
    depth: int  # deepest draft node
    tree: bool
    accepted: int
    committed: tuple[int, ...]


class LosslessError(AssertionError):
    """A plugin's output is not what greedy decoding of the same (untouched) model gives.

    Re-exported as :class:`selfspec.testing.LosslessError`: what ``assert_lossless`` raises.
    When the audit stopped the decode the error is its subclass :class:`AuditError`.
    """


class AuditError(PluginError, LosslessError):
    """The audit stopped a decode: a step broke losslessness (a wrong token or KV slot, a
    touched committed token, changed weights); the message names the plugin, the hook, the
    step and the token. A :class:`LosslessError` and a
    :class:`~selfspec._engine.contract.plugins.PluginError`: ``Decoder(audit=True)`` and
    ``specdec check --audit`` raise it as it is, ``selfspec.testing.assert_lossless`` with the
    example (prompt length, budget, options) added to its message."""


class Auditor:
    """Shadow-checks one decode; see the module docstring. One instance per ``generate``."""

    def __init__(
        self,
        plugin_name: str,
        plugin_hooks: list[str],
        tolerance: float | None = None,
        weights: WeightGuard | None = None,
    ) -> None:
        self.plugin_name = plugin_name
        self.weights = weights  # the model's weights before the plugin ran (None: not checked)
        self.step = 0  # state.step of the step under way (the commit increments state.step)
        self.passed: dict[
            tuple[int, int], torch.Tensor
        ] = {}  # (layer, keys/values): slots that passed
        self.seen = 0  # slots [0, seen) of self.passed hold what passed the KV check
        self.tolerance = tolerance  # near-tie tolerance; None: tiebound.tie_bound
        self.hooks = set(plugin_hooks)
        self.trusted = not self.hooks & {"selfspec_verify", "selfspec_cache"}  # host-made verdicts
        self.steps: list[StepRecord] = []
        self.near_ties = 0

    # ------------------------------------------------------------------ the loop's calls
    def start(self, state: DecodeState) -> None:
        """After prefill: build the shadow cache of the prompt but its last token."""
        runner = state.runner
        self.dtype = runner.dtype
        self.tokens = state.tokens[: state.length].clone()  # tokens: [length], what is committed
        self.shadow = runner.new_cache(state.cache.capacity)
        if state.length > 1:
            runner.forward(self.tokens[:-1], cache=self.shadow, start=0, logits=None)
        self._check_tokens(state, "selfspec_start")
        self._check_weights("selfspec_start", values=True)

    def proposed(self, state: DecodeState, draft: Draft) -> None:
        """After propose: committed tokens and KV slots ``[0, base)`` are as they were."""
        self.step = state.step
        self._check_weights("selfspec_propose")
        self._check_tokens(state, "selfspec_propose")
        self._check_kv(state, state.length - 1, "selfspec_propose")

    def verified(self, state: DecodeState, draft: Draft, verdict: Verdict) -> None:
        """After verify: every committed token is the full model's greedy token."""
        self._check_weights("selfspec_verify")
        self._check_tokens(state, "selfspec_verify")
        committed = verdict.committed
        depths = draft.depths()
        self.steps.append(
            StepRecord(
                state.length,
                state.generated,
                len(draft),
                max(depths, default=0),
                draft.is_tree,
                len(verdict.accepted),
                tuple(committed),
            )
        )
        if self.trusted:
            return
        base = state.length - 1
        ids = torch.cat(
            [
                self.tokens[-1:],
                torch.tensor(verdict.accepted, dtype=torch.long, device=self.tokens.device),
            ]
        )  # ids: [a+1]
        self.shadow.crop(base)
        out = state.runner.forward(ids, cache=self.shadow, start=base)
        logits = out.logits.to(torch.float32)  # [a+1, V]
        raw = logits  # the bound scales with the model's own logits, before any warping
        scale = 1.0
        if state.sampling_on:  # the target is the argmax of the perturbed logits
            assert state.sampler is not None
            at = torch.arange(state.length, state.length + logits.shape[0], device=logits.device)
            logits = state.sampler.perturb(logits, at)
            scale = 1.0 / state.sampler.sampling.temperature
        pred = greedy(logits).tolist()  # pred[i]: the model's token after ids[: i + 1]
        for i, (got, want) in enumerate(zip(committed, pred)):
            if got == want:
                continue
            top = torch.topk(logits[i], 2).values
            margin = float(top[0] - top[1])
            tol = tie_bound(self.dtype, raw[i]) if self.tolerance is None else self.tolerance
            tol = 0.0 if self.dtype == torch.float64 else tol * scale
            what = "bonus token" if i == len(committed) - 1 else f"accepted draft token {i}"
            if tol > 0 and margin <= tol and float(logits[i, got]) >= float(top[0]) - tol:
                self.near_ties += 1  # the shadow forward above already follows the plugin's path
                continue
            raise AuditError(
                self.plugin_name,
                (
                    f"selfspec_verify is lossy at step {self.step} "
                    f"(output token {state.generated + i}, "
                    f"{state.length + i} tokens in): its {what} is {got}, the full model's "
                    f"{'sampled' if state.sampling_on else 'greedy'} token "
                    f"is {want} ({explain(self.dtype, margin, tol)}); "
                    f"verdict accepted {list(verdict.accepted)} + "
                    f"bonus {verdict.bonus} of draft {draft.tokens.tolist()}"
                    f"{' (a tree)' if draft.is_tree else ''}"
                ),
            )

    def committed(self, state: DecodeState, new: list[int]) -> None:
        """After cache and commit: the tokens buffer and the runner's KV match the shadow."""
        base = self.tokens.shape[0] - 1
        self.tokens = torch.cat(
            [self.tokens, torch.tensor(new, dtype=torch.long, device=self.tokens.device)]
        )
        self._check_weights("selfspec_cache")
        self._check_tokens(state, "selfspec_cache")
        if self.trusted:  # the host's verifier wrote these slots over a checked prefix: mirror them
            end = min(state.cache.lengths)
            self._mirror(state, base, end)
        elif not state.finished:
            writers = [h for h in ("selfspec_verify", "selfspec_cache") if h in self.hooks] or [
                "selfspec_propose"
            ]
            self._check_kv(state, state.length - 1, " or ".join(writers))

    def updated(self, state: DecodeState) -> None:
        """After update policy: tokens, every committed KV slot and the weights as they were."""
        self._check_weights("selfspec_update_policy")
        self._check_tokens(state, "selfspec_update_policy")
        if not state.finished:
            self._check_kv(state, state.length - 1, "selfspec_update_policy")

    def member(self, state: DecodeState, name: str, hook: str) -> None:
        """A member of a composition finished ``hook`` (propose or update policy): the checks
        that follow the whole hook, run now and blamed on the member ``name``."""
        whole = self.plugin_name
        self.plugin_name = name
        try:
            if hook == "selfspec_propose":
                self.step = state.step
            self._check_weights(hook)
            self._check_tokens(state, hook)
            if not state.finished:
                self._check_kv(state, state.length - 1, hook)
        finally:
            self.plugin_name = whole

    def ended(self) -> None:
        """After ``selfspec_end``: the weights as they were."""
        self._check_weights("selfspec_end", values=True)

    def _mirror(self, state: DecodeState, start: int, end: int) -> None:
        cache, shadow = state.cache, self.shadow
        for i in range(cache.n_layers):
            for mine, ref in ((cache.keys[i], shadow.keys), (cache.values[i], shadow.values)):
                if mine is None:
                    continue
                if ref[i] is None or ref[i].shape != mine.shape:
                    ref[i] = torch.zeros_like(mine)
                ref[i][:, :, start:end] = mine[:, :, start:end]
            shadow.lengths[i] = end
        shadow.pos[start:end] = cache.pos[start:end]

    # ------------------------------------------------------------------ checks
    def _where(self, state: DecodeState, hook: str) -> str:
        return "before the first step" if hook == "selfspec_start" else f"at step {self.step}"

    def _check_weights(self, hook: str, values: bool = False) -> None:
        if self.weights is not None:
            self.weights.check(
                self.plugin_name,
                hook,
                "" if hook in ("selfspec_start", "selfspec_end") else f" at step {self.step}",
                values,
            )

    def _check_tokens(self, state: DecodeState, hook: str) -> None:
        n = self.tokens.shape[0]
        if state.length != n or not torch.equal(state.tokens[:n], self.tokens):
            bad = next(
                (
                    i
                    for i in range(min(n, state.length))
                    if int(state.tokens[i]) != int(self.tokens[i])
                ),
                min(n, state.length),
            )
            raise AuditError(
                self.plugin_name,
                (
                    f"{hook} changed the committed tokens {self._where(state, hook)}: "
                    f"position {bad} (the pending token is {n - 1}); "
                    "plugins must not write state.tokens or state.length"
                ),
            )

    def _check_kv(self, state: DecodeState, upto: int, hook: str) -> None:
        """Slots ``[0, upto)`` of every layer equal the shadow's (positions too).

        Slots checked before are compared bitwise with a copy taken when they passed (one fast
        comparison per buffer); only new slots, or all of them when that copy differs, are
        compared with the shadow under the dtype's tolerance."""
        if upto <= 0:
            return
        cache, shadow = state.cache, self.shadow
        rtol, atol = KV_TOLERANCE.get(self.dtype, (1e-3, 1e-3))
        where = None
        if not torch.equal(cache.pos[:upto], shadow.pos[:upto]):
            slot = int((cache.pos[:upto] != shadow.pos[:upto]).nonzero()[0])
            where = f"slot {slot} holds position {int(cache.pos[slot])}, not {slot}"
        seen = min(self.seen, upto)
        for layer in range(cache.n_layers):
            if where is not None:
                break
            if cache.lengths[layer] < upto:
                where = f"layer {layer} holds {cache.lengths[layer]} valid slots, fewer than {upto}"
                break
            for j, (name, mine, ref) in enumerate(
                (
                    ("keys", cache.keys[layer], shadow.keys[layer]),
                    ("values", cache.values[layer], shadow.values[layer]),
                )
            ):
                assert ref is not None
                if mine is None or mine.shape != ref.shape:
                    where = (
                        f"layer {layer} {name} buffer was replaced "
                        f"(shape {None if mine is None else tuple(mine.shape)})"
                    )
                    break
                snap = self.passed.get((layer, j))
                if snap is None or snap.shape != mine.shape:
                    snap = self.passed[(layer, j)] = torch.empty_like(mine)
                    lo = 0
                else:
                    lo = seen if torch.equal(mine[:, :, :seen], snap[:, :, :seen]) else 0
                if lo >= upto:
                    continue
                a, b = mine[:, :, lo:upto].to(ref.dtype), ref[:, :, lo:upto]
                ok = (
                    torch.isclose(a, b, rtol=rtol, atol=atol).all(dim=3).all(dim=1)[0]
                )  # [upto - lo]
                if not bool(ok.all()):
                    slot = lo + int((~ok).nonzero()[0])
                    err = float((mine[:, :, slot].to(ref.dtype) - ref[:, :, slot]).abs().max())
                    where = (
                        f"layer {layer} {name} at slot {slot} "
                        f"(token {int(self.tokens[slot])}) differ "
                        f"from a full forward by {err:.3g}"
                    )
                    break
                snap[:, :, lo:upto] = mine[:, :, lo:upto]
        if where is not None:
            raise AuditError(
                self.plugin_name,
                (
                    f"{hook} left the KV cache wrong {self._where(state, hook)} "
                    f"({state.generated} tokens generated): {where}"
                ),
            )
        self.seen = upto


#: Models of up to this many parameters have their weights compared value for value after
#: every hook (the kit's tiny models have about 10^5); larger ones by identity and in-place
#: writes only (no copy of a real model's weights is made).
EXACT_WEIGHTS = 5_000_000


class WeightGuard:
    """The parameters of a model as they were when it was made: :meth:`changed` says which one
    a plugin replaced or wrote since.

    Cheap checks (run after every hook): every parameter is the same ``Parameter`` object in
    the same module, over the same storage, and its version counter shows no in-place write
    (``mul_``, ``copy_``, indexing, under ``no_grad`` or ``inference_mode`` alike). On a model
    of up to :data:`EXACT_WEIGHTS` parameters (or ``exact=True``) the values are also compared
    with a copy (``values=True``: after setup, after ``selfspec_start`` and at the end of the
    decode), which catches a write through ``.data``, the one path that bumps no version
    counter (the hook is then not known: any since the last comparison).

    An *offloaded* parameter of a model accelerate dispatched (a meta tensor between forwards,
    replaced by accelerate on every forward: :mod:`selfspec._engine.runner.placement`) must
    stay a meta tensor (a plugin that puts values in its place is caught); its values are
    the ones in the offload store, read through the module's hook for the comparison.
    """

    def __init__(self, model: torch.nn.Module, exact: bool | None = None) -> None:
        entries = [
            (f"{mod_name}.{name}".lstrip("."), module, name, p)
            for mod_name, module in model.named_modules()
            for name, p in module._parameters.items()
            if p is not None
        ]
        if exact is None:
            exact = sum(p.numel() for *_, p in entries) <= EXACT_WEIGHTS
        self.exact = exact
        self.entries = [
            (full, module, name, p, *_identity(p), _value(module, name, p) if exact else None)
            for full, module, name, p in entries
        ]

    def changed(self, values: bool = True) -> tuple[str, bool] | None:
        """None while every parameter is as it was; else (what changed, in a few words; True
        when only the comparison of values saw it)."""
        for full, module, name, p, ptr, version, _ in self.entries:
            now = module._parameters.get(name)
            if ptr is None:  # offloaded: accelerate swaps the meta tensor at every forward
                if now is None or now.device.type != "meta":
                    return f"replaced the offloaded parameter {full}", False
                continue
            if now is not p:
                return f"replaced the parameter {full}", False
            if p.data_ptr() != ptr:
                return f"replaced the storage of {full}", False
            if version is not None and p._version != version:
                return f"wrote {full} in place", False
        if values and self.exact:
            for full, module, name, p, ptr, _, copy in self.entries:
                now = _value(module, name, p if ptr is not None else module._parameters[name])
                if not torch.equal(now, copy):
                    rows = (
                        (now != copy)
                        .reshape(copy.shape[0], -1)
                        .any(dim=1)
                        .nonzero()
                        .flatten()
                        .tolist()
                    )
                    more = f" and {len(rows) - 1} more" if len(rows) > 1 else ""
                    return f"wrote {full} (row {rows[0]}{more}) through .data", True
        return None

    def check(self, plugin: str, hook: str, when: str = "", values: bool = True) -> None:
        """Raise :class:`AuditError` naming ``hook`` when the weights changed."""
        found = self.changed(values)
        if found is None:
            return
        what, late = found
        who = (
            (
                f"{hook}{when} or a hook before it "
                f"(a write through .data bumps no version counter, so "
                f"only the values show it)"
            )
            if late and hook != "selfspec_setup"
            else f"{hook}{when}"
        )
        raise AuditError(
            plugin,
            f"{who} changed the model's weights: it {what}. The model is not the "
            "plugin's to change (the reference is the untouched model); keep edited copies "
            "in the plugin",
        )


def _identity(p: torch.Tensor) -> tuple[int | None, int | None]:
    """``(storage pointer, version)`` of a parameter; ``(None, None)`` for an offloaded (meta)
    one, version ``None`` for an inference tensor (it has no version counter)."""
    if p.device.type == "meta":
        return None, None
    return p.data_ptr(), (None if p.is_inference() else p._version)


def _value(module: torch.nn.Module, name: str, p: torch.Tensor) -> torch.Tensor:
    """A copy of a parameter's values; an offloaded one's read from its offload store."""
    if p.device.type != "meta":
        return p.detach().clone()
    with torch.inference_mode(False), torch.no_grad(), loaded(module):
        return module._parameters[name].detach().clone()
