"""``specdec run`` (the default command): decode a prompt and stream the answer."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from selfspec.app._cli.group import _generation_options, _model_options, _sampling_options, cli
from selfspec.app._cli.settings import (
    RUN_MAX_NEW_TOKENS,
    BadInput,
    Settings,
    placement_record,
    user_errors,
)


@cli.command("run")
@_model_options
@_generation_options
@_sampling_options
@click.argument("prompt", nargs=-1)
@click.pass_context
def run_command(ctx: click.Context, prompt: tuple[str, ...], **params: Any) -> None:
    """Decode PROMPT and stream the answer (the default command)."""
    settings: Settings = ctx.obj.merged(params)
    text = " ".join(prompt)
    if not text.strip():
        raise BadInput("the prompt is empty")
    with user_errors():
        from selfspec.app import _models as models

        settings.validate_model_args()
        settings.validate_plugin()
        loaded = settings.load_model()
        try:
            prompt_ids = models.format_prompt(loaded, text)
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        decoder = settings.decoder(
            loaded, adopt_weights=True
        )  # nothing else needs the model's weights as they were
        max_new = (
            settings.max_new_tokens if settings.max_new_tokens is not None else RUN_MAX_NEW_TOKENS
        )
        streamer = None if settings.json or settings.no_stream else Streamer(loaded.tokenizer)
        try:
            result = decoder.generate(prompt_ids, max_new, loaded.eos_token_ids, stream=streamer)
        finally:
            if streamer is not None:
                streamer.finish()

    if settings.json:
        click.echo(
            json.dumps(
                {
                    "plugin": decoder.plugin_name,
                    "model": loaded.name,
                    "options": decoder.options,
                    "sampling": decoder.sampling.as_dict(),
                    "device": str(loaded.device),
                    "dtype": str(loaded.dtype).removeprefix("torch."),
                    "placement": placement_record(loaded),
                    "prompt_ids": result.prompt_ids,
                    "output_ids": result.output_ids,
                    "text": result.text,
                    "stats": {**result.stats.as_dict(), **settings.thread_choice.as_dict()},
                }
            )
        )
        return
    if streamer is None:
        click.echo(result.text)
    click.echo(summary_line(result.stats, decoder.plugin_name, loaded.name), err=True)


class Streamer:
    """Prints the text of committed ids as they arrive: decodes all of them and prints what is
    new, holding back an incomplete multi-byte character."""

    def __init__(self, tokenizer: Any, write: Callable[[str], None] | None = None) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.printed = ""
        self.write = write or (lambda s: click.echo(s, nl=False))

    def __call__(self, new_ids: list[int]) -> None:
        self.ids.extend(new_ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        self._emit(text)

    def finish(self) -> None:
        self._emit(self.tokenizer.decode(self.ids, skip_special_tokens=True))
        self.write("\n")
        sys.stdout.flush()

    def _emit(self, text: str) -> None:
        if text.startswith(self.printed):
            new = text[len(self.printed) :]
        else:  # the decoder re-spaced earlier text: print from the first difference on
            common = os.path.commonprefix([text, self.printed])
            new = text[len(common) :]
        if new:
            self.write(new)
            sys.stdout.flush()
        self.printed = text


def summary_line(stats: Any, plugin: str, model: str) -> str:
    """One line: tokens, tok/s, tau (tokens per full forward), acceptance."""
    acc = (
        f"{stats.acceptance:.1%} ({stats.accepted}/{stats.drafted} drafted)"
        if stats.drafted
        else "n/a (no drafts)"
    )
    return (
        f"[{plugin} | {model}] {stats.new_tokens} tokens in {stats.wall_time_s:.2f} s "
        f"({stats.tokens_per_s:.1f} tok/s) | tau {stats.tau:.2f} | acceptance {acc} | "
        f"{stats.steps} steps"
    )
