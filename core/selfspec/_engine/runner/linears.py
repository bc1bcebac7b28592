"""Compressed linear modules of the draft weights: each a library product (torch's, oneDNN's
through torch, or bitsandbytes'), registered as a draft format in
:mod:`selfspec._engine.runner.host_formats`.

Every module takes and returns the caller's dtype (it computes in its own), so a compressed
layer can attend to the model's own KV cache without changing its dtype. Each is built from
a ``[out, in]`` weight a few thousand rows at a time, so building one never needs a float32
temporary bigger than a slice of that weight (see :data:`CHUNK_ROWS`).

* :class:`Int8Linear` (``int8``): int8 weights (a scale per output channel), activations
  rounded to uint8 per call (one scale per call), oneDNN's int8 product
  (``torch.ops.onednn.qlinear_pointwise``; VNNI/AMX where the CPU has them). CPU.
* :class:`DynamicInt8Linear` (``int8-dynamic``): the same int8 weights, activations quantized
  per call by torch's dynamic quantization (fbgemm's int8 GEMM; torch deprecates the quantized
  tensors it packs through). CPU.
* :class:`IntMmLinear` (``int8-intmm``): the same int8 weights, each row of activations rounded
  to int8 with a scale of its own, ``torch._int_mm``. CPU.
* :class:`Int8WeightOnlyLinear` (``int8-weights``): int8 weights, one float scale per output
  channel, float activations (``aten._weight_int8pack_mm``). CPU.
* :class:`Int4Linear` (``int4``): 4-bit weights in groups of :data:`INT4_GROUP` inputs (a scale
  and offset each), bfloat16 activations (``aten._weight_int4pack_mm_for_cpu``). CPU.
* :class:`Fp16WeightsLinear` (``fp16-weights``): float16 weights, float32 activations
  (``torch.ops.onednn.linear_dynamic_fp16``). CPU.
* :class:`Bf16Linear` (``bf16``): bfloat16 weights, prepacked for oneDNN where it has bf16
  kernels (AVX-512 BF16 / AMX), else a plain bf16 product. CPU or GPU.
* :class:`BnbLinear` (``bnb-int8``, ``bnb-nf4``): bitsandbytes' ``Linear8bitLt`` (LLM.int8) or
  ``Linear4bit`` (NF4). CPU or CUDA, where bitsandbytes is installed.
"""

from __future__ import annotations

import logging
import warnings

import torch
from torch import nn

from selfspec._engine.runner.quantize import (
    CHUNK_ROWS,
    INT4_GROUP,
    quantize_groups,
    quantize_rows,
)
from selfspec._engine.tuning.machine import cpu_capability


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


class Int8Linear(CompressedLinear):
    """int8 weights (a scale per output channel) prepacked for oneDNN; activations rounded to
    uint8 per call with one scale (the block's largest magnitude over 127) and offset 128."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        q, scale = quantize_rows(weight)
        out_f, in_f = weight.shape
        self.register_buffer("packed", torch.ops.onednn.qlinear_prepack(q, None), persistent=False)
        del q
        self.register_buffer("scale", scale)
        self.register_buffer("zeros", torch.zeros(out_f, dtype=torch.long), persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.in_features, self.out_features = in_f, out_f

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).float()  # x2: [n, in]
        xs = float(x2.abs().max()) / 127 or 1.0
        xq = (x2 / xs).round_().add_(128).clamp_(0, 255).to(torch.uint8)
        y = torch.ops.onednn.qlinear_pointwise(
            xq,
            xs,
            128,
            self.packed,
            self.scale,
            self.zeros,
            self.bias,
            1.0,
            0,
            torch.float32,
            "none",
            [],
            "",
        )  # y: [n, out]
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def nbytes(self) -> int:
        n = (
            self.out_features * self.in_features + self.out_features * 4
        )  # the packed weight is opaque
        return n + (0 if self.bias is None else self.out_features * 4)


class DynamicInt8Linear(CompressedLinear):
    """Dynamic quantization: int8 weights (a scale per output channel), activations quantized
    per call; PyTorch's quantized engine (x86: fbgemm's int8 GEMM), the kernels of
    ``torch.ao.nn.quantized.dynamic.Linear`` called directly (no float module, no extra copy).
    torch deprecates the quantized tensors this path packs its weights through; the format
    reports itself unsupported once the ops are gone."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        q, scale = quantize_rows(weight)
        out_f, in_f = weight.shape
        b = None if bias is None else bias.detach().float().clone()
        with warnings.catch_warnings():  # quantized tensors are deprecated, the kernels still work
            warnings.simplefilter("ignore")
            qw = torch._make_per_channel_quantized_tensor(
                q, scale.double(), torch.zeros(out_f, dtype=torch.long), 0
            )
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


class IntMmLinear(CompressedLinear):
    """int8 weights (a scale per output channel); each row of activations rounded to int8 with a
    scale of its own; ``torch._int_mm`` (int32 accumulation), rescaled in float32."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        q, scale = quantize_rows(weight)
        self.register_buffer("qweight_t", q.t())  # [in, out], a view of the [out, in] rows
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.out_features, self.in_features = weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).float()  # x2: [n, in]
        xs = (x2.abs().amax(1, keepdim=True) / 127).clamp_min_(1e-12)  # [n, 1]
        acc = torch._int_mm(
            (x2 / xs).round_().to(torch.int8), self.qweight_t
        )  # acc: [n, out] int32
        y = acc * (xs * self.scale)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


class Int4Linear(CompressedLinear):
    """4-bit weights in groups of :data:`INT4_GROUP` inputs (:func:`quantize_groups`: a scale and
    offset per output row and group) in aten's packed int4 layout; bfloat16 activations
    (``aten._weight_int4pack_mm_for_cpu``). The kernel takes whole groups of inputs and outputs
    in multiples of 16: a layer of other shapes is padded (zero inputs, extra rows dropped)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        out_f, in_f = weight.shape
        self.in_pad = -(-in_f // INT4_GROUP) * INT4_GROUP
        out_pad = -(-out_f // 16) * 16
        codes, scale, offset = quantize_groups(weight, INT4_GROUP)
        full = torch.zeros(out_pad, self.in_pad, dtype=torch.int32)
        full[:out_f, :in_f] = codes  # padded inputs meet zero activations: their codes add nothing
        del codes
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(full, 1))
        del full
        # aten's form: w = (code - 8) * scale + zero, so zero = offset + 8 * scale; [groups, out, 2]
        sz = torch.zeros(out_pad, self.in_pad // INT4_GROUP, 2)
        sz[:out_f, :, 0], sz[:out_f, :, 1] = scale, offset + 8 * scale
        self.register_buffer("scale_zero", sz.transpose(0, 1).contiguous().to(torch.bfloat16))
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.out_features, self.in_features = out_f, in_f

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).to(torch.bfloat16)  # x2: [n, in]
        if self.in_pad != self.in_features:
            x2 = nn.functional.pad(x2, (0, self.in_pad - self.in_features))
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.packed, INT4_GROUP, self.scale_zero)
        y = y[:, : self.out_features].float()  # y: [n, out]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


class Fp16WeightsLinear(CompressedLinear):
    """float16 weights prepacked for oneDNN, float32 activations and accumulation
    (``torch.ops.onednn.linear_dynamic_fp16``)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        out_f, in_f = weight.shape
        w = torch.empty(out_f, in_f, dtype=torch.float32)
        for r in range(0, out_f, CHUNK_ROWS):
            w[r : r + CHUNK_ROWS] = weight[r : r + CHUNK_ROWS].detach()
        self.register_buffer(
            "packed", torch.ops.onednn.linear_prepack_fp16(w, None), persistent=False
        )
        del w
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.in_features, self.out_features = in_f, out_f

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).float()
        y = torch.ops.onednn.linear_dynamic_fp16(x2, self.packed, self.bias)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def nbytes(self) -> int:
        n = self.out_features * self.in_features * 2  # the packed weight is opaque
        return n + (0 if self.bias is None else self.out_features * 4)


def _onednn_bf16(device: torch.device) -> bool:
    return device.type == "cpu" and cpu_capability().onednn_bf16


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
        self.register_buffer(
            "bias", None if bias is None else bias.detach().to(torch.bfloat16).clone()
        )
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
    # bitsandbytes warns on import that it could not fetch an optional 4-bit kernel from a model
    # hub (selfspec never downloads at run time); its own CPU kernels run instead
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    try:
        import bitsandbytes  # here: optional, the [bnb] extra
    except Exception:  # ImportError, or a broken set-up inside the package
        return None
    return bitsandbytes


class BnbLinear(CompressedLinear):
    """bitsandbytes: ``Linear8bitLt`` (``kind="int8"``: LLM.int8, threshold 6.0, float32
    activations on CPU, float16 on CUDA) or ``Linear4bit`` (``kind="nf4"``: NF4 in blocks of 64,
    bfloat16 activations). Quantized on the weight's device."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kind: str) -> None:
        super().__init__()
        bnb = bnb_module()
        out_f, in_f = weight.shape
        device = weight.device
        half = torch.float16 if device.type == "cuda" else torch.float32
        self.compute = half if kind == "int8" else torch.bfloat16
        if kind == "int8":
            lin = bnb.nn.Linear8bitLt(
                in_f,
                out_f,
                bias=bias is not None,
                has_fp16_weights=False,
                threshold=6.0,
                device="meta",
            )
            lin.weight = bnb.nn.Int8Params(
                weight.detach().to("cpu", half).clone(), requires_grad=False, has_fp16_weights=False
            )
        else:
            lin = bnb.nn.Linear4bit(
                in_f,
                out_f,
                bias=bias is not None,
                quant_type="nf4",
                compute_dtype=torch.bfloat16,
                device="meta",
            )
            lin.weight = bnb.nn.Params4bit(
                weight.detach().to("cpu", torch.float32).clone(),
                requires_grad=False,
                quant_type="nf4",
            )
        if bias is not None:
            lin.bias = nn.Parameter(
                bias.detach().to("cpu", self.compute).clone(), requires_grad=False
            )
        self.q = lin.to(device)  # bitsandbytes quantizes on the move
        self.in_features, self.out_features = in_f, out_f

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(x.to(self.compute)).to(x.dtype)

    def nbytes(self) -> int:
        w = self.q.weight
        n = w.numel() * w.element_size()
        for extra in (
            getattr(w, "SCB", None),
            getattr(getattr(w, "quant_state", None), "absmax", None),
        ):
            if isinstance(extra, torch.Tensor):
                n += extra.numel() * extra.element_size()
        b = self.q.bias
        return n + (0 if b is None else b.numel() * b.element_size())
