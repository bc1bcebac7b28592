"""Audit mode: every step of a decode checked against the full model, as it happens.

With ``SELFSPEC_AUDIT=1`` (or ``Decoder(..., audit=True)``, and always inside
``selfspec.testing.assert_lossless``) the loop hands each step to an :class:`Auditor`, which
keeps a *shadow* KV cache filled only by plain full-model forwards of the committed tokens and
checks, at the step where a plugin goes wrong:

* after ``selfspec_propose``: the committed tokens and the committed KV slots ``[0, base)``
  are untouched (``base = state.length - 1``, the pending token's slot);
* after ``selfspec_verify``: every token the verdict commits (accepted drafts, then the bonus)
  is the full model's greedy token (under sampling: the argmax of its position-keyed
  perturbed logits, :mod:`selfspec.sampling`) given exactly the committed prefix, computed by one forward
  of ``[pending, accepted...]`` on the shadow cache (what the built-in greedy verifier decides
  for that path; a verifier may accept fewer tokens than it could, never a wrong one);
* after ``selfspec_cache`` and the commit: the runner's cache holds, slot by slot and layer by
  layer, the keys/values (and positions) the full forward wrote; the tokens buffer holds what
  was committed.

A failure raises :class:`~selfspec.plugins.PluginError` naming the hook at fault, the step and
the token. float64 is exact; in float32/bf16/float16 a different token is allowed only at a
near-tie (the shadow's top-1/top-2 margin within ``selfspec.tiebound.tie_bound``;
under sampling the margin of the perturbed logits, within the bound divided by the
temperature, since the warping scales rounding differences by ``1 / T``),
counted in :attr:`Auditor.near_ties`, after which the shadow follows the plugin's tokens.

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

from .plugins import PluginError
from .reference import greedy
from .tiebound import explain, tie_bound
from .types import DecodeState, Draft, Verdict

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


class AuditError(PluginError, AssertionError):
    """A step broke losslessness; the message names the plugin, the hook, the step and token."""


class Auditor:
    """Shadow-checks one decode; see the module docstring. One instance per ``generate``."""

    def __init__(self, plugin_name: str, plugin_hooks: list[str], tolerance: float | None = None) -> None:
        self.plugin_name = plugin_name
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

    def proposed(self, state: DecodeState, draft: Draft) -> None:
        """After propose: committed tokens and KV slots ``[0, base)`` are as they were."""
        self._check_tokens(state, "selfspec_propose")
        self._check_kv(state, state.length - 1, "selfspec_propose")

    def verified(self, state: DecodeState, draft: Draft, verdict: Verdict) -> None:
        """After verify: every committed token is the full model's greedy token."""
        self._check_tokens(state, "selfspec_verify")
        committed = verdict.committed
        depths = draft.depths()
        self.steps.append(StepRecord(state.length, state.generated, len(draft), max(depths, default=0),
                                     draft.is_tree, len(verdict.accepted), tuple(committed)))
        if self.trusted:
            return
        base = state.length - 1
        ids = torch.cat([self.tokens[-1:], torch.tensor(verdict.accepted, dtype=torch.long,
                                                        device=self.tokens.device)])  # ids: [a+1]
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
            raise AuditError(self.plugin_name, (
                f"selfspec_verify is lossy at step {state.step} (output token {state.generated + i}, "
                f"{state.length + i} tokens in): its {what} is {got}, the full model's "
                f"{'sampled' if state.sampling_on else 'greedy'} token "
                f"is {want} ({explain(self.dtype, margin, tol)}); verdict accepted {list(verdict.accepted)} + "
                f"bonus {verdict.bonus} of draft {draft.tokens.tolist()}"
                f"{' (a tree)' if draft.is_tree else ''}"))

    def committed(self, state: DecodeState, new: list[int]) -> None:
        """After cache and commit: the tokens buffer and the runner's KV match the shadow."""
        base = self.tokens.shape[0] - 1
        self.tokens = torch.cat([self.tokens, torch.tensor(new, dtype=torch.long, device=self.tokens.device)])
        self._check_tokens(state, "selfspec_cache")
        if self.trusted:  # the host's verifier wrote these slots over a checked prefix: mirror them
            end = min(state.cache.lengths)
            self._mirror(state, base, end)
        elif not state.finished:
            writers = [h for h in ("selfspec_verify", "selfspec_cache") if h in self.hooks] or ["selfspec_propose"]
            self._check_kv(state, state.length - 1, " or ".join(writers))

    def updated(self, state: DecodeState) -> None:
        self._check_tokens(state, "selfspec_update_policy")

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
    def _check_tokens(self, state: DecodeState, hook: str) -> None:
        n = self.tokens.shape[0]
        if state.length != n or not torch.equal(state.tokens[:n], self.tokens):
            bad = next((i for i in range(min(n, state.length))
                        if int(state.tokens[i]) != int(self.tokens[i])), min(n, state.length))
            raise AuditError(self.plugin_name, (
                f"{hook} changed the committed tokens at step {state.step}: position {bad} "
                f"(the pending token is {n - 1}); plugins must not write state.tokens or state.length"))

    def _check_kv(self, state: DecodeState, upto: int, hook: str) -> None:
        """Slots ``[0, upto)`` of every layer equal the shadow's (positions too)."""
        if upto <= 0:
            return
        cache, shadow = state.cache, self.shadow
        rtol, atol = KV_TOLERANCE.get(self.dtype, (1e-3, 1e-3))
        where = None
        if not torch.equal(cache.pos[:upto], shadow.pos[:upto]):
            slot = int((cache.pos[:upto] != shadow.pos[:upto]).nonzero()[0])
            where = f"slot {slot} holds position {int(cache.pos[slot])}, not {slot}"
        for layer in range(cache.n_layers):
            if where is not None:
                break
            if cache.lengths[layer] < upto:
                where = f"layer {layer} holds {cache.lengths[layer]} valid slots, fewer than {upto}"
                break
            for name, mine, ref in (("keys", cache.keys[layer], shadow.keys[layer]),
                                    ("values", cache.values[layer], shadow.values[layer])):
                assert ref is not None
                if mine is None or mine.shape != ref.shape:
                    where = f"layer {layer} {name} buffer was replaced (shape {None if mine is None else tuple(mine.shape)})"
                    break
                a, b = mine[:, :, :upto].to(ref.dtype), ref[:, :, :upto]
                ok = torch.isclose(a, b, rtol=rtol, atol=atol).all(dim=3).all(dim=1)[0]  # [upto]
                if not bool(ok.all()):
                    slot = int((~ok).nonzero()[0])
                    err = float((a[:, :, slot] - b[:, :, slot]).abs().max())
                    where = (f"layer {layer} {name} at slot {slot} (token {int(self.tokens[slot])}) differ "
                             f"from a full forward by {err:.3g}")
                    break
        if where is not None:
            raise AuditError(self.plugin_name, (
                f"{hook} left the KV cache wrong at step {state.step} ({state.generated} tokens "
                f"generated): {where}"))
