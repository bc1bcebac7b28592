"""Per-model artefacts of plugins: one store, one ``profile`` resolver (the fingerprint that
names them is :mod:`selfspec._engine.runner.identity`).

A plugin that tunes or calibrates something for one model (a skip set, exit heads, measured
costs) keeps it in its :class:`ArtefactStore` (``<selfspec cache dir>/<plugin>/``), named by
the model's ``ModelIdentity`` key, written atomically (an interrupted save never looks
finished). Its ``profile`` option then takes ``auto`` (this model's artefact in the store, else
one shipped with the plugin, else none), ``none``, or a path; :func:`resolve_profile` decides.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from selfspec._engine.tuning.paths import cache_dir


class ArtefactError(ValueError):
    """A profile path that does not exist, or an artefact made for another model."""


class ArtefactStore:
    """Files of one plugin under ``<selfspec cache dir>/<plugin>/`` (created on first save).

    A plugin that tunes or calibrates something for one model keeps it in its store, named by
    the model's identity (:func:`model_identity`), and takes a ``profile`` option
    ``auto|none|PATH`` resolved by :func:`resolve_profile`. :meth:`path` and :meth:`find` (the
    user's file, else the same relative name inside the ``shipped`` package) locate files;
    :meth:`save` and :meth:`save_text` write atomically (an interrupted save leaves no partial
    file). ``root``: another folder than the cache directory's (tests).

    ``shipped``: a package (``__package__`` of the plugin) holding artefacts shipped with the
    plugin under the same relative names (``profiles/<key>.json`` in the store and in the
    package), found by :meth:`find` after the user's own.
    """

    def __init__(
        self, plugin: str, shipped: str | None = None, root: str | os.PathLike[str] | None = None
    ) -> None:
        self.plugin = plugin
        self.shipped = shipped
        self._root = Path(root) if root is not None else None

    @property
    def root(self) -> Path:
        """The plugin's folder (read from the environment when used, not when built)."""
        return self._root if self._root is not None else cache_dir() / self.plugin

    def path(self, *parts: str) -> Path:
        """``root / parts...`` (nothing is created)."""
        return self.root.joinpath(*parts)

    def find(self, name: str) -> Path | None:
        """``name`` (a relative path) in the store, else in the shipped package, else None."""
        own = self.path(name)
        if own.is_file():
            return own
        if self.shipped is not None:
            shipped = resources.files(self.shipped).joinpath(*Path(name).parts)
            if shipped.is_file():
                return Path(str(shipped))
        return None

    @staticmethod
    def save(path: str | os.PathLike[str], write: Callable[[Path], Any]) -> Path:
        """Write ``path`` atomically: ``write(tmp)`` writes a temporary file beside it (same
        suffix, so writers that add one do not), which then replaces ``path``."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.partial{target.suffix}")
        try:
            write(tmp)
            tmp.replace(target)
        finally:
            if tmp.exists():
                tmp.unlink()
        return target

    def save_text(self, path: str | os.PathLike[str], text: str) -> Path:
        """Write ``text`` (UTF-8) to ``path`` atomically."""
        return self.save(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def resolve_profile(spec: str | None, store: ArtefactStore, name: str) -> Path | None:
    """The file the ``profile`` option names: ``auto`` -> ``name`` in ``store`` (the user's, then
    a shipped one) or None; ``none`` -> None; anything else -> that path, which must exist.

    ``name`` is the artefact's file name for this model (usually ``identity.key + suffix``).
    Raises :class:`ArtefactError` for a path that is not a file.
    """
    choice = (spec or "auto").strip()
    if choice.lower() == "none":
        return None
    if choice.lower() == "auto":
        return store.find(name)
    path = Path(choice).expanduser()
    if not path.is_file():
        raise ArtefactError(f"no profile at {path} (profile takes 'auto', 'none' or a file path)")
    return path
