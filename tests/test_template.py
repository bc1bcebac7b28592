"""plugins/_template must keep installing and passing, so a copied plugin starts green."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow(ci=True)
def test_template_installs_and_its_suite_passes(tmp_path):
    # a) a copy, as an author would make it; b) a real pip install (entry point included);
    # c) its own test suite, in a fresh interpreter; d) uninstall so the env stays clean
    src = tmp_path / "selfspec-mymethod"
    shutil.copytree(ROOT / "plugins" / "_template", src)
    pip = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-e",
        str(src),
    ]
    subprocess.run(pip, check=True, capture_output=True, text=True)
    try:
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(src / "tests")],
            capture_output=True,
            text=True,
            cwd=src,
            env={**_env(), "HYPOTHESIS_PROFILE": "selfspec-ci"},
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert " passed" in run.stdout
    finally:
        subprocess.run(
            [sys.executable, "-m", "pip", "uninstall", "-y", "-q", "selfspec-mymethod"],
            capture_output=True,
        )


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
