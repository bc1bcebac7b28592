"""A busy machine (the load average at the start at least the physical core count): the CLI
sets ``OMP_WAIT_POLICY=PASSIVE`` before torch loads, or runs one thread when it cannot, says so
in one line on stderr and records it in ``--json`` (measurements in
docs/performance.md, "A busy machine"). In this process torch is loaded already, so the CLI
runs here take the one-thread path; the PASSIVE path runs in fresh interpreters."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from _tiny_models import save_tiny_llama
from click.testing import CliRunner

from selfspec._engine.tuning import machine
from selfspec.app import _models as models
from selfspec.app._cli import cli


@pytest.fixture(autouse=True)
def _restore_threads(tmp_path, monkeypatch):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize(
    "requested, load, cores, want",
    [
        (None, 2.0, 2, (1, "busy")),  # load = cores: busy
        (None, 13.7, 2, (1, "busy")),
        (None, 1.9, 2, (None, "default")),
        (None, None, 2, (None, "default")),  # no load average on this OS
        (None, 9.0, 1, (None, "default")),  # one core: one thread anyway
        (3, 13.7, 2, (3, "asked")),  # --threads wins
    ],
)
def test_choose_threads(monkeypatch, requested, load, cores, want):
    monkeypatch.setattr(machine, "physical_cores", lambda: cores)
    monkeypatch.setattr(machine, "load_average", lambda: load)
    choice = machine.choose_threads(requested)
    threads, reason = want
    assert (
        choice.reason == reason and choice.load_average == load and choice.physical_cores == cores
    )
    assert choice.threads == (threads if threads is not None else machine.default_threads())
    assert choice.wait_policy is None  # torch was loaded before anything could set PASSIVE


FRESH = """
import os, sys
from selfspec._engine.tuning import machine
machine.load_average = lambda: LOAD
machine.physical_cores = lambda: 2
print(machine.prefer_passive_wait(), os.environ.get("OMP_WAIT_POLICY"))
import torch
c = machine.choose_threads()
print(c.threads == machine.default_threads(), c.threads, c.reason, c.wait_policy)
"""


@pytest.mark.parametrize(
    "load, env, want",
    [
        (7.5, None, ["True PASSIVE", "True busy PASSIVE"]),  # busy: PASSIVE, the default threads
        (0.5, None, ["False None", "True default None"]),  # quiet: nothing changes
        (
            7.5,
            "ACTIVE",
            ["False ACTIVE", "1 busy None"],
        ),  # the user's policy stays; one thread then
    ],
)
def test_a_fresh_process_sets_passive_before_torch_loads(load, env, want):
    environ = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env:
        environ["OMP_WAIT_POLICY"] = env
    run = subprocess.run(
        [sys.executable, "-c", FRESH.replace("LOAD", str(load))],
        capture_output=True,
        text=True,
        env=environ,
        check=True,
    )
    first, second = run.stdout.split("\n")[:2]
    threads_default, threads, rest = second.split(" ", 2)
    assert [
        first,
        f"{threads_default} {rest}" if want[1].startswith("True") else f"{threads} {rest}",
    ] == want


def test_too_late_once_torch_is_loaded(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(machine, "load_average", lambda: 99.0)
    monkeypatch.setattr(machine, "physical_cores", lambda: 2)
    assert machine.prefer_passive_wait() is False and "OMP_WAIT_POLICY" not in os.environ


def test_the_cli_says_so_in_one_line_and_records_it(monkeypatch, tmp_path):
    model_dir = save_tiny_llama(tmp_path / "tiny", seed=1)
    monkeypatch.setattr(machine, "physical_cores", lambda: 2)
    monkeypatch.setattr(machine, "load_average", lambda: 7.5)
    run = CliRunner().invoke(cli, ["-m", str(model_dir), "-n", "3", "hello"])
    assert run.exit_code == 0, run.output
    notes = [
        line for line in run.stderr.splitlines() if line.startswith("specdec:") and "busy" in line
    ]
    assert notes == [
        "specdec: the machine is busy (load average 7.5 on 2 cores): running on 1 thread "
        "(--threads N to override)"
    ]  # torch is loaded here already: one thread
    assert torch.get_num_threads() == 1
    out = CliRunner().invoke(cli, ["-m", str(model_dir), "-n", "3", "--json", "hello"])
    assert out.exit_code == 0 and out.stderr == ""  # --json: nothing on stderr, the record says it
    stats = json.loads(out.stdout)["stats"]
    assert (stats["threads"], stats["threads_reason"], stats["load_average_start"]) == (
        1,
        "busy",
        7.5,
    )
    assert stats["omp_wait_policy"] is None
    asked = json.loads(
        CliRunner()
        .invoke(cli, ["-m", str(model_dir), "-n", "3", "--threads", "2", "--json", "hello"])
        .stdout
    )["stats"]
    assert (asked["threads"], asked["threads_reason"]) == (2, "asked")
