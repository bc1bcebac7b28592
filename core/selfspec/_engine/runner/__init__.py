"""Layer-level execution of Hugging Face causal LMs: adapters, masks, the KV cache."""

from selfspec._engine.runner.adapters import (
    Adapter,
    UnsupportedModelError,
    adapter_for,
    supported_model_types,
)
from selfspec._engine.runner.cache import CacheError, KVCache, LayerView
from selfspec._engine.runner.runner import ForwardOut, Runner

__all__ = [
    "Adapter",
    "CacheError",
    "ForwardOut",
    "KVCache",
    "LayerView",
    "Runner",
    "UnsupportedModelError",
    "adapter_for",
    "supported_model_types",
]
