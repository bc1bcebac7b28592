"""The selfspec cache directory: converted models, plugin artefacts, corpus caches."""

from __future__ import annotations

import os
from pathlib import Path

from platformdirs import user_cache_dir

#: The environment variable that moves the cache directory.
CACHE_ENV = "SELFSPEC_CACHE_DIR"


def cache_dir() -> Path:
    """The selfspec cache directory: ``$SELFSPEC_CACHE_DIR``, else the platform's user cache
    (``~/.cache/selfspec`` on Linux)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path(user_cache_dir("selfspec"))
