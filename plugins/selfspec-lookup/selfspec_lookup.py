"""Prompt lookup decoding as a selfspec plugin.

Drafts the tokens that followed the latest earlier occurrence of the last n-gram of the
prompt and output so far (longest n first, from ``max_ngram`` down to ``min_ngram``). Strong
wherever the output copies from the context: code edits, summaries, retrieval answers.

On a CPU, verifying k draft tokens costs noticeably more than one token, so the draft length
can adapt: it grows while drafts are fully accepted and shrinks to just past the accepted part
when they are not.
"""

from __future__ import annotations

from typing import Any

import selfspec
from selfspec import Draft, NgramIndex, Option


# [start:class]
class Lookup:
    """One instance per decoder; the n-gram index is rebuilt at every decode's start."""

    def __init__(self) -> None:
        self.max_ngram = 3
        self.min_ngram = 1
        self.num_draft = 6
        self.adaptive = False
        self.k = 6
        self.index = NgramIndex()  # prompt + committed tokens, every n-gram indexed (the host's)
        self.drafted = 0  # length of the last draft

    # [end:class]
    # [start:options]
    @selfspec.hookimpl
    def selfspec_options(self, register) -> None:
        register(Option("max_ngram", int, 3, "longest n-gram to look up", min=1, max=16))
        register(Option("min_ngram", int, 1, "shortest n-gram to look up", min=1, max=16))
        register(Option("num_draft", int, 6, "most tokens drafted per step", min=1, max=128))
        register(Option("adaptive", bool, False, "adapt the draft length to recent acceptance"))

    @selfspec.hookimpl
    def selfspec_setup(self, options: dict[str, Any]) -> None:
        if options["min_ngram"] > options["max_ngram"]:
            raise ValueError("min_ngram must not exceed max_ngram")
        self.max_ngram = options["max_ngram"]
        self.min_ngram = options["min_ngram"]
        self.num_draft = options["num_draft"]
        self.adaptive = options["adaptive"]

    # [end:options]
    # [start:propose]

    @selfspec.hookimpl
    def selfspec_start(self, state: selfspec.DecodeState) -> None:
        self.index = NgramIndex(self.max_ngram, self.min_ngram)
        self.index.extend(state.committed.tolist())
        self.k = self.num_draft

    @selfspec.hookimpl
    def selfspec_propose(self, state: selfspec.DecodeState) -> Draft:
        k = min(self.k if self.adaptive else self.num_draft, state.max_draft_depth)
        # what followed the latest earlier occurrence of the longest matching suffix
        tokens = self.index.continuation(k) if k > 0 else ()
        self.drafted = len(tokens)
        return Draft.chain(tokens, device=state.runner.device)

    # [end:propose]
    # [start:policy]

    @selfspec.hookimpl
    def selfspec_update_policy(
        self, state: selfspec.DecodeState, verdict: selfspec.Verdict
    ) -> None:
        # what the host committed (EOS or the budget may have cut verdict.committed)
        self.index.extend(state.tokens[len(self.index) : state.length].tolist())
        if self.drafted == 0:
            return
        if len(verdict.accepted) == self.drafted:
            self.k = min(self.num_draft, self.k + 2)
        else:
            self.k = max(1, len(verdict.accepted) + 1)

    # [end:policy]


__all__ = ["Lookup"]
