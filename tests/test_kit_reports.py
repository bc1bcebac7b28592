"""The kit's failure reports stay short: a failing example prints at most ~40 lines before its
traceback, long token lists summarised (length, head, tail, hash), the whole example in a file
the message names, the first line (hook, step, token, margin) as the audit wrote it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from selfspec.testing._report import around, summarise, token_hash


def test_summaries_keep_short_lists_and_name_long_ones_by_length_head_tail_and_hash():
    assert summarise([1, 2, 3]) == "[1, 2, 3]"
    ids = list(range(520))
    text = summarise(ids)
    assert text.startswith("520 tokens [0, 1, 2, 3, 4, 5] ... [516, 517, 518, 519] #")
    assert text.endswith(token_hash(ids)) and token_hash(ids) != token_hash(ids[::-1])
    assert around(ids, 300) == "...+292 [292, 293, 294, 295, 296, 297, 298, 299] | " + str(
        ids[300:312]
    )
    assert around(ids, 3) == "[0, 1, 2] | " + str(ids[3:15])


def test_a_failing_long_example_prints_under_40_lines_and_saves_the_whole_example(tmp_path):
    (tmp_path / "test_lossy.py").write_text(
        "from selfspec.testing import PluginSuite\n"
        "from selfspec.testing._mutants import PastMismatchPrompt400\n"
        "class TestLossy(PluginSuite):\n"
        "    plugin = 'echo'\n"
        "    plugin_object = PastMismatchPrompt400  "
        "# wrong from the first step of a 400+-token prompt\n"
        "    archs = ('llama',)\n"
        "    shrink = False  # stop at the first failing example, as the mutation test does\n"
    )
    (tmp_path / "conftest.py").write_text("import torch\ntorch.set_num_threads(1)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(HYPOTHESIS_PROFILE="selfspec-ci", SELFSPEC_FAILURES=str(tmp_path / "failures"))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--tb=short",
            "test_lossy.py",
            "-k",
            "test_lossless and not across and not coverage",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    out = run.stdout
    assert run.returncode == 1, out + run.stderr
    report = [line for line in out.splitlines() if line.startswith("E ")]  # the failure's own lines
    assert 3 <= len(report) <= 40, "\n".join(report)
    first = report[0]
    assert re.search(
        r"plugin 'echo': selfspec_verify is lossy at step 0 \(output token \d+, 52\d tokens in\)",
        first,
    ), first
    assert "margin" in first
    # the 520-token prompt of the failing reach example, summarised
    assert re.search(
        r"prompt=520 tokens \[(\d+, ){5}\d+\] \.\.\. \[(\d+, ){3}\d+\] #[0-9a-f]{8}", out
    ), out
    path = re.search(r"full example: (\S+\.json)", out).group(1)
    example = json.loads(open(path).read())
    assert (
        len(example["scenario"]["prompt"]) == 520 and example["scenario"]["max_new_tokens"] == 260
    )
    assert example["plugin"] == "echo" and example["options"] == {}
