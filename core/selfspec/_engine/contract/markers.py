"""The two pluggy markers of selfspec, in a leaf module (pluggy's eggsample keeps its markers
beside the specs): ``hookspec`` marks the contracts in :mod:`selfspec._engine.contract.hookspecs`,
``hookimpl`` marks implementations (re-exported as ``selfspec.hookimpl``). Importing this module
imports pluggy and nothing of selfspec, so the built-ins, the loader and plugins can all use it
without an import cycle.
"""

from __future__ import annotations

import pluggy

PROJECT = "selfspec"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

__all__ = ["PROJECT", "hookimpl", "hookspec"]
