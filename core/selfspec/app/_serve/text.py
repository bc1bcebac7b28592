"""Committed token ids -> the text a client sees: streamed deltas and stop strings.

:class:`TextAssembler` decodes every committed id so far (as ``specdec`` and
:class:`selfspec.Result` do: ``skip_special_tokens=True``) after each block and hands out the
new text. It holds back what may still change: an incomplete multi-byte character and any
tail that could be the start of a stop string. A stop string ends the text just before it
(OpenAI's rule: the stop string itself is not returned) and tells the caller to end the decode.
"""

from __future__ import annotations

import contextlib
from typing import Any


class TextAssembler:
    """Text of a growing list of ids, with OpenAI stop strings.

    ``push(ids)`` -> ``(delta, stopped)``: the text that is new and final since the last call,
    and whether a stop string has appeared (the decode should end). ``finish()`` -> the last
    delta. ``text`` is everything handed out so far; after ``finish()`` it is the answer:
    the decode's text cut before the first stop string. ``lock`` guards the tokenizer.
    """

    def __init__(self, tokenizer: Any, stop: tuple[str, ...] = (), lock: Any = None) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.lock = lock if lock is not None else contextlib.nullcontext()
        self.ids: list[int] = []
        self.text = ""
        self.stopped = False
        self.respaced = False  # a later decode changed text already handed out

    def push(self, ids: list[int]) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        self.ids.extend(ids)
        full = self._decode()
        cut = self._first_stop(full)
        if cut is not None:
            self.stopped = True
            return self._hand_out(full[:cut]), True
        end = len(full)
        if full.endswith("\ufffd"):  # an incomplete multi-byte character: wait for its rest
            end = len(full.rstrip("\ufffd"))
        end -= self._stop_prefix(full[:end])
        return self._hand_out(full[:end]), False

    def finish(self) -> str:
        if self.stopped:
            return ""
        full = self._decode()
        cut = self._first_stop(full)
        if cut is not None:
            self.stopped = True
            full = full[:cut]
        return self._hand_out(full)

    # ---------------------------------------------------------------------------------- helpers
    def _decode(self) -> str:
        with self.lock:
            return self.tokenizer.decode(self.ids, skip_special_tokens=True)

    def _hand_out(self, upto: str) -> str:
        if not upto.startswith(self.text):
            self.respaced = True  # cannot be taken back: hand out from the first difference
            common = len(_common_prefix(upto, self.text))
            delta = upto[common:]
        else:
            delta = upto[len(self.text) :]
        if len(upto) >= len(self.text):
            self.text = upto
        return delta

    def _first_stop(self, full: str) -> int | None:
        hits = [i for i in (full.find(s) for s in self.stop) if i >= 0]
        return min(hits) if hits else None

    def _stop_prefix(self, text: str) -> int:
        """The length of the longest tail of ``text`` that begins some stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best


def _common_prefix(a: str, b: str) -> str:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return a[:n]
