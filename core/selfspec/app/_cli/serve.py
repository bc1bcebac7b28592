"""``specdec serve``: the OpenAI-compatible HTTP server (``docs/serve.md``)."""

from __future__ import annotations

import sys
from typing import Any

import click

from selfspec.app._cli.group import _model_options, _sampling_options, cli
from selfspec.app._cli.settings import RUN_MAX_NEW_TOKENS, BadInput, CliError, Settings, user_errors


@cli.command("serve")
@_model_options
@_sampling_options
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind: 127.0.0.1 serves this machine only; 0.0.0.0 every network.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="TCP port (0: a free one, printed at start).",
)
@click.option(
    "--api-key",
    metavar="KEY",
    envvar="SELFSPEC_API_KEY",
    default=None,
    help="Require `Authorization: Bearer KEY` on /v1 routes (401 otherwise); also "
    "$SELFSPEC_API_KEY.",
)
@click.option(
    "--max-new-tokens",
    "-n",
    type=click.IntRange(min=1),
    default=None,
    help=f"max_tokens of a request that gives none (default {RUN_MAX_NEW_TOKENS}).",
)
@click.option(
    "--max-tokens-limit",
    type=click.IntRange(min=1),
    default=2048,
    show_default=True,
    help="Largest max_tokens a request may ask for (more: 400).",
)
@click.option(
    "--max-prompt-tokens",
    type=click.IntRange(min=1),
    default=4096,
    show_default=True,
    help="Longest prompt, in tokens after the chat template (more: 400).",
)
@click.option(
    "--queue-size",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Requests that may wait behind the running one (one decode at a time); more: 503 with "
    "Retry-After.",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1),
    default=None,
    help="Longest request body in bytes (more: 413). Default: 256 per --max-prompt-tokens, "
    "at least 1 MiB.",
)
@click.option(
    "--allowed-hosts",
    metavar="H1,H2",
    default=None,
    help="Host names and addresses the Host header may name (others: 400); '*' any. Default: the "
    "bound address and localhost (any host for a wildcard address such as 0.0.0.0).",
)
@click.option(
    "--cors-origin",
    "cors_origins",
    metavar="ORIGIN",
    multiple=True,
    help="An origin (https://app.example) whose web pages may call the server, with CORS; "
    "repeatable; '*' any. Requests from other pages (an Origin header) get 403.",
)
@click.option(
    "--message-special-tokens",
    type=click.Choice(["text", "parse"]),
    default="text",
    show_default=True,
    help="Special-token strings typed into chat message content: encoded as text, or parsed "
    "into the special tokens (which lets a user forge turns).",
)
@click.option(
    "--shutdown-grace",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds the running decode may take after SIGTERM/Ctrl-C before it is cancelled.",
)
@click.pass_context
def serve_command(
    ctx: click.Context,
    host: str,
    port: int,
    api_key: str | None,
    max_tokens_limit: int,
    max_prompt_tokens: int,
    queue_size: int,
    max_body_bytes: int | None,
    allowed_hosts: str | None,
    cors_origins: tuple[str, ...],
    message_special_tokens: str,
    shutdown_grace: float,
    **params: Any,
) -> None:
    """Serve the model over an OpenAI-compatible HTTP API.

    \b
      GET  /health                200 once the model is ready, 503 before
      GET  /v1/models             the one model served
      POST /v1/completions        text (or token ids) in, text out
      POST /v1/chat/completions   messages through the model's chat template

    Both POST routes stream server-sent events with "stream": true. One model and one decoder
    per process; requests run one at a time in arrival order. Sampling is the host's seeded,
    position-keyed sampling: temperature/top_p/top_k/seed of a request (else these options)
    give exactly the tokens `specdec --temperature ... --seed ...` gives. See docs/serve.md.
    """
    settings: Settings = ctx.obj.merged(params)
    try:
        from selfspec.app._serve.protocol import Defaults, Limits
        from selfspec.app._serve.server import bind, serve
    except ImportError as exc:
        raise CliError(
            f"specdec serve needs the serve extra ({exc.name} is missing): "
            "pip install 'selfspec[serve]'"
        ) from None
    default_max = (
        settings.max_new_tokens if settings.max_new_tokens is not None else RUN_MAX_NEW_TOKENS
    )
    if default_max > max_tokens_limit:
        raise BadInput(
            f"--max-new-tokens {default_max} is above --max-tokens-limit {max_tokens_limit}"
        )
    with user_errors():
        settings.validate_model_args()
        settings.validate_plugin()
    sampling = (
        settings.sampling()
    )  # a bad --temperature/--top-p combination fails here, in one line
    defaults = Defaults(sampling.temperature, sampling.top_k, sampling.top_p, sampling.seed)
    limits = Limits(
        max_tokens_limit=max_tokens_limit,
        max_prompt_tokens=max_prompt_tokens,
        default_max_tokens=default_max,
        max_body_bytes=max_body_bytes,
    )
    hosts = None if allowed_hosts is None else [h for h in allowed_hosts.split(",") if h.strip()]
    if hosts is not None and not hosts:
        raise BadInput("--allowed-hosts names no host ('*' allows any)")
    try:
        sock = bind(host, port)
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    status = serve(
        settings,
        sock,
        api_key=api_key or None,
        queue_size=queue_size,
        limits=limits,
        defaults=defaults,
        allowed_hosts=hosts,
        cors_origins=cors_origins,
        specials_as_text=message_special_tokens == "text",
        grace_s=shutdown_grace,
    )
    if status:
        sys.exit(status)
