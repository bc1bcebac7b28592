"""mymethod: a selfspec drafting method (template).

Replace the proposal below with your idea. Whatever you propose, the host verifies it with the
full model, so the output stays exactly greedy decoding; a good proposal only makes it faster.
"""

from __future__ import annotations

from typing import Any

import selfspec
from selfspec import Draft, Option


class MyMethod:
    """One instance per decoder: keep per-decode state on ``self``."""

    def __init__(self) -> None:
        self.num_draft = 2

    @selfspec.hookimpl
    def selfspec_options(self, register) -> None:
        register(Option("num_draft", int, 2, "most tokens drafted per step", min=0, max=32))

    @selfspec.hookimpl
    def selfspec_setup(self, options: dict[str, Any]) -> None:
        self.num_draft = options["num_draft"]

    @selfspec.hookimpl
    def selfspec_propose(self, state: selfspec.DecodeState) -> Draft:
        # Example proposal: repeat the pending token num_draft times (right on runs like "....").
        k = min(self.num_draft, state.max_draft_depth)
        return Draft.chain([state.pending] * k, device=state.runner.device)
