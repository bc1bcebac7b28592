"""The host's weight formats, registered through ``selfspec_weight_formats`` like any
package's (:mod:`selfspec._engine.runner.formats`): the layouts verification can run (``model``,
``transposed``, ``packed``, ``packed-mkl``) and the draft copies (``none``, ``int8``,
``int8-dynamic``, ``int8-intmm``, ``int8-weights``, ``int4``, ``fp16-weights``, ``bf16``,
``bnb-int8``, ``bnb-nf4``). Every product is a library kernel: torch's (MKL, oneDNN, aten) or
bitsandbytes'. A kernel that a CPU or build lacks is found by running it once on a tiny weight
(:func:`_probe`), so a format is offered only where its kernel runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from selfspec._engine.runner.layout import (
    MklPackedLinear,
    own_builds,
    packing_unsupported,
)
from selfspec._engine.runner.linears import (
    Bf16Linear,
    BnbLinear,
    DynamicInt8Linear,
    Fp16WeightsLinear,
    Int4Linear,
    Int8Linear,
    Int8WeightOnlyLinear,
    IntMmLinear,
    bnb_module,
)
from selfspec._engine.runner.weightformat import WeightFormat
from selfspec._engine.tuning.machine import cpu_capability


def selfspec_weight_formats(register: Callable[[WeightFormat], None]) -> None:
    """The host's formats, layouts first (``auto``'s static choice among them comes first)."""
    build = own_builds()  # the layouts' products, as the runner builds a layout given by name
    register(
        WeightFormat(
            "model",
            "layout",
            "the model's weights as they are: bitwise the model's own forward",
            None,
            memory=0.0,
        )
    )
    register(
        WeightFormat(
            "transposed",
            "layout",
            "a copy of each weight stored [in, out] (a plain BLAS product)",
            build["transposed"],
        )
    )
    register(
        WeightFormat(
            "packed",
            "layout",
            "a copy of each weight prepacked for oneDNN's inner product (any row count)",
            build["packed"],
            unsupported=_packing,
            runs_on="CPU: float32; bf16/fp16 where oneDNN has kernels for them",
        )
    )
    register(
        WeightFormat(
            "packed-mkl",
            "layout",
            "one row on a copy packed for MKL's sgemm, wider blocks on oneDNN's (2.3x the bytes)",
            build["packed-mkl"],
            unsupported=_mkl_packing,
            runs_on="CPU with MKL and oneDNN, float32",
            memory=2.3,
        )
    )
    register(
        WeightFormat(
            "none",
            "draft",
            "no copy: drafts read the model's own weights (the papers' setting)",
            None,
        )
    )
    register(
        WeightFormat(
            "int8",
            "draft",
            "int8 weights x uint8 activations, oneDNN's int8 product (VNNI/AMX where present)",
            Int8Linear,
            unsupported=_cpu_probe("int8", Int8Linear),
            runs_on="CPU",
        )
    )
    register(
        WeightFormat(
            "int8-dynamic",
            "draft",
            "int8 weights x activations quantized per call, torch's dynamic int8 (fbgemm)",
            DynamicInt8Linear,
            unsupported=_cpu_probe("int8-dynamic", DynamicInt8Linear),
            runs_on="CPU",
        )
    )
    register(
        WeightFormat(
            "int8-intmm",
            "draft",
            "int8 weights x int8 activations (a scale per row), torch._int_mm",
            IntMmLinear,
            unsupported=_cpu_probe("int8-intmm", IntMmLinear),
            runs_on="CPU",
        )
    )
    register(
        WeightFormat(
            "int8-weights",
            "draft",
            "int8 weights x float32 activations, aten._weight_int8pack_mm",
            Int8WeightOnlyLinear,
            unsupported=_cpu_probe("int8-weights", Int8WeightOnlyLinear),
            runs_on="CPU",
        )
    )
    register(
        WeightFormat(
            "int4",
            "draft",
            "4-bit weights in groups of 128 x bf16 activations, aten._weight_int4pack_mm_for_cpu",
            Int4Linear,
            unsupported=_cpu_probe("int4", Int4Linear),
            gated=True,
            runs_on="CPU",
        )
    )
    register(
        WeightFormat(
            "fp16-weights",
            "draft",
            "float16 weights x float32 activations, oneDNN (linear_dynamic_fp16)",
            Fp16WeightsLinear,
            unsupported=_fp16_weights,
            runs_on="CPU with AVX-512 FP16 or AVX-NE-CONVERT",
        )
    )
    register(
        WeightFormat(
            "bf16",
            "draft",
            "bfloat16 weights and activations (oneDNN prepacked where it has bf16 kernels)",
            Bf16Linear,
            runs_on="any device",
        )
    )
    register(
        WeightFormat(
            "bnb-int8",
            "draft",
            "bitsandbytes LLM.int8 (Linear8bitLt, threshold 6.0)",
            functools.partial(BnbLinear, kind="int8"),
            unsupported=_bnb,
            runs_on="CPU or CUDA, with bitsandbytes",
        )
    )
    register(
        WeightFormat(
            "bnb-nf4",
            "draft",
            "bitsandbytes NF4 (Linear4bit, blocks of 64) x bf16 activations",
            functools.partial(BnbLinear, kind="nf4"),
            unsupported=_bnb,
            gated=True,
            runs_on="CPU or CUDA, with bitsandbytes",
        )
    )


# ------------------------------------------------------------------------------ helpers
def _packing(device: torch.device, dtype: torch.dtype) -> str | None:
    return packing_unsupported(
        device.type, dtype, cpu_capability() if device.type == "cpu" else None
    )


def _mkl_packing(device: torch.device, dtype: torch.dtype) -> str | None:
    if device.type != "cpu":
        return f"it runs on CPU only, not {device.type}"
    if dtype != torch.float32:
        return f"MKL's packed sgemm is float32 only, not {str(dtype).removeprefix('torch.')}"
    if not torch.backends.mkl.is_available():
        return "this torch build has no MKL"
    if (why := _packing(device, dtype)) is not None:
        return why
    return _probe("packed-mkl", MklPackedLinear)


def _fp16_weights(device: torch.device, dtype: torch.dtype) -> str | None:
    if device.type != "cpu":
        return f"it runs on CPU only, the model is on {device.type}"
    cpu = cpu_capability()
    if not cpu.onednn_fp16:  # oneDNN then falls back to a reference loop, hundreds of times slower
        return (
            "oneDNN's float16 kernels need AVX-512 FP16 or AVX-NE-CONVERT, "
            f"and this CPU runs {cpu.label}"
        )
    return _probe("fp16-weights", Fp16WeightsLinear)


def _bnb(device: torch.device, dtype: torch.dtype) -> str | None:
    if device.type not in ("cpu", "cuda"):
        return f"bitsandbytes runs on CPU or CUDA, not {device.type}"
    if bnb_module() is None:
        return "it needs bitsandbytes (pip install 'selfspec[bnb]')"
    return None


def _cpu_probe(
    name: str, build: Callable[[torch.Tensor, torch.Tensor | None], nn.Module]
) -> Callable[[torch.device, torch.dtype], str | None]:
    def unsupported(device: torch.device, dtype: torch.dtype) -> str | None:
        if device.type != "cpu":
            return f"it runs on CPU only, the model is on {device.type}"
        return _probe(name, build)

    return unsupported


@functools.cache
def _probe(
    name: str, build: Callable[[torch.Tensor, torch.Tensor | None], nn.Module]
) -> str | None:
    """Why ``build``'s product cannot run on this CPU: it is built on a small weight and run on
    one row and on three; any error (a missing kernel, an unsupported instruction set) is the
    reason. ``None``: it runs. Once per process and format."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(16, 256, generator=gen) * 0.02
    try:
        with torch.no_grad():
            module = build(weight, torch.zeros(16))
            for rows in (1, 3):
                y = module(torch.randn(1, rows, 256, generator=gen))
                if tuple(y.shape) != (1, rows, 16) or not bool(torch.isfinite(y).all()):
                    return f"its kernel gave a wrong result here (shape {tuple(y.shape)})"
    except Exception as exc:  # the kernel is missing or fails on this CPU or build
        return (
            "its kernel does not run here "
            f"({type(exc).__name__}: {str(exc).strip().splitlines()[0][:120]})"
        )
    return None
