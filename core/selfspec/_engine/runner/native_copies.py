"""Weights in the native kernel's layouts (:mod:`.native`): :class:`NativeLinear`, the
``"native"`` layout's linear on float32 panels, and the one-pass helpers that build copies
(float32 panels, a weight rebuilt from them, 4-bit groups, and 4-bit groups straight into their
AVX2 panels), each bitwise
what the torch definitions in :mod:`.panels` and :mod:`selfspec._engine.draftweights.quantize`
write, and falling back to them where the kernel cannot take the tensors."""

from __future__ import annotations

import torch
from torch import nn

from .native import _library, native_linear, native_unsupported, tile
from .panels import from_panels_into, to_panels


class NativeLinear(nn.Linear):
    """``nn.Linear`` computed by the native kernel on its own panel copy of the weight. Inputs
    ``[..., in]`` -> ``[..., out]``.

    Like :class:`~.layout.PackedLinear` it holds the panels only (a non-persistent buffer) and
    ``.weight`` rebuilds the ``[out, in]`` weight on demand (exactly; a temporary for code
    that reads a weight once). An input that is not float32 on CPU, or that needs a gradient,
    runs ``F.linear`` on that rebuilt weight instead: correct, not fast."""

    def __init__(self, linear: nn.Linear) -> None:
        nn.Module.__init__(self)  # not nn.Linear's: it would allocate a weight
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("panels", float_panels(linear.weight, tile()), persistent=False)
        self.bias = linear.bias

    @property
    def weight(self) -> torch.Tensor:  # type: ignore[override]
        """The ``[out, in]`` weight, rebuilt from the panels (a new tensor on every access)."""
        return self.weight_rows(self.out_features)

    def weight_spec(self) -> tuple[torch.Size, torch.dtype, torch.device]:
        """The weight's shape, dtype and device, without rebuilding it."""
        return torch.Size((self.out_features, self.in_features)), self.panels.dtype, self.panels.device

    def weight_rows(self, rows: int) -> torch.Tensor:
        """The weight's first ``rows`` rows, rebuilt from the panels that hold them only."""
        return self.weight_into(torch.empty(rows, self.in_features, dtype=self.panels.dtype))

    def weight_into(self, out: torch.Tensor) -> torch.Tensor:
        """The weight written into ``out`` (a contiguous ``[out, in]`` tensor); returns ``out``."""
        return float_from_panels_into(self.panels, out)

    def nbytes(self) -> int:
        """Bytes of weights a product reads (the padding rows excluded)."""
        return self.in_features * self.out_features * 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu" or (x.requires_grad and torch.is_grad_enabled()):
            bias = None if self.bias is None else self.bias.to(x.dtype)
            return nn.functional.linear(x, self.weight.to(x.dtype), bias)
        bias = self.bias
        if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
            bias = bias.float().contiguous()
        y = native_linear(x.reshape(-1, self.in_features).contiguous(), self.panels, bias, self.out_features)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, native panels"


# ------------------------------------------------------------------------------ building copies
def _builds_here(*tensors: torch.Tensor) -> bool:
    """Whether the kernel's building helpers take these tensors: float32, contiguous, on CPU,
    and the kernel runs here."""
    return (all(t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() for t in tensors)
            and native_unsupported() is None)


def float_panels(weight: torch.Tensor, width: int) -> torch.Tensor:
    """:func:`~.panels.to_panels` of a float32 ``weight`` (bitwise the same panels), by the
    kernel's one-pass rearrangement on every thread where it runs."""
    w = weight.detach()
    if not _builds_here(w):
        return to_panels(w, width)
    out_f, in_f = w.shape
    panels = torch.empty(-(-out_f // width), in_f, width, dtype=torch.float32)
    _library().selfspec_native_to_panels(w.data_ptr(), panels.data_ptr(), out_f, in_f, width,
                                         torch.get_num_threads())
    return panels


def float_from_panels_into(panels: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """:func:`~.panels.from_panels_into` (bitwise the same rows), by the kernel where it runs."""
    if not _builds_here(panels, out):
        return from_panels_into(panels, out)
    _library().selfspec_native_from_panels(panels.data_ptr(), out.data_ptr(), out.shape[0], panels.shape[1],
                                           panels.shape[2], torch.get_num_threads())
    return out


def quantize_groups(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The 4-bit groups of :func:`selfspec._engine.draftweights.quantize.quantize_groups` (bitwise
    the same codes, scales and offsets) in one pass on every thread, or ``None`` where the
    kernel cannot take ``weight`` (the caller then quantizes with torch)."""
    w = weight.detach()
    if not _builds_here(w):
        return None
    out_f, in_f = w.shape
    groups = -(-in_f // group)
    codes = torch.empty(out_f, in_f, dtype=torch.uint8)
    scale = torch.empty(out_f, groups, dtype=torch.float32)
    offset = torch.empty(out_f, groups, dtype=torch.float32)
    _library().selfspec_native_quantize_groups(w.data_ptr(), codes.data_ptr(), scale.data_ptr(), offset.data_ptr(),
                                               out_f, in_f, group, torch.get_num_threads())
    return codes, scale, offset


def quantize_int4_quad(weight: torch.Tensor, group: int,
                       tile: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``(panels, scale, offset)``: :func:`quantize_groups` of ``weight`` with its codes laid out
    by :func:`~.panels.to_int4_quad_panels` (bitwise the same), in one pass without the codes in between;
    ``None`` where the kernel cannot take ``weight`` or ``group`` (not a multiple of 4)."""
    w = weight.detach()
    if not _builds_here(w):
        return None
    out_f, in_f = w.shape
    panels = torch.empty(-(-out_f // tile), -(-in_f // 4), tile // 2, 4, dtype=torch.uint8)
    scale = torch.empty(out_f, -(-in_f // group), dtype=torch.float32)
    offset = torch.empty_like(scale)
    if _library().selfspec_native_quantize_int4_quad(w.data_ptr(), panels.data_ptr(), scale.data_ptr(),
                                                     offset.data_ptr(), out_f, in_f, group, tile,
                                                     torch.get_num_threads()):
        return None  # a group the one pass does not take (not a multiple of 4 inputs, or too long)
    return panels, scale, offset
