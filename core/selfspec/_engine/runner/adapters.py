"""Adapters: how to drive one architecture's own modules, sub-block by sub-block.

An adapter never copies modeling code: it calls the model's public modules (embedding,
rotary embedding, each decoder layer's norms, attention and MLP, final norm, LM head) in the
order the model's own ``forward`` uses them. Two shapes of decoder layer cover the supported
architectures:

* pre-norm (Llama/SmolLM2, Mistral, Qwen2, Qwen3):
  ``h + attn(input_layernorm(h))`` then ``h + mlp(post_attention_layernorm(h))``;
* sandwich-norm (Gemma 3): each block's output also passes a post-norm, and the rotary
  embedding differs between sliding and full attention layers.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from selfspec._engine.runner.cache import cache_argument
from selfspec._engine.runner.lean import LeanBlocks, lean_blocks

_MISSING = object()


class UnsupportedModelError(ValueError):
    """The runner has no adapter for this model."""


class Adapter:
    """Pre-norm decoder layers (Llama, SmolLM2, Mistral, Qwen2, Qwen3)."""

    model_types: ClassVar[tuple[str, ...]] = ("llama", "mistral", "qwen2", "qwen3")

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.config = model.config
        base = getattr(model, "model", None)
        if base is None or not hasattr(base, "layers"):
            raise UnsupportedModelError(f"{type(model).__name__} has no `.model.layers` to drive")
        self.base = base
        self.layers: nn.ModuleList = base.layers
        self.final_norm: nn.Module = base.norm
        self.lm_head: nn.Module = model.get_output_embeddings()
        self.softcap: float | None = getattr(self.config, "final_logit_softcapping", None)
        self.attn_impl: str = getattr(self.config, "_attn_implementation", None) or "eager"
        if self.attn_impl not in ("sdpa", "eager"):
            raise UnsupportedModelError(
                f"attention implementation {self.attn_impl!r} is not supported by the runner; "
                "load the model with attn_implementation='sdpa' or 'eager'"
            )
        self.windows: list[int | None] = [self._window(layer) for layer in self.layers]

    # ------------------------------------------------------------------ model-wide parts
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids ``[1, q]`` -> hidden ``[1, q, H]`` (any embedding scale is the module's own)."""
        return self.base.embed_tokens(ids)

    def rope_keys(self) -> list[Any]:
        """One key per layer naming which rotary table it uses (one table: ``None``)."""
        return [None] * len(self.layers)

    def rope(
        self, h: torch.Tensor, position_ids: torch.Tensor, key: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) for ``position_ids`` ``[1, q]``, from the model's rotary module."""
        return self.base.rotary_emb(h, position_ids)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head (+ the model's final logit soft-capping)."""
        logits = self.lm_head(self.final_norm(h))
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    # ------------------------------------------------------------------ per-layer blocks
    def attn_block(
        self, layer: nn.Module, h: torch.Tensor, rope: Any, mask: torch.Tensor | None, kv: Any
    ) -> torch.Tensor:
        x, _ = layer.self_attn(
            hidden_states=layer.input_layernorm(h),
            position_embeddings=rope,
            attention_mask=mask,
            **{cache_argument(layer.self_attn.forward): kv},
        )
        return h + x

    def mlp_block(self, layer: nn.Module, h: torch.Tensor) -> torch.Tensor:
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def lean(self, layer: nn.Module) -> LeanBlocks | None:
        """The :class:`~selfspec._engine.runner.lean.LeanBlocks` computing ``layer``'s blocks
        as :meth:`attn_block` and :meth:`mlp_block` do, or ``None`` where they cannot (a layer
        of another structure, or eager attention, whose additive masks and softmax they do not
        reproduce). The runner uses them for draft weights' layers."""
        return lean_blocks(layer, self.config) if self.attn_impl == "sdpa" else None

    def _window(self, layer: nn.Module) -> int | None:
        w = getattr(layer.self_attn, "sliding_window", _MISSING)
        if w is _MISSING:  # Mistral keeps it on the config for every layer
            w = getattr(self.config, "sliding_window", None)
        return int(w) if w else None


class Gemma3Adapter(Adapter):
    """Gemma 3 text models: sandwich norms, per-layer-type rotary tables, soft-capping."""

    model_types = ("gemma3_text",)

    def rope_keys(self) -> list[Any]:
        return list(self.config.layer_types)

    def rope(self, h, position_ids, key):
        return self.base.rotary_emb(h, position_ids, key)

    def attn_block(self, layer, h, rope, mask, kv):
        x, _ = layer.self_attn(
            hidden_states=layer.input_layernorm(h),
            position_embeddings=rope,
            attention_mask=mask,
            **{cache_argument(layer.self_attn.forward): kv},
        )
        return h + layer.post_attention_layernorm(x)

    def mlp_block(self, layer, h):
        return h + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(h)))

    def lean(self, layer):
        return None  # sandwich norms: the adapter's own blocks


ADAPTERS: tuple[type[Adapter], ...] = (Adapter, Gemma3Adapter)


def supported_model_types() -> list[str]:
    return sorted(t for a in ADAPTERS for t in a.model_types)


def adapter_for(model: nn.Module) -> Adapter:
    """The adapter for ``model``, or :class:`UnsupportedModelError` naming what is supported."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    for cls in ADAPTERS:
        if model_type in cls.model_types:
            return cls(model)
    raise UnsupportedModelError(
        f"model type {model_type!r} ({type(model).__name__}) is not supported "
        "by the selfspec runner; "
        f"supported: {', '.join(supported_model_types())}"
    )
