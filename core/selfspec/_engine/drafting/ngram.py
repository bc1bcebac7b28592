"""An n-gram suffix index over a growing token list (prompt lookup's retrieval).

Answers one question, fast, every step: where did the list's own last ``n`` tokens occur
before, and what followed them? Every n-gram (``min_n <= n <= max_n``) is indexed by the
position right after its latest occurrence whose continuation is known.
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    """Every n-gram of :attr:`tokens`, by the position after its latest occurrence.

    ``extend`` appends tokens and indexes the n-grams whose continuation became known;
    ``match`` finds the longest suffix that occurred before; ``continuation`` returns what
    followed it; ``lookup`` guesses what comes after a path that continues the list.
    Invariant: after ``extend``, every n-gram ``tokens[s-n:s]`` with ``s < len(tokens)`` is
    indexed at its largest such ``s``. Prompt lookup's retrieval; used by lookup, by
    selfdraft's history source and by the tree drafts' ``tree_guess``.
    """

    def __init__(self, max_n: int = 3, min_n: int = 1) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError("n-grams need 1 <= min_n <= max_n")
        self.max_n, self.min_n = max_n, min_n
        #: the indexed token list
        self.tokens: list[int] = []
        self.index: dict[tuple[int, ...], int] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append ``tokens``; index every n-gram that ends before the (new) last token."""
        h = self.tokens
        first = len(h)
        h.extend(int(t) for t in tokens)
        for stop in range(
            max(first, 1), len(h)
        ):  # the n-gram h[stop-n:stop] is followed by h[stop]
            for n in range(self.min_n, min(self.max_n, stop) + 1):
                self.index[tuple(h[stop - n : stop])] = stop

    def match(self) -> tuple[int, int]:
        """``(n, stop)``: the longest suffix of ``n`` tokens (``max_n`` down to ``min_n``) that
        occurred before, and the position after its latest earlier occurrence; ``(0, -1)``
        when none did."""
        h = self.tokens
        for n in range(min(self.max_n, len(h)), self.min_n - 1, -1):
            stop = self.index.get(tuple(h[-n:]))
            if stop is not None:
                return n, stop
        return 0, -1

    def lookup(self, tail: Sequence[int], k: int) -> tuple[int, ...]:
        """Up to ``k`` tokens that followed the latest occurrence of the longest suffix of
        ``tokens + tail`` (``max_n`` down to ``min_n`` tokens, ``tail`` tokens included) whose
        continuation is known; empty when none occurred. A guess of what comes after a path
        (``tail``) that continues the list, e.g. a draft tree's node (:func:`selfspec.draft_tree`'s
        ``guess``)."""
        if k <= 0:
            return ()
        h = self.tokens
        t = [int(x) for x in tail[-self.max_n :]]
        for n in range(min(self.max_n, len(h) + len(t)), self.min_n - 1, -1):
            key = tuple(t[-n:]) if n <= len(t) else tuple(h[len(t) - n :] + t)
            stop = self.index.get(key)
            if stop is not None:
                return tuple(h[stop : stop + k])
        return ()

    def continuation(self, k: int, halving: bool = False) -> tuple[int, ...]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of the longest
        matching suffix (see :meth:`match`); empty when none occurs.

        ``halving``: a match ``j`` tokens shorter than ``max_n`` gives at most ``k / 2**j``
        tokens (at least one): a shorter match is less often followed by what followed it
        before, so fewer of its tokens are worth verifying."""
        n, stop = self.match()
        if not n or k <= 0:
            return ()
        return tuple(self.tokens[stop : stop + (max(1, k >> (self.max_n - n)) if halving else k)])
