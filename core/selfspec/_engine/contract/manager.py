"""The plugin manager factory: built-ins plus one method plugin, or the host's composer over
several (``"lookup+selfsd"``); and :func:`describe`, what ``specdec plugins`` prints.

Apart from :mod:`.plugins` (discovery and loading) so that the composer, which loads its
members with those helpers, sits between the two without an import cycle.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pluggy

from selfspec._engine.contract import hookspecs, plugins
from selfspec._engine.contract.compose import Composer
from selfspec._engine.contract.markers import PROJECT
from selfspec._engine.contract.plugins import (
    BUILTIN_METHOD,
    PluginError,
    _all_impls,
    _Manager,
    available,
    blocked,
    builtin_plugins,
    declared_options,
    hook_names,
    instantiate,
)


def make_manager(
    name: str = BUILTIN_METHOD, plugin_object: Any = None, *, trace: bool | None = None
) -> tuple[pluggy.PluginManager, Any]:
    """A fresh plugin manager with the built-ins and the method plugin ``name``.

    Returns ``(manager, plugin)`` where ``plugin`` is the registered instance (None for
    ``vanilla``). Pass ``plugin_object`` to register an already-imported object (a class,
    module or instance) under ``name`` instead of looking up the entry point. A composed name
    (``"lookup+selfsd"``) registers the host's :class:`~selfspec._engine.contract.compose.Composer`
    over those members; ``plugin_object`` may then be a mapping ``{member: object}``.
    """
    pm = _Manager(PROJECT)
    pm.add_hookspecs(hookspecs)
    for builtin_name, plugin in builtin_plugins():
        pm.register(plugin, name=f"builtin.{builtin_name}")
    members = plugins.member_names(name)
    if members is not None:  # "a+b": the host's composer, holding each member's own manager
        obj = Composer.build(name, members, plugin_object)
    else:
        obj = (
            plugin_object if plugin_object is not None else plugins._load_object(name)
        )  # looked up at call time (tests replace it)
    instance = None
    if obj is not None:
        if name in blocked():
            raise PluginError(name, "is blocked by SELFSPEC_BLOCK_PLUGINS")
        try:
            instance = instantiate(obj)
            pm.register(instance, name=name)
        except Exception as exc:
            raise PluginError(name, f"cannot be registered: {exc}") from exc
        if not any(impl.plugin is instance for impl in _all_impls(pm)):
            raise PluginError(name, "implements no selfspec hook")
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(name, str(exc)) from exc
    if trace if trace is not None else os.environ.get("SELFSPEC_TRACE"):
        pm.trace.root.setwriter(sys.stderr.write)
        pm.enable_tracing()
    return pm, instance


def describe(name: str) -> dict[str, Any]:
    """Name, version, hooks and options of one installed plugin (imports it)."""
    info = available()[name] if name in available() else None
    pm, instance = make_manager(name)
    target = instance if instance is not None else None
    hooks = (
        hook_names(pm, target) if target is not None else ["selfspec_propose (built-in vanilla)"]
    )
    opts = declared_options(pm)
    return {
        **(info.as_dict() if info else {"name": name}),
        "hooks": hooks,
        "options": [o.describe() for o in opts.values()],
    }
