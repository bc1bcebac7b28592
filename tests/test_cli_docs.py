"""docs/cli.md covers every built-in ``specdec`` command and option.

Walks the real click tree (the built-in commands, the benchmark commands included; plugin
commands are documented by their plugins) and fails on any command whose ``specdec NAME``
or any option (every spelling, ``-n`` and ``--max-new-tokens``) that docs/cli.md never shows
in backticks.
"""

from __future__ import annotations

import re
from pathlib import Path

import click

from selfspec.app._cli import cli

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
CODE = (
    " ".join(re.findall(r"`([^`\n]+)`", PAGE))
    + "\n"
    + " ".join(re.findall(r"```.*?```", PAGE, re.S))
)


def _commands(
    cmd: click.Command, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], click.Command]]:
    out = [(path, cmd)]
    if isinstance(cmd, click.Group):
        for name, sub in sorted(cmd.commands.items()):
            out += _commands(sub, (*path, name))
    return out


def _flags(cmd: click.Command) -> list[str]:
    return [
        flag
        for p in cmd.params
        if isinstance(p, click.Option)
        for flag in (*p.opts, *p.secondary_opts)
    ]


def _shown(flag: str, text: str = CODE) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


def test_the_walk_finds_every_built_in_command():
    names = {" ".join(p) for p, _ in _commands(cli)}
    assert {
        "run",
        "plugins",
        "check",
        "models",
        "models install",
        "bench",
        "sweep",
        "report",
    } <= names


def test_every_command_is_on_the_cli_page():
    missing = [" ".join(p) for p, _ in _commands(cli) if p and f"specdec {' '.join(p)}" not in PAGE]
    assert not missing, f"docs/cli.md never shows: {missing}"


def test_every_option_of_every_command_is_on_the_cli_page():
    missing = sorted(
        {
            f"specdec {' '.join(p)} {f}".replace("  ", " ")
            for p, c in _commands(cli)
            for f in _flags(c)
            if not _shown(f)
        }
    )
    assert not missing, f"docs/cli.md never shows: {missing}"


def test_the_check_can_fail():
    assert not _shown("--max-new", "`--max-new-tokens N`")
    assert _shown("-n", "`-n, --max-new-tokens N`") and not _shown("--no-such-option")
