"""What the host says on stderr while it does first-use work (measuring this machine's kernels,
building copies, checking a draft copy's agreement): one line per kind of work by default, every
detail with ``SELFSPEC_VERBOSE=1`` (``specdec -v``)."""

from __future__ import annotations

import os
import sys

ENV = "SELFSPEC_VERBOSE"
#: The one line for ``auto``'s measurements at a model's first use on a machine.
MEASURING = "measuring this machine's kernels for this model (once per model shape and machine)"
_SAID: set[str] = set()


def verbose() -> bool:
    """Whether every detail is printed (``SELFSPEC_VERBOSE`` is ``1``, ``true`` or ``yes``)."""
    return os.environ.get(ENV, "0").strip().lower() in ("1", "true", "yes")


def say(detail: str, *, headline: str) -> None:
    """Print ``detail`` when verbose; else ``headline`` once per process (a kind of first-use
    work, e.g. "measuring this machine's kernels for this model, once")."""
    if verbose():
        print(f"selfspec: {detail}", file=sys.stderr, flush=True)
    elif headline not in _SAID:
        _SAID.add(headline)
        print(
            f"selfspec: {headline} (SELFSPEC_VERBOSE=1 for the details)",
            file=sys.stderr,
            flush=True,
        )
