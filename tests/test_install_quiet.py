"""Installing the host or a plugin prints no setuptools warnings.

Every folder with a pyproject.toml (the host, each plugin, the template) is built as an
editable wheel and as a plain wheel by setuptools' own backend, in a fresh interpreter, and
the build must say nothing of "Warning" (a data folder missing from ``packages``, the
import-hook notice of flat-layout editable installs). The plain wheels must carry the
plugins' data files (selfsd's shipped profiles)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECTS = [
    ROOT,
    *sorted(p for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").is_file()),
]
BUILD = "import sys, setuptools.build_meta as b; print(getattr(b, sys.argv[1])(sys.argv[2]))"


def _build(project: Path, hook: str, out: Path) -> tuple[Path, str]:
    out.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(
        [sys.executable, "-c", BUILD, hook, str(out)], cwd=project, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    return out / run.stdout.strip().splitlines()[-1], run.stdout + run.stderr


@pytest.mark.slow(ci=True)
@pytest.mark.parametrize("project", PROJECTS, ids=lambda p: p.name if p != ROOT else "selfspec")
def test_builds_print_no_setuptools_warnings(project, tmp_path):
    for hook in ("build_editable", "build_wheel"):
        wheel, log = _build(project, hook, tmp_path / hook)
        noisy = [line for line in log.splitlines() if "Warning" in line or "!!" in line]
        assert not noisy, f"{project.name} {hook}:\n" + "\n".join(noisy)
    if project.name == "selfspec-selfsd":
        names = zipfile.ZipFile(wheel).namelist()
        assert any(
            n.startswith("selfspec_selfsd/profiles/") and n.endswith(".json") for n in names
        ), names
