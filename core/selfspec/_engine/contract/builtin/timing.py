"""Wall time per phase, as ``wrapper=True`` hookimpls around the four step hooks.

Time a plugin records under its own key with :meth:`DecodeState.timed` inside a hook is left
out of that hook's phase, so the phases partition the step time.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any

import torch

from selfspec._engine.contract.markers import hookimpl
from selfspec._engine.contract.types import DecodeState


def _timed(state: DecodeState, phase: str) -> Generator[None, Any, Any]:
    sync = state.runner.device.type == "cuda"
    inner = state.timed_s  # time of `state.timed` blocks so far
    t0 = time.perf_counter()
    try:
        return (yield)
    finally:
        if sync:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0 - (state.timed_s - inner)
        state.stats.phase_s[phase] = state.stats.phase_s.get(phase, 0.0) + dt


class PhaseTimer:
    @hookimpl(wrapper=True, tryfirst=True)
    def selfspec_propose(self, state: DecodeState):
        return (yield from _timed(state, "propose"))

    @hookimpl(wrapper=True, tryfirst=True)
    def selfspec_verify(self, state: DecodeState):
        return (yield from _timed(state, "verify"))

    @hookimpl(wrapper=True, tryfirst=True)
    def selfspec_cache(self, state: DecodeState):
        return (yield from _timed(state, "cache"))

    @hookimpl(wrapper=True, tryfirst=True)
    def selfspec_update_policy(self, state: DecodeState):
        return (yield from _timed(state, "update"))
