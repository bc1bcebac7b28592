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

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from selfspec import ArtefactStore, model_identity

PROFILE_VERSION = 1


@dataclass
class ExitHeads:
    """Per-layer affine maps (``{layer: (W [H, H], b [H])}``) and an optional vocabulary subset
    ``vocab`` (``[K]`` int64 token ids, sorted) that every exit scores; ``None`` = all."""

    maps: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    vocab: torch.Tensor | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    #: the host's draft weights whose (compressed) head the exits use when no profile subset is set
    draft: Any = field(default=None, repr=False)
    _sub: torch.Tensor | None = field(default=None, repr=False)  # [K, H] LM-head rows of vocab
    _sub_bias: torch.Tensor | None = field(default=None, repr=False)

    def bind(self, runner: Any) -> ExitHeads:
        """Move to the runner's device/dtype and cut the LM-head rows of the vocabulary subset."""
        dev, dt = runner.device, runner.dtype
        self.maps = {
            int(k): (w.to(dev, dt).contiguous(), b.to(dev, dt)) for k, (w, b) in self.maps.items()
        }
        if self.vocab is not None:
            self.vocab = self.vocab.to(dev, torch.long)
            head = runner.lm_head
            # an LM head offloaded to disk: read once, rows kept in memory
            with runner.loaded(head):
                # [K, H]
                self._sub = head.weight.detach().index_select(0, self.vocab).to(dt).contiguous()
                bias = getattr(head, "bias", None)
                self._sub_bias = (
                    None if bias is None else bias.detach().index_select(0, self.vocab).to(dt)
                )
        return self

    @torch.inference_mode()
    def predict(
        self, runner: Any, layer: int, h: torch.Tensor, pick: Any = None, at: Any = None
    ) -> torch.Tensor:
        """Token of the exit at ``layer`` for hidden states ``h`` ``[q, H]`` -> ``[q]`` int64: the
        argmax, or ``pick(logits, at, vocab)`` (``state.pick`` and the positions the rows predict:
        the target's sampling noise, so the guesses stay coupled with it)."""
        m = self.maps.get(layer)
        if m is not None:
            h = torch.addmm(m[1], h, m[0])  # h @ W + b: [q, H]
        if self._sub is None:
            logits = runner.head(h) if self.draft is None else self.draft.head(runner, h)
            return logits.to(torch.float32).argmax(-1) if pick is None else pick(logits, at)
        # soft-capping is monotonic: the argmax of the capped logits is the argmax of these
        x = runner.norm(h)
        logits = (
            x @ self._sub.T
            if self._sub_bias is None
            else torch.addmm(self._sub_bias, x, self._sub.T)
        )
        if pick is not None:  # sampling warps the capped logits: cap them
            return pick(runner.softcap(logits), at, self.vocab)
        return self.vocab.index_select(0, logits.to(torch.float32).argmax(-1))  # type: ignore[union-attr]

    @torch.inference_mode()
    def logits(self, runner: Any, layer: int, h: torch.Tensor) -> torch.Tensor:
        """Logits of the exit at ``layer`` for ``h`` ``[q, H]``: ``[q, V]``, or ``[q, K]`` over
        :attr:`vocab` when the heads score a subset (its argmax is :meth:`predict`'s token)."""
        m = self.maps.get(layer)
        if m is not None:
            h = torch.addmm(m[1], h, m[0])  # h @ W + b: [q, H]
        if self._sub is None:
            return runner.head(h) if self.draft is None else self.draft.head(runner, h)
        x = runner.norm(h)
        return runner.softcap(
            x @ self._sub.T
            if self._sub_bias is None
            else torch.addmm(self._sub_bias, x, self._sub.T)
        )


# ------------------------------------------------------------------------------ profiles
STORE = ArtefactStore("hispec")


def default_profile_path(runner: Any) -> Path:
    """``<selfspec cache>/hispec/<model key>.pt`` (the key of :func:`selfspec.model_identity`)."""
    return STORE.path(profile_name(runner))


def profile_name(runner: Any) -> str:
    """The file name of this model's profile in the store."""
    return f"{model_identity(runner).key}.pt"


def save_profile(heads: ExitHeads, path: Path | str, runner: Any) -> Path:
    """Write ``heads`` for the runner's model atomically (an interrupted save never looks
    finished)."""
    blob = {
        "version": PROFILE_VERSION,
        "model": model_identity(runner).key,
        "maps": {
            int(k): (w.detach().cpu().float(), b.detach().cpu().float())
            for k, (w, b) in heads.maps.items()
        },
        "vocab": None if heads.vocab is None else heads.vocab.detach().cpu(),
        "meta": dict(heads.meta),
    }
    return ArtefactStore.save(path, lambda tmp: torch.save(blob, tmp))


def load_profile(path: Path | str, runner: Any = None) -> ExitHeads:
    """Read a profile; with ``runner``, refuse one made for another model (``ValueError``)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no HiSpec profile at {path}")
    blob = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(blob, dict) or blob.get("version") != PROFILE_VERSION:
        raise ValueError(f"{path} is not a HiSpec profile (version {PROFILE_VERSION})")
    key = model_identity(runner).key if runner is not None else None
    if key is not None and blob["model"] != key:
        raise ValueError(f"{path} was calibrated for {blob['model']}, not for this model ({key})")
    maps = {int(k): (w, b) for k, (w, b) in blob["maps"].items()}
    hidden = int(runner.hidden_size) if runner is not None else None
    for k, (w, b) in maps.items():
        if hidden is not None and (w.shape != (hidden, hidden) or b.shape != (hidden,)):
            raise ValueError(
                f"{path}: the map of layer {k} has shape {tuple(w.shape)}, "
                f"expected ({hidden}, {hidden})"
            )
    return ExitHeads(maps=maps, vocab=blob.get("vocab"), meta=dict(blob.get("meta") or {}))


# ------------------------------------------------------------------------------ exit layers
def exit_layers(options: dict[str, Any], n: int) -> tuple[int, int]:
    """``(L_d, L_i)`` from the options for an ``n``-layer model (defaults about L/8 and L/4);
    ``ValueError`` for a combination HiSpec cannot run (single-exit ignores ``verify_layer``)."""
    ld = options.get("draft_layer") or max(1, round(n / 8))
    if options.get("single_exit"):
        if not 1 <= ld < n:
            raise ValueError(
                f"draft_layer must lie in [1, {n - 1}] for a {n}-layer model, got {ld}"
            )
        return ld, ld
    if n < 3:
        raise ValueError(f"HiSpec needs at least 3 layers (L_d < L_i < L); this model has {n}")
    li = options.get("verify_layer") or max(ld + 1, round(n / 4))
    if not 1 <= ld < li < n:
        raise ValueError(
            f"need 1 <= draft_layer < verify_layer < {n} (the model's layers), "
            f"got draft_layer={ld}, verify_layer={li}"
        )
    return ld, li
