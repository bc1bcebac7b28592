"""The greedy verifier: one full-model forward over ``[pending, draft...]`` (see
:func:`selfspec.verify_greedy`), ``trylast`` so a plugin's own verifier goes first."""

from __future__ import annotations

from selfspec._engine.contract.markers import hookimpl
from selfspec._engine.contract.types import DecodeState, Draft, Verdict
from selfspec._engine.contract.verification import verify_greedy


class GreedyVerifier:
    @hookimpl(trylast=True)
    def selfspec_verify(self, state: DecodeState, draft: Draft) -> Verdict:
        return verify_greedy(state, draft)
