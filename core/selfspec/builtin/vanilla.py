"""``vanilla``: no drafts, every step is one plain greedy forward."""

from __future__ import annotations

from ..markers import hookimpl
from ..types import DecodeState, Draft


class Vanilla:
    @hookimpl(trylast=True)
    def selfspec_propose(self, state: DecodeState) -> Draft:
        return Draft.empty(state.runner.device)
