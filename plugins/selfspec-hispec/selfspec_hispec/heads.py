"""Exit heads: how a hidden state at an intermediate layer becomes a token guess.

Without a profile an exit is the model's own final norm + LM head applied mid-model (what an
early-exit-trained checkpoint would use). A calibrated profile adds, per exit layer, an affine
map ``h -> h @ W + b`` applied before the shared norm + head, and may restrict the exit heads
to a vocabulary subset (the tokens the model actually emits on development text), which makes
an exit several times cheaper on a small model whose LM head costs as much as eight layers.

Exit heads only *guess*; the full model decides every committed token, so nothing here can
change the output, only the speed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

PROFILE_VERSION = 1


@dataclass
class ExitHeads:
    """Per-layer affine maps (``{layer: (W [H, H], b [H])}``) and an optional vocabulary subset
    ``vocab`` (``[K]`` int64 token ids, sorted) that every exit scores; ``None`` = all."""

    maps: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    vocab: torch.Tensor | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    _sub: torch.Tensor | None = field(default=None, repr=False)  # [K, H] LM-head rows of vocab
    _sub_bias: torch.Tensor | None = field(default=None, repr=False)

    def bind(self, runner: Any) -> ExitHeads:
        """Move to the runner's device/dtype and cut the LM-head rows of the vocabulary subset."""
        dev, dt = runner.device, runner.dtype
        self.maps = {int(k): (w.to(dev, dt).contiguous(), b.to(dev, dt)) for k, (w, b) in self.maps.items()}
        if self.vocab is not None:
            self.vocab = self.vocab.to(dev, torch.long)
            head = runner.model.get_output_embeddings()
            self._sub = head.weight.detach().index_select(0, self.vocab).to(dt).contiguous()  # [K, H]
            bias = getattr(head, "bias", None)
            self._sub_bias = None if bias is None else bias.detach().index_select(0, self.vocab).to(dt)
        return self

    @torch.inference_mode()
    def predict(self, runner: Any, layer: int, h: torch.Tensor) -> torch.Tensor:
        """Greedy token of the exit at ``layer`` for hidden states ``h`` ``[q, H]`` -> ``[q]`` int64."""
        m = self.maps.get(layer)
        if m is not None:
            h = torch.addmm(m[1], h, m[0])  # h @ W + b: [q, H]
        if self._sub is None:
            return runner.head(h).to(torch.float32).argmax(-1)
        # soft-capping is monotonic: the argmax of the capped logits is the argmax of these
        x = runner.adapter.final_norm(h)
        logits = x @ self._sub.T if self._sub_bias is None else torch.addmm(self._sub_bias, x, self._sub.T)
        return self.vocab.index_select(0, logits.to(torch.float32).argmax(-1))  # type: ignore[union-attr]


# ------------------------------------------------------------------------------ profiles
def model_key(model: torch.nn.Module) -> str:
    """A short identity of a model: architecture, shape and a fingerprint of its weights."""
    cfg = model.config
    emb = model.get_input_embeddings().weight.detach()
    h = hashlib.sha1()
    h.update(emb[:8].to(torch.float32).cpu().numpy().tobytes())
    h.update(emb[-8:].to(torch.float32).cpu().numpy().tobytes())
    norm = getattr(getattr(model, "model", None), "norm", None)
    if norm is not None and getattr(norm, "weight", None) is not None:
        h.update(norm.weight.detach().to(torch.float32).cpu().numpy().tobytes())
    n = int(cfg.num_hidden_layers)
    return f"{cfg.model_type}-{n}x{emb.shape[1]}-v{emb.shape[0]}-{h.hexdigest()[:10]}"


def default_profile_path(model: torch.nn.Module) -> Path:
    """``<selfspec cache>/hispec/<model key>.pt``."""
    from selfspec.models import cache_dir

    return cache_dir() / "hispec" / f"{model_key(model)}.pt"


def save_profile(heads: ExitHeads, path: Path | str, model: torch.nn.Module) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {
        "version": PROFILE_VERSION,
        "model": model_key(model),
        "maps": {int(k): (w.detach().cpu().float(), b.detach().cpu().float()) for k, (w, b) in heads.maps.items()},
        "vocab": None if heads.vocab is None else heads.vocab.detach().cpu(),
        "meta": dict(heads.meta),
    }
    tmp = path.with_suffix(path.suffix + ".partial")
    torch.save(blob, tmp)
    tmp.replace(path)  # an interrupted save never looks finished
    return path


def load_profile(path: Path | str, model: torch.nn.Module | None = None) -> ExitHeads:
    """Read a profile; with ``model``, refuse one made for another model (``ValueError``)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no HiSpec profile at {path}")
    blob = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(blob, dict) or blob.get("version") != PROFILE_VERSION:
        raise ValueError(f"{path} is not a HiSpec profile (version {PROFILE_VERSION})")
    if model is not None and blob["model"] != model_key(model):
        raise ValueError(f"{path} was calibrated for {blob['model']}, not for this model ({model_key(model)})")
    maps = {int(k): (w, b) for k, (w, b) in blob["maps"].items()}
    hidden = int(model.get_input_embeddings().weight.shape[1]) if model is not None else None
    for k, (w, b) in maps.items():
        if hidden is not None and (w.shape != (hidden, hidden) or b.shape != (hidden,)):
            raise ValueError(f"{path}: the map of layer {k} has shape {tuple(w.shape)}, expected ({hidden}, {hidden})")
    return ExitHeads(maps=maps, vocab=blob.get("vocab"), meta=dict(blob.get("meta") or {}))
