"""The corpus cache: n-gram statistics of a text corpus in the model's own tokens.

For every prefix length ``m`` in ``1..max_prefix`` it keeps, per ``m``-token prefix, the
``top`` most frequent continuations of ``cont`` tokens (seen at least ``min_count`` times).
A lookup with the committed tokens' suffix tries the longest prefix first and returns
continuations by decreasing frequency (paper: "longer prefixes and higher frequencies receive
higher priority"). Stored compactly as one ``.npz``: per ``m`` sorted packed prefix keys, group
offsets, packed continuations and counts (tokens packed ``bits`` per id into an int64).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = 1


def _bits(vocab_size: int) -> int:
    return max(16, int(vocab_size - 1).bit_length())


def _pack(windows: np.ndarray, bits: int) -> np.ndarray:
    """``[n, w]`` token ids -> ``[n]`` int64, first token in the highest bits."""
    out = np.zeros(windows.shape[0], dtype=np.int64)
    for j in range(windows.shape[1]):
        out = (out << bits) | windows[:, j].astype(np.int64)
    return out


class CorpusCache:
    """N-gram continuations by prefix. Build with :meth:`from_sequences`, save/load ``.npz``."""

    def __init__(
        self,
        tables: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
        cont: int,
        bits: int,
        meta: dict[str, Any] | None = None,
    ) -> None:
        self.tables = tables  # m -> (keys [P] sorted, offsets [P+1], conts [E], counts [E])
        self.cont = cont
        self.bits = bits
        self.meta = dict(meta or {})
        self.max_prefix = max(tables) if tables else 0

    # ------------------------------------------------------------------ build
    @classmethod
    def from_sequences(
        cls,
        sequences: Iterable[Sequence[int]],
        vocab_size: int,
        *,
        max_prefix: int = 3,
        cont: int = 3,
        top: int = 4,
        min_count: int = 2,
        meta: dict[str, Any] | None = None,
    ) -> CorpusCache:
        """Count ``(prefix, continuation)`` n-grams of every sequence (none crosses two
        sequences)."""
        bits = _bits(vocab_size)
        if (max_prefix * bits > 63) or (cont * bits > 63):
            raise ValueError(
                f"max_prefix and cont must each pack into 63 bits ({bits} bits per token)"
            )
        parts: list[np.ndarray] = []
        for s in sequences:
            a = np.asarray(s, dtype=np.int64)
            if a.size:
                parts.append(a)
                parts.append(np.array([-1], dtype=np.int64))  # separator: no gram crosses it
        flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        tables = {}
        for m in range(1, max_prefix + 1):
            tables[m] = _count(flat, m, cont, bits, top, min_count)
        info = {
            "format": FORMAT,
            "tokens": int(flat.size - len(parts) // 2),
            "max_prefix": max_prefix,
            "cont": cont,
            "top": top,
            "min_count": min_count,
            "vocab_size": vocab_size,
            **(meta or {}),
        }
        return cls(tables, cont, bits, info)

    # ------------------------------------------------------------------ lookup
    def lookup(
        self, context: Sequence[int], limit: int, max_prefix: int | None = None, min_prefix: int = 1
    ) -> list[tuple[int, ...]]:
        """Continuations of the suffix of ``context``: longest matched prefix first (from
        ``max_prefix`` down to ``min_prefix`` tokens), then by decreasing count; at most
        ``limit``, no duplicates."""
        out: list[tuple[int, ...]] = []
        seen: set[tuple[int, ...]] = set()
        top_m = min(self.max_prefix, max_prefix or self.max_prefix, len(context))
        mask = (1 << self.bits) - 1
        for m in range(top_m, max(min_prefix, 1) - 1, -1):
            keys, offsets, conts, _ = self.tables[m]
            key = 0
            for t in context[-m:]:
                key = (key << self.bits) | int(t)
            i = int(np.searchsorted(keys, key))
            if i >= keys.size or int(keys[i]) != key:
                continue
            for packed in conts[offsets[i] : offsets[i + 1]].tolist():
                c = tuple(
                    (packed >> (self.bits * (self.cont - 1 - j))) & mask for j in range(self.cont)
                )
                if c not in seen:
                    seen.add(c)
                    out.append(c)
                    if len(out) >= limit:
                        return out
        return out

    def __len__(self) -> int:
        return sum(int(t[2].size) for t in self.tables.values())

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path) -> Path:
        from selfspec import ArtefactStore

        arrays: dict[str, np.ndarray] = {}
        for m, (keys, offsets, conts, counts) in self.tables.items():
            arrays[f"keys{m}"], arrays[f"offsets{m}"] = keys, offsets.astype(np.int64)
            arrays[f"conts{m}"], arrays[f"counts{m}"] = conts, counts.astype(np.int32)
        meta = {**self.meta, "cont": self.cont, "bits": self.bits, "prefixes": sorted(self.tables)}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        return ArtefactStore.save(path, lambda tmp: np.savez_compressed(tmp, **arrays))

    @classmethod
    def load(cls, path: str | Path) -> CorpusCache:
        with np.load(Path(path)) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            if meta.get("format") != FORMAT:
                raise ValueError(f"{path}: not a selfdraft corpus cache of format {FORMAT}")
            tables = {
                m: (z[f"keys{m}"], z[f"offsets{m}"], z[f"conts{m}"], z[f"counts{m}"])
                for m in meta["prefixes"]
            }
        return cls(tables, int(meta["cont"]), int(meta["bits"]), meta)


def _count(flat: np.ndarray, m: int, cont: int, bits: int, top: int, min_count: int):
    """One table: (keys, offsets, conts, counts) of the ``top`` continuations per prefix."""
    n = m + cont
    empty = (
        np.zeros(0, np.int64),
        np.zeros(1, np.int64),
        np.zeros(0, np.int64),
        np.zeros(0, np.int32),
    )
    if flat.size < n:
        return empty
    win = np.lib.stride_tricks.sliding_window_view(flat, n)  # [W, n]
    win = win[(win >= 0).all(1)]
    if not win.shape[0]:
        return empty
    pre, post = _pack(win[:, :m], bits), _pack(win[:, m:], bits)
    order = np.lexsort((post, pre))
    pre, post = pre[order], post[order]
    new = np.ones(pre.size, dtype=bool)
    new[1:] = (pre[1:] != pre[:-1]) | (post[1:] != post[:-1])
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, pre.size))
    pre, post = pre[starts], post[starts]
    keep = counts >= min_count
    pre, post, counts = pre[keep], post[keep], counts[keep]
    if not pre.size:
        return empty
    order = np.lexsort((-counts, pre))  # per prefix, most frequent first
    pre, post, counts = pre[order], post[order], counts[order]
    first = np.ones(pre.size, dtype=bool)
    first[1:] = pre[1:] != pre[:-1]
    group_start = np.maximum.accumulate(np.where(first, np.arange(pre.size), 0))
    keep = (np.arange(pre.size) - group_start) < top
    pre, post, counts = pre[keep], post[keep], counts[keep]
    first = np.ones(pre.size, dtype=bool)
    first[1:] = pre[1:] != pre[:-1]
    idx = np.flatnonzero(first)
    offsets = np.append(idx, pre.size).astype(np.int64)
    return pre[idx], offsets, post, counts.astype(np.int32)


def tokenizer_key(tokenizer: Any) -> str:
    """A short hash of the tokenizer's vocabulary: corpus caches are per tokenizer."""
    vocab = tokenizer.get_vocab()
    items = json.dumps(sorted(vocab.items(), key=lambda kv: kv[1]), ensure_ascii=False)
    return hashlib.sha256(items.encode()).hexdigest()[:16]
