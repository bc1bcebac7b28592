"""The runner room: layer-level execution of Hugging Face causal LMs (adapters, masks, the KV
cache, placement), the weight-format registry with its layouts and library linears, a model's
identity and its cost-per-width curve. It imports tuning below it, never the contract or the
drafting room above."""

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
