"""Cache commit: the runner's KV cache keeps exactly the committed prefix."""

from __future__ import annotations

from selfspec._engine.contract.markers import hookimpl
from selfspec._engine.contract.types import DecodeState, Verdict


class CacheCommit:
    @hookimpl(trylast=True)
    def selfspec_cache(self, state: DecodeState, verdict: Verdict) -> None:
        # keep [pending, accepted...]: a crop for a chain, a gather for a tree
        state.cache.keep(state.length - 1, verdict.slots())
