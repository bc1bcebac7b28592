"""``vanilla``: no drafts, every step is one plain greedy forward."""

from __future__ import annotations

from selfspec._engine.contract.markers import hookimpl
from selfspec._engine.contract.types import DecodeState, Draft


class Vanilla:
    @hookimpl(trylast=True)
    def selfspec_propose(self, state: DecodeState) -> Draft:
        return Draft.empty(state.runner.device)
