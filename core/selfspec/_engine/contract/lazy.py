"""The one lazy loader of the public namespaces (``selfspec``, ``selfspec.provisional``,
``selfspec.app``, ``selfspec.testing``): each declares ``name -> (module, attribute)`` once, and a
name's module is imported on first use, so importing a namespace imports neither torch nor
transformers. Type checkers and IDEs read each namespace's generated ``if TYPE_CHECKING:`` block
instead (``python scripts/typed_face.py`` writes it; ``tests/test_api.py`` keeps it in sync)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_namespace(
    namespace: str,
    api: Mapping[str, tuple[str, str]],
    globals_: dict[str, Any],
    submodules: tuple[str, ...] = (),
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the module ``namespace``: ``api[name] = (module, attr)``
    with ``module`` absolute; ``submodules`` are names imported as ``namespace.name``. A resolved
    name becomes a plain attribute (``globals_``)."""

    def __getattr__(name: str) -> Any:
        if name in api:
            module, attr = api[name]
            value = getattr(importlib.import_module(module), attr)
            globals_[name] = value  # once resolved, a plain attribute
            return value
        if name in submodules:
            return importlib.import_module(f"{namespace}.{name}")
        raise AttributeError(f"module {namespace!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(globals_) | set(api) | set(submodules))

    return __getattr__, __dir__
