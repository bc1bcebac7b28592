"""One plugin instance per Decoder, reused across decodes, the same in ``specdec bench``,
``specdec check`` and the kit (the rule is in docs/faq.md, "Is one plugin
instance reused across decodes?").

A counting plugin records every instance made and every decode each one starts."""

from __future__ import annotations

import json
import textwrap

import pytest
from _tiny_models import save_tiny_llama
from click.testing import CliRunner

import selfspec
from selfspec.app import _models as models
from selfspec.app._cli import cli
from selfspec.testing import PluginSuite

STARTS: list[int] = []  # the serial number of the instance, once per selfspec_start


class Counting:
    made = 0

    def __init__(self):
        Counting.made += 1
        self.serial = Counting.made

    @selfspec.hookimpl
    def selfspec_start(self):
        STARTS.append(self.serial)


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))
    STARTS.clear()


def test_bench_runs_the_warm_up_and_every_prompt_through_one_instance(tiny_model_factory):
    from selfspec.app._bench.harness import Method, make_runner

    run = make_runner(
        Method.of_plugin("counting", plugin_object=Counting), tiny_model_factory("llama")
    )
    # run_bench calls it for the warm-up, then per prompt
    for prompt in ([1, 2, 3], [4, 5, 6, 7], [1, 2, 3]):
        run(prompt, 4, set())
    assert len(STARTS) == 3 and len(set(STARTS)) == 1


def test_check_runs_every_prompt_through_one_instance(tmp_path):
    path = tmp_path / "counting.py"
    path.write_text(
        textwrap.dedent("""
        import os
        from selfspec import hookimpl

        class Plugin:  # a class: instantiated once per Decoder
            made = 0

            def __init__(self):
                Plugin.made += 1
                self.serial = Plugin.made

            @hookimpl
            def selfspec_start(self):
                with open(os.environ["COUNTING_LOG"], "a") as f:
                    f.write(f"{self.serial}\\n")
        """)
    )
    log = tmp_path / "starts.log"
    model_dir = save_tiny_llama(tmp_path / "tiny", seed=1)
    r = CliRunner().invoke(
        cli,
        [
            "check",
            "--plugin-file",
            str(path),
            "-m",
            str(model_dir),
            "--dtype",
            "float64",
            "-n",
            "4",
            "--prompt",
            "a b",
            "--prompt",
            "c d",
            "--prompt",
            "e f",
            "--json",
        ],
        env={"COUNTING_LOG": str(log)},
    )
    assert r.exit_code == 0, r.output
    assert [row["status"] for row in json.loads(r.stdout)["results"]] == ["OK"] * 3
    starts = log.read_text().split()
    assert len(starts) == 3 and len(set(starts)) == 1  # three decodes through one instance


class CountingSuite(PluginSuite):  # not collected (no Test prefix): the test below calls one method
    plugin = "counting"
    plugin_object = Counting
    archs = ("llama",)


def test_the_kit_runs_a_sequence_through_one_instance(tiny_model_factory):
    from selfspec.testing._sequences import DECODE_SEQUENCE, SAMPLED_SEEDS

    CountingSuite().test_lossless_across_decodes("llama", "cpu", tiny_model_factory)
    # the warm-up, then each prompt, then the sampled decodes under each seed
    assert len(STARTS) == 1 + len(DECODE_SEQUENCE) + len(SAMPLED_SEEDS) and len(set(STARTS)) == 1
