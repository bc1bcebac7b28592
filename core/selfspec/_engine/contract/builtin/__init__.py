"""The host's own features, written as plugins (pytest's ``default_plugins``).

* ``vanilla``: proposes nothing (a plain greedy step), ``trylast``;
* ``verify``: the greedy verifier for chains and trees, ``trylast``;
* ``commit``: keeps the accepted slots of the runner's KV cache;
* ``timing``: wall time of every phase, a ``wrapper=True`` hookimpl.
"""

from __future__ import annotations

from typing import Any

from selfspec._engine.contract.builtin.commit import CacheCommit
from selfspec._engine.contract.builtin.timing import PhaseTimer
from selfspec._engine.contract.builtin.vanilla import Vanilla
from selfspec._engine.contract.builtin.verify import GreedyVerifier


def default_plugins() -> list[tuple[str, Any]]:
    """A fresh instance of each built-in, with the name it is registered under."""
    return [
        ("vanilla", Vanilla()),
        ("verify", GreedyVerifier()),
        ("commit", CacheCommit()),
        ("timing", PhaseTimer()),
    ]
