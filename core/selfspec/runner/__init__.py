"""Layer-level execution of Hugging Face causal LMs: adapters, masks, the KV cache."""

from .adapters import Adapter, UnsupportedModelError, adapter_for, supported_model_types
from .cache import CacheError, KVCache, LayerView
from .runner import ForwardOut, Runner

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
