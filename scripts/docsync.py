#!/usr/bin/env python3
"""Keep code shown in docs identical to the real files it is taken from.

In a markdown file, a block written as

    <!-- include: plugins/selfspec-lookup/selfspec_lookup.py#hooks -->
    ```python
    ...
    ```
    <!-- /include -->

shows the region ``hooks`` of that file (the lines between ``# [start:hooks]`` and
``# [end:hooks]``, markers excluded), or the whole file when no ``#region`` is given.
``python scripts/docsync.py`` rewrites every such block under docs/; ``--check`` only reports
stale blocks and exits 1 (tests/test_docs.py runs the check).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(
    r"(<!-- include: (?P<src>[^#\s]+)(?:#(?P<region>[\w-]+))? -->\n```(?P<lang>\w*)\n)"
    r"(?P<body>.*?)(```\n<!-- /include -->)",
    re.S,
)


def region(path: Path, name: str | None) -> str:
    text = path.read_text(encoding="utf-8")
    if name is None:
        return text
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.strip() == f"# [start:{name}]")
    end = next(i for i, line in enumerate(lines) if line.strip() == f"# [end:{name}]")
    return "".join(lines[start + 1 : end])


def render(md: str) -> str:
    def sub(m: re.Match[str]) -> str:
        body = region(ROOT / m["src"], m["region"])
        if not body.endswith("\n"):
            body += "\n"
        return m.group(1) + body + m.group(6)

    return BLOCK.sub(sub, md)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for md in sorted((ROOT / "docs").rglob("*.md")):
        text = md.read_text(encoding="utf-8")
        new = render(text)
        if new != text:
            stale.append(md.relative_to(ROOT))
            if not check:
                md.write_text(new, encoding="utf-8")
    for path in stale:
        print(f"{'stale' if check else 'updated'}: {path}", file=sys.stderr)
    return 1 if (check and stale) else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
