"""``specdec --plugin selfdraft build-corpus FILES...``: a corpus cache from text files."""

from __future__ import annotations

from pathlib import Path

import click

from selfspec.app import CommandContext


@click.command("build-corpus")
@click.argument(
    "files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "--out",
    "-O",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="where to write the .npz (default: the selfspec cache dir, named after the tokenizer)",
)
@click.option("--max-tokens", type=int, default=None, help="stop after this many tokens")
@click.option(
    "--max-prefix",
    type=click.IntRange(1, 3),
    default=3,
    show_default=True,
    help="longest prefix (tokens) the cache matches",
)
@click.option(
    "--top",
    type=click.IntRange(1, 64),
    default=4,
    show_default=True,
    help="continuations kept per prefix",
)
@click.option(
    "--min-count",
    type=click.IntRange(1),
    default=2,
    show_default=True,
    help="drop n-grams seen fewer times",
)
@click.pass_obj
def build_corpus(
    command: CommandContext, files, out, max_tokens, max_prefix, top, min_count
) -> None:
    """Count n-grams of FILES (UTF-8 text, one document per file, or per line for .jsonl of
    {"text": ...}) in the model's tokens, and write a corpus cache for ``-o corpus=PATH``."""
    import json

    from .build import build_from_texts
    from .corpus import tokenizer_key

    loaded = command.load_model()
    tokenizer = getattr(loaded, "tokenizer", None)
    if tokenizer is None:
        raise click.ClickException("the model has no tokenizer: a corpus cache needs one")

    def texts():
        for f in files:
            try:
                raw = f.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise click.ClickException(f"{f}: not UTF-8 text ({exc.reason})") from None
            if f.suffix == ".jsonl":
                for i, line in enumerate(raw.splitlines(), 1):
                    if line.strip():
                        try:
                            yield json.loads(line)["text"]
                        except (ValueError, KeyError, TypeError):
                            raise click.ClickException(
                                f"{f}:{i}: expected a JSON object with a 'text' field"
                            ) from None
            else:
                yield raw

    cache = build_from_texts(
        texts(),
        tokenizer,
        max_tokens=max_tokens,
        max_prefix=max_prefix,
        top=top,
        min_count=min_count,
        meta={"source": [str(f) for f in files]},
    )
    if out is None:
        from .build import STORE

        out = STORE.path(f"corpus-{tokenizer_key(tokenizer)}-files.npz")
    path = cache.save(out)
    click.echo(
        f"{path}: {cache.meta['tokens']} tokens, {len(cache)} continuations; use -o corpus={path}"
    )
