"""Weight layouts the runner can execute the model's own modules with.

* ``"auto"`` (the default): ``"packed"`` on CPU in float32/bfloat16/float16, else ``"model"``.
* ``"model"``: the model's weights as they are. The runner's logits are
  bitwise those of the model's own forward, in every dtype.
* ``"transposed"``: the runner keeps its own copy of every ``nn.Linear`` weight of the decoder
  layers and the LM head, stored as a contiguous ``[in, out]`` matrix and handed to the
  module as its ``[out, in]`` transpose (a view). ``nn.Linear`` computes ``x @ W.T``, which is
  then a plain product with a contiguous matrix: on CPU BLAS streams it markedly faster than
  the row-major ``W`` (see ``docs/performance.md``). The math is the same, the summation order
  inside the products is not: logits differ from the model's by rounding (about 1e-5 relative
  in float32, 1e-13 in float64), so greedy tokens can differ only at near-ties. It costs one
  extra copy of those weights in memory.
* ``"packed"`` (CPU, float32/bfloat16/float16): like ``"transposed"``, but the copies are
  prepacked once for oneDNN's inner-product kernel and the linear layers of the layer copies
  are :class:`PackedLinear` modules. On CPU MKL runs a single-row product on one thread
  whatever ``torch.set_num_threads`` says; oneDNN uses them all. Same rounding caveat and
  memory cost as ``"transposed"``.

The layout is applied to *copies* of the layer modules that share every other parameter and
buffer with the model; the model itself is never modified, and each copy runs its own
``forward`` (no modeling code is copied).
"""

from __future__ import annotations

import copy
import weakref

import torch
from torch import nn

LAYOUTS: tuple[str, ...] = ("auto", "model", "transposed", "packed")
PACKED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class WeightLayoutError(ValueError):
    """An unknown weight layout, or one this device/dtype cannot run."""


def check_layout(layout: str, device: torch.device, dtype: torch.dtype) -> str:
    """Validate ``layout`` and resolve ``"auto"``: ``"packed"`` where oneDNN can run it (CPU,
    float32/bfloat16/float16), else ``"model"`` (float64 stays bitwise the model's forward)."""
    if layout == "auto":
        packable = device.type == "cpu" and dtype in PACKED_DTYPES and torch.backends.mkldnn.is_available()
        return "packed" if packable else "model"
    if layout not in LAYOUTS:
        raise WeightLayoutError(f"unknown weight layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    if layout == "packed" and (
        device.type != "cpu"
        or dtype not in PACKED_DTYPES
        or not torch.backends.mkldnn.is_available()
    ):
        raise WeightLayoutError(
            f"weight layout 'packed' needs oneDNN on CPU and float32/bfloat16/float16 weights, "
            f"not {dtype} on {device}; use 'transposed' or 'model'"
        )
    return layout


def layout_copy(module: nn.Module, layout: str) -> nn.Module:
    """``module`` itself for ``"model"``, else a copy with the layout (see the module doc)."""
    if layout == "model":
        return module
    if layout == "transposed":
        return transposed_copy(module)
    return packed_copy(module)


#: Layout copies already made, per model: every Runner over one model shares them, so ten
#: decoders over one model (a benchmark, a sweep) hold one set of copies, not ten.
_COPIES: weakref.WeakKeyDictionary[nn.Module, dict[tuple, tuple[list[nn.Module], nn.Module]]] = (
    weakref.WeakKeyDictionary()
)


def shared_layout_copies(model: nn.Module, layers: list[nn.Module], lm_head: nn.Module,
                         layout: str) -> tuple[list[nn.Module], nn.Module]:
    """``(layer copies, LM head copy)`` with ``layout`` for ``model``, made once and shared.

    The copies are stateless (weights only), so runners can share them. They are made again
    when any weight of ``layers``/``lm_head`` was replaced or changed in place since (the key
    holds each weight's storage pointer and version counter), so a shared copy is never stale.
    """
    if layout == "model":
        return list(layers), lm_head
    weights = [p for m in [*layers, lm_head] for p in m.parameters()]
    key = (layout, len(layers), tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in weights))
    per_model = _COPIES.setdefault(model, {})
    if key not in per_model:
        per_model.clear()  # older copies of this model's weights are stale
        per_model[key] = ([layout_copy(layer, layout) for layer in layers], layout_copy(lm_head, layout))
    return per_model[key]


def _shared_memo(module: nn.Module) -> dict[int, object]:
    """A ``deepcopy`` memo that makes a copy share the parameters, buffers and configs."""
    memo: dict[int, object] = {}
    for t in [*module.parameters(), *module.buffers()]:
        memo[id(t)] = t  # shared, not copied
    for sub in module.modules():
        config = getattr(sub, "config", None)
        if config is not None:
            memo[id(config)] = config
    return memo


def transposed_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose ``nn.Linear`` weights are ``[in, out]``-contiguous.

    Every other parameter and buffer (norms, biases, rotary tables) is shared with
    ``module``, not copied; the new weights hold the same values as the old ones.
    """
    memo = _shared_memo(module)
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            w = sub.weight.detach()
            # w_t: [out, in] with strides (1, out), a view of a contiguous [in, out] matrix
            w_t = w.t().contiguous().t()
            memo[id(sub.weight)] = nn.Parameter(w_t, requires_grad=False)
    return copy.deepcopy(module, memo)


def packed_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` (sharing every parameter and buffer) whose ``nn.Linear``
    submodules are replaced by :class:`PackedLinear` (a plain ``nn.Linear`` module itself
    becomes one)."""
    if isinstance(module, nn.Linear):
        return PackedLinear(module)
    twin = copy.deepcopy(module, _shared_memo(module))
    for sub in list(twin.modules()):
        for child_name, child in list(sub.named_children()):
            if isinstance(child, nn.Linear):
                setattr(sub, child_name, PackedLinear(child))
    return twin


class PackedLinear(nn.Module):
    """``nn.Linear`` computed by oneDNN on a weight prepacked once. Inputs ``[..., in]`` ->
    ``[..., out]``.

    The weight is reordered with no batch-size hint (oneDNN's generic blocked format), not for
    one row: a one-row hint picks a format that is no faster for one token and makes every
    wider block (draft verification, trees, branches) 20-35 % slower on CPU; see
    ``docs/performance.md``, "Prepacking for one row or for any width"."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w)  # opaque oneDNN layout, any width
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN-packed"


def is_transposed(weight: torch.Tensor) -> bool:
    """Whether a ``[out, in]`` weight is stored as a contiguous ``[in, out]`` matrix."""
    return weight.dim() == 2 and weight.t().is_contiguous() and not weight.is_contiguous()
