"""The correct control every mutant changes one thing of, and a helper they share."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from selfspec._engine.contract.builtin.verify import verify_greedy
from selfspec._engine.contract.markers import hookimpl
from selfspec._engine.contract.options import Option
from selfspec._engine.contract.types import DecodeState, Draft, Verdict


class Echo:
    """Correct: drafts the ``k`` tokens that followed the pending token's last earlier
    occurrence."""

    bug: ClassVar[str] = "none (the correct control)"
    trigger: ClassVar[str] = "-"
    #: The hook the audit must blame (None: not checked).
    hook: ClassVar[str | None] = None
    #: ``state.step`` of the first wrong step of the last decode (None: none, or not recorded).
    fault_step: ClassVar[int | None] = None
    #: Why only float64 can tell this mutant from a correct plugin (its error lies within the
    #: near-tie bound of float32/bf16), or None: the bf16 mutation test leaves such mutants out.
    float64_only: ClassVar[str | None] = None

    @hookimpl
    def selfspec_options(self, register: Any) -> None:
        register(Option("k", int, 8, "longest draft", min=1, max=16))

    @hookimpl
    def selfspec_setup(self, options: dict[str, Any]) -> None:
        self.k = options["k"]
        type(self).fault_step = None

    @hookimpl
    def selfspec_propose(self, state: DecodeState) -> Draft:
        ids = state.committed.tolist()
        pending = ids[-1]
        for j in range(len(ids) - 2, -1, -1):
            if ids[j] == pending:
                return Draft.chain(ids[j + 1 : j + 1 + self.k], device=state.runner.device)
        return Draft.empty(state.runner.device)

    @hookimpl
    def selfspec_verify(self, state: DecodeState, draft: Draft) -> Verdict:
        return self.verify(state, draft)

    @hookimpl
    def selfspec_cache(self, state: DecodeState, verdict: Verdict) -> None:
        self.cache(state, verdict)

    # what the mutants override
    def verify(self, state: DecodeState, draft: Draft) -> Verdict:
        return verify_greedy(state, draft)

    def cache(self, state: DecodeState, verdict: Verdict) -> None:
        pass  # the built-in commit keeps verdict.kv_slots

    def fault(self, state: DecodeState, after_commit: bool = False) -> None:
        """Note the step of the first wrong step of this decode (what the audit must name).
        ``selfspec_update_policy`` runs after the commit, where ``state.step`` already counts
        the step (``after_commit=True``)."""
        if type(self).fault_step is None:
            type(self).fault_step = state.step - 1 if after_commit else state.step


def _accept_all(state: DecodeState, draft: Draft) -> Verdict:
    """Accept every draft token unchecked (the bonus is the model's token after them)."""
    v = verify_greedy(state, draft)
    if len(draft) == len(v.accepted):
        return v
    # re-run the whole draft so the KV of [pending, draft...] is the full model's
    base = state.length - 1
    ids = torch.cat([state.tokens[base : base + 1], draft.tokens])
    out = state.runner.forward(ids, cache=state.cache, start=base, logits="last")
    bonus = int(out.logits[-1].to(torch.float32).argmax())
    return Verdict(tuple(draft.tokens.tolist()), bonus, tuple(range(len(draft))))
