"""CLaSp (in-context layer skipping) as a selfspec plugin.

The model drafts for itself with a set S of M decoder layers skipped; after a verification
the hidden states of the last accepted token at every layer feed a dynamic program that
chooses the next S (:mod:`.search`); the program runs every ``LOI`` steps. See README.md.
"""

from __future__ import annotations

from .plugin import CLaSp

__all__ = ["CLaSp"]
