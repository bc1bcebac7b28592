"""A model's identity: architecture, sizes and a fingerprint of its weights, the key under which
per-model artefacts are kept (:class:`selfspec._engine.tuning.artefacts.ArtefactStore`)."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any

import torch

from selfspec._engine.runner.placement import loaded


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
