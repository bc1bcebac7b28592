"""What every part of model loading shares: the dtype table, the error type, the loaded
model record, device/dtype parsing and the cache directory."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from selfspec._engine.tuning.paths import CACHE_ENV, cache_dir  # noqa: F401  (re-exported: selfspec.app._models.cache_dir)

DEFAULT_MODEL = "smollm2-135m-instruct"


DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float64": torch.float64,
    "fp64": torch.float64,
    "double": torch.float64,
}


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says why and what to do."""


@dataclass
class Loaded:
    """A loaded model with its tokenizer.

    ``name``: what the user asked for (an alias such as ``smollm2-135m-instruct``, or the path).
    ``source``: where the weights came from (the GGUF file, the directory or the hub id).
    ``chat``: whether prompts go through the tokenizer's chat template.
    """

    model: torch.nn.Module
    tokenizer: Any
    name: str
    source: str
    chat: bool
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)
    #: the placement asked for (:class:`selfspec.app._models.placement.PlacementRequest`), or None
    request: Any = None

    @property
    def device(self) -> torch.device:
        """Where the inputs go: the model's device, or accelerate's main device."""
        from selfspec._engine.runner.placement import model_device

        return model_device(self.model)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def placement(self) -> dict[str, Any] | None:
        """Where accelerate put the layers (``{"devices": ..., "layers": "0-13 cpu, 14-27
        disk", "other": ..., "offloaded_layers": n}``), or ``None`` for a model on one device."""
        from selfspec._engine.runner.placement import describe

        return describe(self.model)


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"bf16"`` -> ``torch.bfloat16`` and so on; :class:`ModelLoadError` for anything else."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ModelLoadError(f"dtype {dtype} is not supported (use one of {', '.join(DTYPES)})")
        return dtype
    key = str(dtype).strip().lower().removeprefix("torch.")
    if key not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return DTYPES[key]


def parse_device(device: str | torch.device) -> torch.device:
    """Validate ``cpu`` / ``cuda`` / ``cuda:N`` (and other torch devices that exist here)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ModelLoadError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(
                f"device {device!r} asked for, but CUDA is not available here; use --device cpu"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ModelLoadError(
                f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) here"
            )
    elif dev.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise ModelLoadError("device 'mps' is not available here; use --device cpu")
    elif dev.type != "cpu":
        raise ModelLoadError(f"device {device!r} is not supported; use cpu, cuda or cuda:N")
    return dev


def _say(message: str) -> None:
    print(f"selfspec: {message}", file=sys.stderr, flush=True)


def _check_runner(model: torch.nn.Module, spec: str) -> None:
    from selfspec._engine.runner import UnsupportedModelError, adapter_for

    try:
        adapter_for(model)
    except UnsupportedModelError as exc:
        raise ModelLoadError(f"model {spec!r}: {exc}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
