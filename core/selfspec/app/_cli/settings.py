"""What the command line asked for (:class:`Settings`), the CLI's error types and the
context that turns the host's "bad input" exceptions into one-line messages.

:class:`Settings` is public: plugin commands (``selfspec_commands``) receive it as
``ctx.obj`` and load the model and build decoders through it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:  # pragma: no cover
    from selfspec._engine.contract.loop import Decoder
    from selfspec.app._models import Loaded

#: Prompts ``specdec check`` uses when none are given: short, varied, and quick to decode.
DEFAULT_CHECK_PROMPTS: tuple[str, ...] = (
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "List three primary colors.",
    "Explain in one sentence why the sky is blue.",
)
RUN_MAX_NEW_TOKENS = 128
CHECK_MAX_NEW_TOKENS = 32
#: ``specdec check``'s long example: a prompt of this many tokens or more and this many new
#: tokens without EOS, the lengths of the kit's long examples (selfspec.testing._scenarios.reach)
CHECK_LONG_PROMPT = 520
CHECK_LONG_NEW = 260
BUILTIN_COMMANDS = ("run", "plugins", "check", "models", "serve", "bench", "sweep", "report")


class CliError(click.ClickException):
    """A failure the user can fix: printed as one line, exit status 1."""


class BadInput(CliError):
    """Malformed input (an option value, an empty prompt): one line, exit status 2."""

    exit_code = 2


@dataclass
class Settings:
    """What the command line asked for: the CLI's own dataclass, one field per flag. For
    scripts that drive the CLI's machinery (``Settings(plugin="lookup").plugin_name``); it
    changes whenever a flag is added, so plugin commands use :class:`CommandContext` (their
    ``ctx.obj``) instead."""

    plugin: str | None = None
    plugin_file: str | None = None
    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    device_map: str | None = None
    max_memory: str | None = None
    offload_folder: str | None = None
    threads: int | None = None
    weight_layout: str | None = None
    exact: bool | None = None
    options: tuple[str, ...] = ()
    max_new_tokens: int | None = None
    json: bool = False
    no_stream: bool = False
    chat: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    _plugin_cache: dict[str, Any] = field(default_factory=dict, repr=False)
    #: what :meth:`load_model` chose (:class:`selfspec._engine.tuning.machine.ThreadChoice`), None
    #: before
    thread_choice: Any = field(default=None, repr=False, compare=False)

    def merged(self, params: dict[str, Any]) -> Settings:
        """These settings overridden by a sub-command's own (later) options."""
        new = replace(self, _plugin_cache=self._plugin_cache)
        for key, value in params.items():
            if not hasattr(new, key) or value is None:
                continue
            if key == "options":
                new.options = (*new.options, *value)
            elif key in ("json", "no_stream", "exact"):
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
        from selfspec._engine.contract.plugins import BUILTIN_METHOD

        return BUILTIN_METHOD

    def plugin_object(self) -> tuple[str, Any]:
        """``(name, object)``: the ``--plugin-file`` module (imported once), or ``None`` to
        look the plugin up by name among the installed entry points."""
        if not self.plugin_file:
            return self.plugin_name, None
        key = os.path.abspath(self.plugin_file)
        if key not in self._plugin_cache:
            from selfspec._engine.contract.plugins import load_file

            self._plugin_cache[key] = load_file(self.plugin_file)
        stem, module = self._plugin_cache[key]
        return self.plugin or stem, module

    def parsed_options(self) -> dict[str, str]:
        from selfspec._engine.contract.options import parse_pairs

        return parse_pairs(self.options)

    def validate_plugin(self) -> dict[str, Any]:
        """Load the plugin and check the ``-o`` options against what it declares (before any
        model is loaded). Returns the resolved option values."""
        from selfspec._engine.contract.manager import make_manager
        from selfspec._engine.contract.options import resolve
        from selfspec._engine.contract.plugins import declared_options

        plugin_commands(self)  # a command-name clash is an error whatever the command
        name, obj = self.plugin_object()
        pm, _ = make_manager(name, obj)
        return resolve(declared_options(pm), self.parsed_options(), name)

    # ---------------------------------------------------------------------------- model
    def validate_model_args(self) -> None:
        """Check dtype, device and weight layout before anything is loaded: an explicit
        ``--weight-layout packed`` this CPU cannot run fails here, in one line."""
        from selfspec._engine.runner.formats import check_layout
        from selfspec.app import _models as models

        dtype = models.parse_dtype(self.dtype or "float32")
        self.placement_request()
        if self.device_map is None and self.max_memory is None and self.offload_folder is None:
            device = models.parse_device(self.device or "cpu")
            check_layout(self.weight_layout or "auto", device, dtype)

    def load_model(self) -> Loaded:
        """Set the thread count and load the model (a :class:`selfspec.app._models.Loaded`)."""
        import torch

        from selfspec._engine.tuning.machine import choose_threads
        from selfspec.app import _models as models

        self.thread_choice = choose_threads(self.threads)  # the busy-machine rule (docs/cli.md)
        torch.set_num_threads(self.thread_choice.threads)
        if self.thread_choice.reason == "busy" and not self.json:
            click.echo(self.thread_choice.note(), err=True)
        request = self.placement_request()
        loaded = models.load(
            self.model,
            device=self.device or "cpu",
            dtype=self.dtype or "float32",
            device_map=request.device_map,
            max_memory=request.max_memory or None,
            offload_folder=request.offload_folder,
            chat=self.chat,
        )
        if request.asked and not self.json:  # said once; --json records it in the object instead
            from selfspec.app._models.placement import placement_line

            click.echo(f"selfspec: {placement_line(loaded)}", err=True)
        return loaded

    def placement_request(self) -> Any:
        """The checked ``--device-map/--max-memory/--offload-folder``
        (:class:`selfspec.app._models.placement.PlacementRequest`); :class:`BadInput` for a
        malformed value."""
        from selfspec.app._models import ModelLoadError
        from selfspec.app._models.placement import placement_request

        try:
            return placement_request(self.device_map, self.max_memory, self.offload_folder)
        except ModelLoadError as exc:
            raise BadInput(str(exc)) from None

    def sampling(self) -> Any:
        """The :class:`selfspec.Sampling` of ``--temperature/--top-k/--top-p/--seed`` (greedy
        when no temperature or 0 was given)."""
        from selfspec._engine.contract.sampling import Sampling

        try:
            return Sampling(
                self.temperature or 0.0,
                self.top_k or 0,
                1.0 if self.top_p is None else self.top_p,
                self.seed or 0,
            )
        except ValueError as exc:
            raise BadInput(str(exc)) from None

    def decoder(self, loaded: Loaded, adopt_weights: bool = False) -> Decoder:
        """A :class:`selfspec.Decoder` for ``loaded`` with the selected plugin and options.
        ``adopt_weights``: lay the model's own weights out in place (one copy in memory) when
        nothing else needs them as they were."""
        from selfspec._engine.contract.loop import Decoder

        name, obj = self.plugin_object()
        return Decoder(
            loaded.model,
            name,
            self.parsed_options(),
            tokenizer=loaded.tokenizer,
            plugin_object=obj,
            weight_layout=self.weight_layout or "auto",
            adopt_weights=adopt_weights,
            sampling=self.sampling(),
            exact=bool(self.exact),
        )


def placement_record(loaded: Loaded) -> dict[str, Any] | None:
    """The placement as ``--json`` records it
    (:func:`selfspec.app._models.placement.placement_record`)."""
    from selfspec.app._models.placement import placement_record as record  # torch: on use only

    return record(loaded)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """``with user_errors(): ...`` turns the host's own "bad input" exceptions
    (``OptionError``, ``PluginError``, a model that cannot be loaded or is not supported, an
    unknown weight layout) into one-line click errors."""
    from selfspec._engine.contract.options import OptionError
    from selfspec._engine.contract.plugins import PluginError
    from selfspec._engine.runner import UnsupportedModelError
    from selfspec._engine.runner.layout import WeightLayoutError
    from selfspec.app._models import ModelLoadError

    try:
        yield
    except (OptionError, WeightLayoutError) as exc:
        raise BadInput(str(exc)) from None
    except UnsupportedModelError as exc:
        raise CliError(str(exc)) from None
    except (PluginError, ModelLoadError) as exc:
        raise CliError(str(exc)) from None


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
        from selfspec._engine.contract.manager import make_manager
        from selfspec._engine.contract.plugins import PluginError

        name, obj = settings.plugin_object()
        pm, _ = make_manager(name, obj)

        def register(command: Any) -> None:
            if not isinstance(command, click.Command):
                raise PluginError(
                    name, f"selfspec_commands registered {command!r}, not a click.Command"
                )
            if command.name in BUILTIN_COMMANDS:
                raise PluginError(
                    name, f"command {command.name!r} clashes with the built-in command of that name"
                )
            if command.name in commands:
                raise PluginError(name, f"command {command.name!r} is registered twice")
            commands[str(command.name)] = command

        try:
            pm.hook.selfspec_commands(register=register)
        except PluginError:
            raise
        except Exception as exc:
            raise PluginError(
                name, f"selfspec_commands raised {type(exc).__name__}: {exc}"
            ) from exc
    settings._plugin_cache[key] = commands
    return commands
