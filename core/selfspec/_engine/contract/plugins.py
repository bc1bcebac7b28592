"""Plugin discovery, loading and the plugin manager factory.

Method plugins are found through the ``selfspec`` entry-point group; the value names a class
(instantiated once per decoder, so per-decode state lives on the instance) or a module (its
module-level hook implementations are registered as they are). Only the plugin asked for is
imported, plus the host's built-ins. Loading is strict: a hook implementation whose name
starts with ``selfspec_`` but is not a known hook, or that asks for an argument the hook does
not have, is an error at load time.

Environment variables:

* ``SELFSPEC_TRACE=1`` turns on pluggy's hook-call tracing (written to stderr);
* ``SELFSPEC_BLOCK_PLUGINS=a,b`` refuses to load the named plugins.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from selfspec._engine.contract.builtin import default_plugins
from selfspec._engine.contract.markers import PROJECT
from selfspec._engine.contract.options import Option
from selfspec._engine.tuning.version import __version__

ENTRY_POINT_GROUP = "selfspec"
BUILTIN_METHOD = "vanilla"
#: Joins the members of a composed plugin name: ``"lookup+selfsd"``.
SEPARATOR = "+"


class PluginError(RuntimeError):
    """A plugin could not be loaded, or broke a contract; the message names it. Exceptions a
    hook raises reach the caller wrapped in it."""

    def __init__(self, plugin: str, message: str) -> None:
        super().__init__(f"plugin {plugin!r}: {message}")
        self.plugin = plugin


class UnknownPluginError(PluginError):
    pass


@dataclass(frozen=True)
class PluginInfo:
    name: str
    version: str | None
    distribution: str | None
    value: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "distribution": self.distribution,
            "value": self.value,
        }


def member_names(plugin: str | Sequence[str]) -> list[str] | None:
    """The members of a composed plugin name (``"a+b"`` or ``["a", "b"]``), None for one plugin."""
    names = [p.strip() for p in (plugin.split(SEPARATOR) if isinstance(plugin, str) else plugin)]
    if isinstance(plugin, str) and len(names) == 1:
        return None
    return names


def label(plugin: str | Sequence[str]) -> str:
    """The decoder's plugin name: ``"lookup+selfsd"`` for a list of members."""
    return plugin if isinstance(plugin, str) else SEPARATOR.join(p.strip() for p in plugin)


def blocked() -> set[str]:
    return {p.strip() for p in os.environ.get("SELFSPEC_BLOCK_PLUGINS", "").split(",") if p.strip()}


def available() -> dict[str, PluginInfo]:
    """Every installed method plugin by name (the built-in ``vanilla`` first), without importing
    any: ``{name: info}`` with the info's ``name``, ``version``, ``distribution`` and entry-point
    ``value``. A plugin's test suite starts with ``assert "myplugin" in available_plugins()``."""
    found = {
        BUILTIN_METHOD: PluginInfo(
            BUILTIN_METHOD, __version__, "selfspec", "selfspec._engine.contract.builtin"
        )
    }
    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = getattr(ep, "dist", None)
        found.setdefault(
            ep.name,
            PluginInfo(
                ep.name,
                dist.version if dist else None,
                dist.metadata["Name"] if dist else None,
                ep.value,
            ),
        )
    return found


def _load_object(name: str) -> Any:
    if name in blocked():
        raise PluginError(name, "is blocked by SELFSPEC_BLOCK_PLUGINS")
    if name == BUILTIN_METHOD:
        return None
    eps = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not eps:
        names = ", ".join(available())
        raise UnknownPluginError(name, f"is not installed (installed: {names})")
    try:
        return eps[0].load()
    except Exception as exc:  # an import error inside the plugin package
        raise PluginError(name, f"failed to import {eps[0].value}: {exc}") from exc


def load_file(path: str | os.PathLike[str]) -> tuple[str, ModuleType]:
    """Import an unpackaged ``.py`` file as a plugin (``specdec --plugin-file``)."""
    p = Path(path)
    if not p.is_file():
        raise PluginError(str(path), "plugin file does not exist")
    mod_name = f"selfspec_file_{p.stem}"
    spec = importlib.util.spec_from_file_location(mod_name, p)
    if spec is None or spec.loader is None:
        raise PluginError(str(path), "is not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise PluginError(str(path), f"failed to import: {exc}") from exc
    return p.stem, module


def instantiate(obj: Any) -> Any:
    """A class is instantiated (one instance per decoder); a module is used as it is."""
    if inspect.isclass(obj):
        return obj()
    if isinstance(obj, ModuleType):
        # A module is the plugin when it has module-level hooks; otherwise its class `Plugin`;
        # otherwise the one class it defines (not imports) with hook methods, its own or
        # inherited (so `--plugin-file` works on a packaged plugin's module, and on a file that
        # imports another plugin's class to subclass it).
        if any(_is_hook(name, value) for name, value in vars(obj).items()):
            return obj
        if inspect.isclass(getattr(obj, "Plugin", None)):
            return obj.Plugin()
        classes = [
            c
            for c in vars(obj).values()
            if inspect.isclass(c)
            and c.__module__ == obj.__name__
            and any(_is_hook(n, getattr(c, n, None)) for n in dir(c))
        ]
        if len(classes) == 1:
            return classes[0]()
        if len(classes) > 1:
            names = ", ".join(c.__name__ for c in classes)
            raise ValueError(
                f"defines several plugin classes ({names}); name the one to use `Plugin`"
            )
        return obj
    return obj


def _is_hook(name: str, value: Any) -> bool:
    return name.startswith(f"{PROJECT}_") and callable(value)


def builtin_plugins() -> list[tuple[str, Any]]:
    return default_plugins()


class _Manager(pluggy.PluginManager):
    """Treats any callable named ``selfspec_*`` as a hook implementation, marked or not, so a
    misspelled hook is caught by :meth:`check_pending` instead of silently never running."""

    def parse_hookimpl_opts(self, plugin: Any, name: str):  # type: ignore[override]
        opts = super().parse_hookimpl_opts(plugin, name)
        if (
            opts is None
            and name.startswith(f"{PROJECT}_")
            and callable(getattr(plugin, name, None))
        ):
            opts = {
                "wrapper": False,
                "hookwrapper": False,
                "optionalhook": False,
                "tryfirst": False,
                "trylast": False,
                "specname": None,
            }
        return opts


def _all_impls(pm: pluggy.PluginManager) -> list[Any]:
    return [
        impl
        for caller in pm.hook.__dict__.values()
        if isinstance(caller, pluggy.HookCaller)
        for impl in caller.get_hookimpls()
    ]


def hook_names(pm: pluggy.PluginManager, plugin: Any) -> list[str]:
    """The hooks ``plugin`` implements."""
    return sorted(c.name for c in pm.get_hookcallers(plugin) or [])


def declared_options(pm: pluggy.PluginManager) -> dict[str, Option]:
    """Collect every plugin's ``selfspec_options``; a name declared twice is an error."""
    options: dict[str, Option] = {}
    for impl in pm.hook.selfspec_options.get_hookimpls():

        def register(opt: Option, _owner: str = impl.plugin_name) -> None:
            if not isinstance(opt, Option):
                raise PluginError(_owner, f"registered {opt!r}, not a selfspec.Option")
            if opt.name in options:
                raise PluginError(_owner, f"option {opt.name!r} is declared twice")
            options[opt.name] = opt

        try:
            impl.function(register=register)
        except PluginError:
            raise
        except Exception as exc:
            raise PluginError(impl.plugin_name, f"selfspec_options failed: {exc}") from exc
    return options


def call_hook(pm: pluggy.PluginManager, plugin: str, hook: str, **kwargs: Any) -> Any:
    """Call ``hook`` on ``pm``; any exception but a ``PluginError`` becomes one naming
    ``plugin`` and the hook (the loop's and the composer's one rule for a hook that raises)."""
    try:
        return getattr(pm.hook, hook)(**kwargs)
    except PluginError:
        raise
    except Exception as exc:
        raise PluginError(plugin, f"{hook} raised {type(exc).__name__}: {exc}") from exc
