"""selfspec: a plugin host for lossless self-speculative decoding of Hugging Face causal LMs.

Nothing heavy is imported here until used: ``import selfspec`` is cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from .plugins import hookimpl  # noqa: E402  (pluggy only)

__all__ = ["Decoder", "Draft", "Option", "Verdict", "DecodeState", "Result", "Stats", "hookimpl", "__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from .loop import Decoder
    from .options import Option
    from .types import DecodeState, Draft, Result, Stats, Verdict

_LAZY = {
    "Decoder": "loop",
    "Option": "options",
    "Draft": "types",
    "Verdict": "types",
    "DecodeState": "types",
    "Result": "types",
    "Stats": "types",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'selfspec' has no attribute {name!r}")
