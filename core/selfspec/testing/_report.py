"""Short failure reports: long token lists summarised, the full example written to a file.

A failing example of the kit prints a few lines: its first line (the hook, the step, the token
and the margin) as the audit or the comparison wrote it, then the example with every prompt
and long token list summarised by :func:`summarise` (length, head, tail, a hash), and the
path of a JSON file (:func:`save_example`) holding the whole example to replay it.
"""

from __future__ import annotations

import json
import os
import tempfile
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: Token lists up to this long are shown whole.
SHOWN = 16
#: Where :func:`save_example` writes (``SELFSPEC_FAILURES`` overrides it).
DEFAULT_DIR = Path(tempfile.gettempdir()) / "selfspec-failures"


def token_hash(ids: Sequence[int]) -> str:
    """A short hash of a token list (crc32, hex): the same list, the same hash."""
    return f"{zlib.crc32(','.join(str(int(t)) for t in ids).encode()):08x}"


def summarise(ids: Sequence[int], shown: int = SHOWN) -> str:
    """``ids`` itself when at most ``shown`` long, else its length, first and last few ids and
    :func:`token_hash`: ``"520 tokens [7, 30, 7, 2, 7, 30] ... [2, 7, 30, 7] #1a2b3c4d"``."""
    ids = [int(t) for t in ids]
    if len(ids) <= shown:
        return str(ids)
    head, tail = ids[: shown // 2 - 2], ids[-(shown // 2 - 4) :]
    return f"{len(ids)} tokens {head} ... {tail} #{token_hash(ids)}"


def around(ids: Sequence[int], i: int, before: int = 8, after: int = 12) -> str:
    """``ids`` near index ``i``: the ``before`` ids up to it, ``|``, the ``after`` from it."""
    ids = [int(t) for t in ids]
    lead = f"...+{i - before} " if i > before else ""
    return f"{lead}{ids[max(0, i - before) : i]} | {ids[i : i + after]}"


def failures_dir() -> Path:
    return Path(os.environ.get("SELFSPEC_FAILURES") or DEFAULT_DIR)


def save_example(example: Mapping[str, Any]) -> Path:
    """Write ``example`` (JSON-able: lists of ids, options, the settings) to a file named by its
    hash under :func:`failures_dir`; returns the path."""
    text = json.dumps(example, indent=1, sort_keys=True, default=str)
    d = failures_dir()
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{example.get('plugin', 'plugin')}-{zlib.crc32(text.encode()):08x}.json"
    path.write_text(text)
    return path


def with_example(exc: BaseException, example: Mapping[str, Any]) -> None:
    """Add the path of the saved ``example`` to ``exc``'s message, as its last line (the
    first line stays as it was)."""
    try:
        path = save_example(example)
        note = f"  full example: {path}"
    except OSError as err:  # a read-only temp dir must not hide the failure itself
        note = f"  (full example not saved: {err})"
    first, *rest = exc.args or ("",)
    exc.args = (f"{first}\n{note}", *rest)
