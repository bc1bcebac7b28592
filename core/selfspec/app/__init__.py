"""selfspec.app: the application namespace, for scripts and plugin commands.

The top-level ``selfspec`` namespace is the plugin contract (the engine: hooks, options,
drafts, verification, the runner, artefacts). This one holds what sits above it: loading
models, encoding prompts, the benchmark data splits, and what the command line gives a plugin
command (:class:`CommandContext`). Documented in ``docs/api.md`` ("The app namespace"); a
plugin's decode hooks never need it. Nothing heavy is imported until a name is used.
"""

from __future__ import annotations

from typing import Any

#: The one list of app names: name -> (module, attribute), as docs/api.md documents them.
#: ``__all__`` is derived from it.
_API: dict[str, tuple[str, str]] = {
    # what a plugin command receives, and the CLI's one-line errors
    "CommandContext": ("app._cli.context", "CommandContext"),
    "user_errors": ("app._cli.settings", "user_errors"),
    "Settings": ("app._cli.settings", "Settings"),
    # models
    "load_model": ("app._models", "load"),
    "custom_generate": ("app._hf", "custom_generate"),
    "format_prompt": ("app._models", "format_prompt"),
    # data splits
    "Sample": ("app._data", "Sample"),
    "DataError": ("app._data", "DataError"),
    "load_task": ("app._data", "load_task"),
    "task_names": ("app._data", "task_names"),
    "corpus_texts": ("app._data", "build_corpus_texts"),
    "encode_sample": ("app._data", "encode_sample"),
}

__all__ = [*_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        import importlib

        module, attr = _API[name]
        value = getattr(importlib.import_module(f"selfspec.{module}"), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'selfspec.app' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
