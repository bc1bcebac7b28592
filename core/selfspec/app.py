"""selfspec.app: the application namespace, for scripts and plugin commands.

The top-level ``selfspec`` namespace is the plugin contract (the engine: hooks, options,
drafts, verification, the runner, artefacts). This one holds what sits above it: loading
models, encoding prompts, the benchmark data splits, and what the command line gives a plugin
command (:class:`CommandContext`). Documented in ``docs/api.md`` ("The app namespace"); a
plugin's decode hooks never need it. Nothing heavy is imported until a name is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# name -> (module, attribute), as docs/api.md documents them
_LAZY: dict[str, tuple[str, str]] = {
    # what a plugin command receives, and the CLI's one-line errors
    "CommandContext": ("cli.context", "CommandContext"),
    "user_errors": ("cli.settings", "user_errors"),
    "Settings": ("cli.settings", "Settings"),
    # models
    "load_model": ("models", "load"),
    "format_prompt": ("models", "format_prompt"),
    # data splits
    "Sample": ("data", "Sample"),
    "DataError": ("data", "DataError"),
    "load_task": ("data", "load_task"),
    "task_names": ("data", "task_names"),
    "corpus_texts": ("data", "build_corpus_texts"),
    "encode_sample": ("data", "encode_sample"),
}

__all__ = [
    "CommandContext",
    "user_errors",
    "Settings",
    "load_model",
    "format_prompt",
    "Sample",
    "DataError",
    "load_task",
    "task_names",
    "corpus_texts",
    "encode_sample",
]  # the names of _LAZY, spelled out for tools (tests/test_api.py checks they agree)

if TYPE_CHECKING:  # pragma: no cover
    from .cli.context import CommandContext
    from .cli.settings import Settings, user_errors
    from .data import DataError, Sample, encode_sample, load_task, task_names
    from .data import build_corpus_texts as corpus_texts
    from .models import format_prompt
    from .models import load as load_model


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(f"selfspec.{module}"), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'selfspec.app' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
