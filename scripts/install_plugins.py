#!/usr/bin/env python3
"""Install every plugin under plugins/ (not the _template) into the running Python, editable,
with its own dependencies (the host is installed already, so it satisfies each plugin's
``selfspec`` requirement; PIP_CONSTRAINT keeps torch pinned). Used by tox and scripts/demo.sh."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    folders = sorted(
        p for p in (ROOT / "plugins").glob("selfspec-*") if (p / "pyproject.toml").is_file()
    )
    args = [arg for f in folders for arg in ("-e", str(f))]
    if not args:
        return 0
    return subprocess.call([sys.executable, "-m", "pip", "install", "-q", *args])


if __name__ == "__main__":
    raise SystemExit(main())
