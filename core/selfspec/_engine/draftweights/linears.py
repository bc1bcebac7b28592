"""Compressed linear modules of the draft weights, one class per backend.

Every module takes and returns the caller's dtype (it computes in its own), so a compressed
layer can attend to the model's own KV cache without changing its dtype. Each is built from
a ``[out, in]`` weight a few thousand rows at a time, so building one never needs a float32
temporary bigger than a slice of that weight (see :data:`CHUNK_ROWS`).

* :class:`Int8WeightOnlyLinear` (``int8wo``): int8 weights, one float scale per output
  channel, float activations (``aten._weight_int8pack_mm``, gpt-fast's CPU path). CPU.
* :class:`DynamicInt8Linear` (``int8``): PyTorch's dynamic quantization (int8 weights,
  activations quantized per call, the x86/fbgemm int8 GEMM, VNNI where the CPU has it). CPU.
* :class:`NativeInt8Linear` (``int8native``): int8 weights, one float scale per output channel,
  float activations, in the native kernel compiled for this CPU (``selfspec._engine.runner.
  native``). CPU, where that kernel builds.
* :class:`NativeVnniLinear` (``int8vnni``): the same int8 weights and scales, each row of
  activations rounded to integers of a scale of its own (16-bit for products of up to 2 rows,
  8-bit beyond) and multiplied by integer dot products (AVX-512 VNNI), in the native kernel. CPU,
  where that kernel builds for a target with VNNI.
* :class:`NativeInt4Linear` (``int4native``): 4-bit weights, a float scale and offset per output
  channel and group of 128 inputs, float activations, in the native kernel. CPU, where that
  kernel builds.
* :class:`NativeInt4VnniLinear` (``int4vnni``): the ``int4native`` weights, activations rounded
  as ``int8vnni`` rounds them and multiplied by integer dot products (AVX-512 VNNI), in the
  native kernel. CPU, where that kernel builds for a target with VNNI.
* :class:`NativeInt4Avx2Linear` (``int4avx2``): the ``int4native`` weights, each row of
  activations rounded to integers of a scale of its own (15-bit for products of up to 2 rows,
  8-bit beyond) and multiplied by 8-bit integer products (AVX2 ``vpmaddubsw``), in the native
  kernel. CPU, where that kernel builds for a target with AVX2.
* :class:`Bf16Linear` (``bf16``): bfloat16 weights, prepacked for oneDNN where it has bf16
  kernels (AVX-512 BF16 / AMX), else a plain bf16 product. CPU or GPU.
* :class:`BnbInt8Linear` (``bnb``): bitsandbytes LLM.int8 (``Linear8bitLt``, threshold 6.0). CUDA.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from selfspec._engine.draftweights.quantize import (
    CHUNK_ROWS,
    INT4_GROUP,
    quantize_groups,
    quantize_rows,
)


class CompressedLinear(nn.Module):
    """Base of the compressed linears: ``in_features``, ``out_features`` and :meth:`nbytes`."""

    in_features: int
    out_features: int

    def nbytes(self) -> int:
        """Bytes this module holds that the model does not (weights, scales, biases)."""
        return sum(t.numel() * t.element_size() for t in self.buffers())


class Int8WeightOnlyLinear(CompressedLinear):
    """int8 weight ``[out, in]`` + float32 scale per output channel; float activations."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        q, scale = quantize_rows(weight)
        self.register_buffer("qweight", q)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.out_features, self.in_features = weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).float()  # x2: [n, in]
        y = torch.ops.aten._weight_int8pack_mm(x2, self.qweight, self.scale)  # y: [n, out]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


class DynamicInt8Linear(CompressedLinear):
    """Dynamic quantization: int8 weights (a scale per output channel), activations quantized
    per call; PyTorch's quantized engine (x86: fbgemm/oneDNN int8 GEMM), the kernels of
    ``torch.ao.nn.quantized.dynamic.Linear`` called directly (no float module, no extra copy)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        q, scale = quantize_rows(weight)
        out_f, in_f = weight.shape
        b = None if bias is None else bias.detach().float().clone()
        with warnings.catch_warnings():  # quantized tensors are deprecated, the kernels still work
            warnings.simplefilter("ignore")
            qw = torch._make_per_channel_quantized_tensor(q, scale.double(), torch.zeros(out_f, dtype=torch.long), 0)
            self._packed = torch.ops.quantized.linear_prepack(qw, b)  # the engine's own int8 copy
        del q, qw
        self.in_features, self.out_features = in_f, out_f
        self._bytes = out_f * in_f + out_f * 8 + (0 if bias is None else out_f * 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x if x.dtype == torch.float32 else x.float()
        # reduce_range: 7-bit activations, as the quantized module does on x86 (no int16 saturation)
        y = torch.ops.quantized.linear_dynamic(x2, self._packed, reduce_range=True)
        return y if x.dtype == torch.float32 else y.to(x.dtype)

    def nbytes(self) -> int:
        return self._bytes  # the packed weight is opaque to torch: its int8 size and scales


class _NativeCompressed(CompressedLinear):
    """Base of the linears the native kernel computes: inputs of any dtype and leading shape,
    computed as float32 rows by :meth:`_product` (``[n, in]`` -> ``[n, out]``)."""

    def _product(self, x2: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._product(x.reshape(-1, self.in_features).float().contiguous())
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


class NativeInt8Linear(_NativeCompressed):
    """int8 weights (a float32 scale per output row, as ``int8wo``) in the native kernel's
    panels (:mod:`selfspec._engine.runner.native`), float32 activations. CPU, where the native
    kernel builds."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        from selfspec._engine.runner import native  # noqa: PLC0415 (builds the kernel)

        super().__init__()
        q, scale = quantize_rows(weight)
        width = native.tile_q()
        self.register_buffer("qpanels", native.to_panels(q, width, torch.int8))
        del q
        self.register_buffer("scale", _padded(scale, self.qpanels.shape[0] * width))
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.out_features, self.in_features = weight.shape

    def _product(self, x2: torch.Tensor) -> torch.Tensor:
        from selfspec._engine.runner.native import native_linear_int8  # noqa: PLC0415

        return native_linear_int8(x2, self.qpanels, self.scale, self.bias, self.out_features)

    def nbytes(self) -> int:
        n = self.out_features * self.in_features + self.out_features * 4  # the padding rows excluded
        return n + (0 if self.bias is None else self.out_features * 4)


class NativeVnniLinear(_NativeCompressed):
    """int8 weights (a float32 scale per output row, as ``int8wo``) in the native kernel's VNNI
    panels, products of integer activations (:func:`selfspec._engine.runner.native.
    native_linear_i8vnni`). CPU, where the native kernel builds with AVX-512 VNNI."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        from selfspec._engine.runner import native  # noqa: PLC0415 (builds the kernel)

        super().__init__()
        q, scale = quantize_rows(weight)
        panels, colsum = native.to_vnni_panels(q)
        del q
        self.register_buffer("qpanels", panels)
        self.register_buffer("colsum", colsum)
        self.register_buffer("scale", _padded(scale, colsum.numel()))
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.out_features, self.in_features = weight.shape

    def _product(self, x2: torch.Tensor) -> torch.Tensor:
        from selfspec._engine.runner.native import native_linear_i8vnni  # noqa: PLC0415

        return native_linear_i8vnni(x2, self.qpanels, self.colsum, self.scale, self.bias, self.out_features)

    def nbytes(self) -> int:
        n = self.out_features * self.in_features + self.out_features * 8  # q, scale and row sum per row
        return n + (0 if self.bias is None else self.out_features * 4)


class NativeInt4Linear(_NativeCompressed):
    """4-bit weights in groups of :data:`INT4_GROUP` inputs, each group with a float32 scale and
    offset per output row (:func:`quantize_groups`), in the native kernel's 4-bit panels, float32
    activations. Half the bytes of the int8 copies and a larger error. CPU, where the native
    kernel builds."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        from selfspec._engine.runner import native  # noqa: PLC0415 (builds the kernel)

        super().__init__()
        codes, scale, offset = quantize_groups(weight, INT4_GROUP)
        width = native.tile_q()
        self.register_buffer("panels", native.to_int4_panels(codes, width))
        del codes
        self.register_buffer("gscale", native.to_group_panels(scale, width))
        self.register_buffer("gzero", native.to_group_panels(offset, width))
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.out_features, self.in_features = weight.shape

    def _product(self, x2: torch.Tensor) -> torch.Tensor:
        from selfspec._engine.runner.native import native_linear_int4  # noqa: PLC0415

        return native_linear_int4(x2, self.panels, self.gscale, self.gzero, INT4_GROUP, self.bias, self.out_features)

    def nbytes(self) -> int:
        groups = -(-self.in_features // INT4_GROUP)
        n = self.out_features * (-(-self.in_features // 2) + groups * 8)  # the padding rows excluded
        return n + (0 if self.bias is None else self.out_features * 4)


class NativeInt4VnniLinear(_NativeCompressed):
    """The ``int4native`` weights (:func:`quantize_groups`, groups of :data:`INT4_GROUP` inputs) in
    the native kernel's 4-bit VNNI panels, products of integer activations
    (:func:`selfspec._engine.runner.native.native_linear_i4vnni`). CPU, where the native kernel
    builds with AVX-512 VNNI."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        from selfspec._engine.runner import native  # noqa: PLC0415 (builds the kernel)

        super().__init__()
        codes, scale, offset = quantize_groups(weight, INT4_GROUP)
        panels, gsum = native.to_int4_vnni_panels(codes, INT4_GROUP)
        del codes
        self.register_buffer("panels", panels)
        self.register_buffer("gsum", gsum)
        self.register_buffer("gscale", native.to_group_panels(scale, native.VNNI_TILE))
        self.register_buffer("gzero", native.to_group_panels(offset, native.VNNI_TILE))
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.out_features, self.in_features = weight.shape

    def _product(self, x2: torch.Tensor) -> torch.Tensor:
        from selfspec._engine.runner.native import native_linear_i4vnni  # noqa: PLC0415

        return native_linear_i4vnni(x2, self.panels, self.gsum, self.gscale, self.gzero, INT4_GROUP, self.bias,
                                    self.out_features)

    def nbytes(self) -> int:
        groups = -(-self.in_features // INT4_GROUP)
        n = self.out_features * (-(-self.in_features // 2) + groups * 12)  # codes; scale, offset, sum per group
        return n + (0 if self.bias is None else self.out_features * 4)


class NativeInt4Avx2Linear(_NativeCompressed):
    """The ``int4native`` weights (:func:`quantize_groups`, groups of :data:`INT4_GROUP` inputs) in
    the native kernel's AVX2 4-bit panels, products of integer activations, 15-bit for up to 2
    rows and 8-bit beyond (:func:`selfspec._engine.runner.native.native_linear_i4avx2`). CPU,
    where the native kernel builds with AVX2."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        from selfspec._engine.runner import native, native_copies  # noqa: PLC0415 (builds the kernel)

        super().__init__()
        built = native_copies.quantize_int4_quad(weight, INT4_GROUP, native.INT4_AVX2_TILE)  # one pass where it runs
        if built is None:
            codes, scale, offset = quantize_groups(weight, INT4_GROUP)
            built = (native.to_int4_quad_panels(codes, native.INT4_AVX2_TILE), scale, offset)
            del codes
        panels, scale, offset = built
        self.register_buffer("panels", panels)
        self.register_buffer("gscale", native.to_group_panels(scale, native.INT4_AVX2_TILE))
        self.register_buffer("gzero", native.to_group_panels(offset, native.INT4_AVX2_TILE))
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.out_features, self.in_features = weight.shape

    def _product(self, x2: torch.Tensor) -> torch.Tensor:
        from selfspec._engine.runner.native import native_linear_i4avx2  # noqa: PLC0415

        return native_linear_i4avx2(x2, self.panels, self.gscale, self.gzero, INT4_GROUP, self.bias,
                                    self.out_features)

    def nbytes(self) -> int:
        groups = -(-self.in_features // INT4_GROUP)
        n = self.out_features * (-(-self.in_features // 2) + groups * 8)  # codes; scale and offset per group
        return n + (0 if self.bias is None else self.out_features * 4)


def _onednn_bf16(device: torch.device) -> bool:
    if device.type != "cpu":
        return False
    from selfspec._engine.machine import cpu_capability  # noqa: PLC0415

    return cpu_capability().onednn_bf16


class Bf16Linear(CompressedLinear):
    """bfloat16 weights; on a CPU with oneDNN bf16 kernels, prepacked for them once."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        out_f, in_f = weight.shape
        w = torch.empty(out_f, in_f, dtype=torch.bfloat16, device=weight.device)
        for r in range(0, out_f, CHUNK_ROWS):
            w[r : r + CHUNK_ROWS] = weight[r : r + CHUNK_ROWS].detach()
        self.packed = _onednn_bf16(weight.device)
        if self.packed:
            w = torch.ops.mkldnn._reorder_linear_weight(w)
        self.register_buffer("weight", w)
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.bfloat16).clone())
        self.in_features, self.out_features = in_f, out_f

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xb = x.to(torch.bfloat16)
        if self.packed:
            y = torch.ops.mkldnn._linear_pointwise(xb, self.weight, self.bias, "none", [], "")
        else:
            y = nn.functional.linear(xb, self.weight, self.bias)
        return y.to(x.dtype)

    def nbytes(self) -> int:
        n = self.out_features * self.in_features * 2  # a packed weight reports no real size
        return n + (0 if self.bias is None else self.bias.numel() * 2)


def bnb_module():
    """The ``bitsandbytes`` module, or ``None`` when it is missing or cannot load."""
    try:
        import bitsandbytes  # noqa: PLC0415 (optional, CUDA only)
    except Exception:  # ImportError, or a broken CUDA set-up inside the package
        return None
    return bitsandbytes


class BnbInt8Linear(CompressedLinear):  # pragma: no cover - needs CUDA and bitsandbytes
    """bitsandbytes LLM.int8 (``Linear8bitLt``, threshold 6.0) in float16, on CUDA."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        bnb = bnb_module()
        out_f, in_f = weight.shape
        lin = bnb.nn.Linear8bitLt(in_f, out_f, bias=bias is not None, has_fp16_weights=False, threshold=6.0)
        lin.weight = bnb.nn.Int8Params(weight.detach().to("cpu", torch.float16), requires_grad=False,
                                       has_fp16_weights=False)
        if bias is not None:
            lin.bias = nn.Parameter(bias.detach().to("cpu", torch.float16), requires_grad=False)
        self.q = lin.to(weight.device)  # quantizes on the move to CUDA
        self.in_features, self.out_features = in_f, out_f

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(x.to(torch.float16)).to(x.dtype)

    def nbytes(self) -> int:
        w = self.q.weight
        extra = getattr(w, "SCB", None)
        return w.numel() * w.element_size() + (0 if extra is None else extra.numel() * extra.element_size())


def _padded(scale: torch.Tensor, length: int) -> torch.Tensor:
    """Per-row scales as float32 ``[length]``, zero past the real rows (a kernel's padding rows)."""
    out = torch.zeros(length, dtype=torch.float32)
    out[: scale.numel()] = scale
    return out


#: The backends the native kernel computes (they run where it builds; the ``*vnni`` ones where
#: its target has AVX-512 VNNI too, ``int4avx2`` where it has AVX2).
NATIVE_BACKENDS: tuple[str, ...] = ("int8native", "int8vnni", "int4native", "int4vnni", "int4avx2")

#: backend name -> linear class
LINEARS: dict[str, type[CompressedLinear]] = {
    "int8": DynamicInt8Linear,
    "int8wo": Int8WeightOnlyLinear,
    "int8native": NativeInt8Linear,
    "int8vnni": NativeVnniLinear,
    "int4native": NativeInt4Linear,
    "int4vnni": NativeInt4VnniLinear,
    "int4avx2": NativeInt4Avx2Linear,
    "bf16": Bf16Linear,
    "bnb": BnbInt8Linear,
}
