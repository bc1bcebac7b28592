"""A group option reaches every command or is refused there (``specdec --threads 1 bench``).

a) ``bench`` and ``sweep`` have their own model and run options: a group option of the same
   meaning is the default of theirs, and the command's own option, given after it, wins.
b) A group option a command has no use for is a usage error naming it, never dropped.
The thread choice is intercepted (``_threads``) so that no model is loaded.
"""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from selfspec.app._bench import commands
from selfspec.app._cli import cli


class Reached(click.ClickException):
    pass


@pytest.fixture
def threads_seen(monkeypatch):
    def stop(threads):  # the bench's thread choice: say what reached it, load nothing
        raise Reached(f"threads={threads}")

    monkeypatch.setattr(commands, "_threads", stop)


def run(*args):
    return CliRunner().invoke(cli, list(args))


@pytest.mark.parametrize("command", ["bench", "sweep"])
def test_the_group_threads_reach_bench_and_sweep(threads_seen, command):  # see a)
    extra = ["-p", "lookup"] if command == "sweep" else ["-p", "none", "--no-peers"]
    r = run("--threads", "1", command, "--tasks", "humaneval", "--samples", "1", *extra)
    assert "threads=1" in r.output, r.output


def test_the_command_s_own_option_wins_over_the_group_s(threads_seen):  # see a)
    r = run(
        "--threads",
        "1",
        "bench",
        "--threads",
        "2",
        "--tasks",
        "humaneval",
        "--samples",
        "1",
        "-p",
        "none",
        "--no-peers",
    )
    assert "threads=2" in r.output, r.output


@pytest.mark.parametrize(
    "args, flag",
    [
        (("--json", "report", "."), "--json"),
        (("--model", "m", "report", "."), "--model"),
        (("--exact", "bench"), "--exact"),
    ],
)
def test_a_group_option_a_command_does_not_use_is_refused(args, flag):  # see b)
    r = run(*args)
    assert r.exit_code == 2, r.output
    assert (
        f"{flag} is not used by `specdec {args[-2] if args[-1] == '.' else args[-1]}`" in r.output
    )
