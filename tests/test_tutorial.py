"""docs/tutorial-first-plugin.md, step by step, as a new user runs it.

The code the tutorial shows is checked against the real files by tests/test_docs.py; here we
run its commands: the plugin is listed, it decodes, `check` finds no divergence, and its own
suite passes. The model is a tiny local one so the steps run offline in seconds.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _tiny_models import save_tiny_llama
from click.testing import CliRunner

from selfspec.app._cli import cli

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(
    "lookup"
    not in __import__("selfspec._engine.contract.plugins", fromlist=["available"]).available(),
    reason="selfspec-lookup is not installed (pip install -e plugins/selfspec-lookup)",
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(save_tiny_llama(tmp_path_factory.mktemp("tutorial") / "tiny", seed=3))


def test_step6_plugins_lists_lookup():
    out = CliRunner().invoke(cli, ["plugins", "--json"])
    assert out.exit_code == 0, out.output
    rows = {row["name"]: row for row in json.loads(out.stdout)}
    assert "lookup" in rows
    assert {o["name"] for o in rows["lookup"]["options"]} == {
        "max_ngram",
        "min_ngram",
        "num_draft",
        "adaptive",
    }


def test_step6_run_lookup(model_dir):
    args = [
        "--plugin",
        "lookup",
        "-o",
        "num_draft=8",
        "--model",
        model_dir,
        "-n",
        "12",
        "--json",
        "Repeat exactly: the quick brown fox jumps over the lazy dog.",
    ]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["plugin"] == "lookup"


def test_step6_plugin_file(model_dir):
    path = ROOT / "plugins" / "selfspec-lookup" / "selfspec_lookup.py"
    out = CliRunner().invoke(
        cli, ["--plugin-file", str(path), "--model", model_dir, "-n", "6", "--json", "hello"]
    )
    assert out.exit_code == 0, out.output


def test_step7_check_and_suite(model_dir):
    out = CliRunner().invoke(
        cli, ["check", "--plugin", "lookup", "--model", model_dir, "-n", "16", "--dtype", "float64"]
    )
    assert out.exit_code == 0, out.output
    assert "DIVERGED" not in out.output
    # the suite as the tutorial runs it, in a fresh interpreter; its losslessness property (the
    # long part) runs in the same CI from plugins/selfspec-lookup/tests, so not twice here
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--selfspec-coverage",
            "-k",
            "not test_lossless",
            str(ROOT / "plugins" / "selfspec-lookup" / "tests"),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "selfspec coverage" in run.stdout and " passed" in run.stdout
    # a suite that drew no example is not reported
    assert "no PluginSuite property test ran" in run.stdout
