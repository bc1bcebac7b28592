"""The context cache: grams the draft branches produced, an LRU queue per first token.

Every step, each draft branch ``tau`` (``[l]`` tokens) and the model's predictions ``D`` at its
positions (``D[j]`` = argmax after ``tau[:j+1]`` in the current context) give the grams
``tau[j-G+2 .. j] + [D[j]]`` of length ``G``: keyed by their first token, stored as the
``G-1`` tokens that follow it. A lookup for the pending token returns the most recently
seen continuations first (paper: "an LRU queue ... for each prefix token").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


class ContextCache:
    """Per key token, at most ``size`` continuations, least recently used dropped first."""

    def __init__(self, size: int = 8) -> None:
        if size < 1:
            raise ValueError("context cache size must be >= 1")
        self.size = size
        self.queues: dict[int, OrderedDict[tuple[int, ...], None]] = {}

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def clear(self) -> None:
        self.queues.clear()

    def put(self, gram: Sequence[int]) -> None:
        """Insert (or refresh) one gram: ``gram[0]`` is the key, ``gram[1:]`` the continuation."""
        if len(gram) < 2:
            return
        q = self.queues.setdefault(int(gram[0]), OrderedDict())
        cont = tuple(int(t) for t in gram[1:])
        if cont in q:
            q.move_to_end(cont)
        else:
            q[cont] = None
            if len(q) > self.size:
                q.popitem(last=False)

    def put_branch(self, branch: Sequence[int], preds: Sequence[int], gram: int) -> None:
        """Insert the grams of one branch: ``branch[j-gram+2 .. j] + [preds[j]]`` for every
        ``j`` with a full window (``preds[j]`` is the model's token after ``branch[:j+1]``)."""
        for j in range(gram - 2, len(branch)):
            self.put((*branch[j - gram + 2 : j + 1], preds[j]))

    def get(self, key: int, limit: int | None = None) -> list[tuple[int, ...]]:
        """Continuations after ``key``, most recently used first."""
        q = self.queues.get(int(key))
        if not q:
            return []
        out = list(reversed(q))
        return out if limit is None else out[:limit]

    def update(self, grams: Iterable[Sequence[int]]) -> None:
        for g in grams:
            self.put(g)
