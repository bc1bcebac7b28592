"""Per-model artefacts of plugins: one fingerprint, one store, one ``profile`` resolver.

A plugin that tunes or calibrates something for one model (a skip set, exit heads, measured
costs) keeps it in its :class:`ArtefactStore` (``<selfspec cache dir>/<plugin>/``), named by
the model's :class:`ModelIdentity` key, written atomically (an interrupted save never looks
finished). Its ``profile`` option then takes ``auto`` (this model's artefact in the store, else
one shipped with the plugin, else none), ``none``, or a path; :func:`resolve_profile` decides.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from selfspec._engine.paths import cache_dir
from selfspec._engine.runner.placement import loaded


class ArtefactError(ValueError):
    """A profile path that does not exist, or an artefact made for another model."""


@dataclass(frozen=True)
class ModelIdentity:
    """Architecture, sizes and a fingerprint of a model's weights (see :func:`model_identity`):
    ``model_type``, ``n_layers``, ``hidden_size``, ``vocab_size``, ``fingerprint``; :attr:`key`
    names its files, :meth:`as_dict` is the JSON form."""

    model_type: str
    n_layers: int
    hidden_size: int
    vocab_size: int
    fingerprint: str

    @property
    def key(self) -> str:
        """File-name key, e.g. ``llama-30x576-ea5b98e7aadf037c``."""
        return f"{self.model_type}-{self.n_layers}x{self.hidden_size}-{self.fingerprint}"

    def as_dict(self) -> dict[str, Any]:
        """The JSON form of the identity."""
        return asdict(self)


def model_identity(runner: Any) -> ModelIdentity:
    """The identity of the runner's model.

    The fingerprint (16 hex digits of a SHA-256) hashes the shapes and a strided sample of at
    most 2,048 values of the embedding and of each parameter of the last decoder layer, cast
    to bfloat16 first, so float32 and bfloat16 loads of one checkpoint agree while different
    checkpoints of one architecture do not. Costs a few milliseconds; call it at setup.
    """
    cfg = runner.config
    h = hashlib.sha256()
    for module, recurse in ((runner.embedding, False), (runner.layers[-1], True)):
        with loaded(module):  # an offloaded module's weights, read for this sample only
            for t in _weights(module, recurse):
                flat = t.detach().reshape(-1)
                step = max(1, flat.numel() // 2048)
                sample = flat[::step][:2048].to("cpu", torch.bfloat16).to(torch.float32)
                h.update(str(tuple(t.shape)).encode())
                h.update(sample.numpy().tobytes())
    return ModelIdentity(
        model_type=str(getattr(cfg, "model_type", type(runner.model).__name__)),
        n_layers=int(runner.n_layers),
        hidden_size=int(runner.hidden_size),
        vocab_size=int(runner.vocab_size),
        fingerprint=h.hexdigest()[:16],
    )


def _weights(module: torch.nn.Module, recurse: bool) -> list[torch.Tensor]:
    """``module``'s parameters in registration order, a product module's weight read through
    its ``.weight`` where a layout holds it in another form (a model that adopted packed
    weights keeps only their packed buffer), so the identity does not depend on the layout."""
    if not recurse:
        return list(module.parameters(recurse=False))
    out: list[torch.Tensor] = []
    for sub in module.modules():
        own = dict(sub.named_parameters(recurse=False))
        if isinstance(sub, torch.nn.Linear) and "weight" not in own:
            out.append(sub.weight)
            out.extend(t for t in (getattr(sub, "bias", None),) if t is not None)
        else:
            out.extend(own.values())
    return out


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

    def __init__(self, plugin: str, shipped: str | None = None, root: str | os.PathLike[str] | None = None) -> None:
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
