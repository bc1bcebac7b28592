"""Relative links in the repository's markdown files point at files that exist.

Checks ``[text](target)`` and ``![alt](target)`` links whose target is a relative path (no
scheme, no pure ``#anchor``), resolved against the markdown file's folder; an anchor after the
path is ignored. Measurements moved or renamed without fixing their links fail here.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def markdown_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return [ROOT / p for p in out.stdout.split()]


def broken_links(md: Path, root: Path = ROOT) -> list[str]:
    text = FENCE.sub("", md.read_text(encoding="utf-8"))  # code blocks are not links
    bad = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        # a link must land inside the repository: a clone has nothing beside it
        resolved = (md.parent / path).resolve()
        if path and (not resolved.exists() or not resolved.is_relative_to(root)):
            bad.append(f"{md.relative_to(ROOT) if md.is_relative_to(ROOT) else md.name}: {target}")
    return bad


def test_relative_links_resolve():
    files = markdown_files()
    assert any(f.name == "README.md" for f in files)
    bad = [b for f in files for b in broken_links(f)]
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_the_checker_sees_a_broken_link(tmp_path):
    md = tmp_path / "a.md"
    (tmp_path / "here.md").write_text("x")
    (tmp_path.parent / "beside.md").write_text("x")  # exists, but outside the "repository"
    md.write_text(
        "[ok](here.md) [ok too](here.md#part) [web](https://x.org) [gone](missing/sweep.md)\n"
        "[outside](../beside.md)\n```\n[in code](not/checked.md)\n```\n"
    )
    assert [b.split(": ")[1] for b in broken_links(md, root=tmp_path)] == [
        "missing/sweep.md",
        "../beside.md",
    ]
