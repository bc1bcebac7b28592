"""The ``specdec`` command line.

``specdec [OPTIONS] "prompt"`` decodes with the chosen plugin and streams the answer;
``specdec plugins`` lists the installed plugins; ``specdec check`` compares a plugin with plain
greedy decoding; plugins add their own sub-commands (``specdec --plugin selfsd tune``) through
the ``selfspec_commands`` hook. Model, plugin and generation options may be given before the
prompt or command, or after it (the later value wins; ``-o`` pairs accumulate).

Heavy modules (torch, transformers) are imported inside the commands, so ``--help`` is quick.
Bad input ends with a one-line message and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

from selfspec.app._cli import check, models, plugins, run, serve  # noqa: F401  (each registers its command on the group)
from selfspec.app._cli.group import cli
from selfspec.app._cli.run import Streamer, summary_line
from selfspec.app._cli.settings import (
    BUILTIN_COMMANDS,
    CHECK_MAX_NEW_TOKENS,
    DEFAULT_CHECK_PROMPTS,
    RUN_MAX_NEW_TOKENS,
    BadInput,
    CliError,
    Settings,
    plugin_commands,
    user_errors,
)

__all__ = [
    "BUILTIN_COMMANDS",
    "CHECK_MAX_NEW_TOKENS",
    "DEFAULT_CHECK_PROMPTS",
    "RUN_MAX_NEW_TOKENS",
    "BadInput",
    "CliError",
    "Settings",
    "Streamer",
    "cli",
    "main",
    "plugin_commands",
    "summary_line",
    "user_errors",
]


def _attach_bench_commands() -> None:
    from selfspec.app._bench.commands import COMMANDS

    for command in COMMANDS:
        cli.add_command(command)


_attach_bench_commands()


def _dev_corpus(tasks: tuple[str, ...]):  # noqa: ANN202
    from selfspec.app._data import build_corpus_texts

    return build_corpus_texts(tasks)


def _register_corpus() -> None:
    """The command line ranks draft vocabularies by the app's dev-split texts."""
    from selfspec._engine.drafting.corpus import set_vocab_corpus

    set_vocab_corpus(_dev_corpus)


_register_corpus()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``specdec``)."""
    cli.main(args=argv, prog_name="specdec")
