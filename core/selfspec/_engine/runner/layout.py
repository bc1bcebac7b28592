"""Weight layouts the runner can execute the model's own modules with.

* ``"auto"`` (the default): before measuring, ``"packed"`` where oneDNN can prepack this dtype
  on this CPU (float32 on any x86 CPU; bfloat16/float16 only where the CPU has oneDNN's
  low-precision kernels, see :func:`packing_unsupported`), else ``"model"``; the runner then
  measures which of the layouts that can run here is fastest
  (:func:`selfspec._engine.runner.layout_choice.choose_weight_layout`). Never an error.
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
* ``"packed"`` (CPU; float32, and bfloat16/float16 where oneDNN has kernels for them on this
  CPU, which AVX2-only CPUs do not): like ``"transposed"``, but the copies are
  prepacked once for oneDNN's inner-product kernel and the linear layers of the layer copies
  are :class:`PackedLinear` modules. On CPU MKL runs a single-row product on one thread
  whatever ``torch.set_num_threads`` says; oneDNN uses them all. Same rounding caveat and
  memory cost as ``"transposed"``.
* ``"packed-mkl"`` (CPU, float32, where torch has MKL): a layout per width class
  (:class:`MklPackedLinear`): a one-row product reads a copy packed for MKL's sgemm at one row,
  wider blocks ``"packed"``'s oneDNN copy. It holds both: about 2.3x the float32 weights, where
  the others hold 1x; ``auto`` measures it only where that fits in the memory available.
* any layout a package registers (:mod:`selfspec._engine.runner.formats`): its ``build`` replaces
  each ``nn.Linear`` as ``"packed"``'s does.

The layout is applied to *copies* of the layer modules that share every other parameter and
buffer with the model; the model itself is never modified, and each copy runs its own
``forward`` (no modeling code is copied). The copy sits beside the model's own weights, which
costs their size again: fine for a benchmark that also runs the model's own forward, too much
for a 1.5B model on a 24 GB machine. :func:`adopt_layout` therefore applies the layout to the
model *in place* instead: the model's linear modules are replaced by the packed ones (or their
weights by the transposed ones), the original weights are released, and the model holds one
copy of each weight. The model's own ``forward`` (and ``generate``) still works, through the
new layout, so it equals the original up to the same rounding. ``specdec`` (the CLI) adopts;
the library and ``specdec bench``/``check`` keep the copies (``Decoder(adopt_weights=...)``).

A model that accelerate dispatched (:mod:`.placement`) keeps some modules' weights on disk, as
meta tensors loaded by a hook for each forward. Every layout applies to the *resident* modules
only (decoder layers and LM head whose weights all hold values): an offloaded module runs in
the ``"model"`` layout through its own hooks, whatever was asked, since a copy laid out once
would have to be made again from the disk on every forward (or kept in memory, which is what
offloading avoids). ``"auto"`` is resolved as for any model and then applies that way; the
runner reports which layers run which layout (:attr:`selfspec.Runner.layer_layouts`).
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Collection
from types import SimpleNamespace
from typing import Protocol

import torch
from torch import nn

from selfspec._engine.runner.placement import is_offloaded, share_hooks, tensor_key
from selfspec._engine.runner.residency import mapped_files, own_file_backed, unmapped_copy
from selfspec._engine.tuning.machine import CpuCapability

PACKED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class WeightLayoutError(ValueError):
    """An unknown weight layout, or one this device/dtype/CPU cannot run."""


def packing_unsupported(
    device_type: str, dtype: torch.dtype, cpu: CpuCapability | None
) -> str | None:
    """Why oneDNN cannot prepack weights of ``dtype`` on ``device_type`` with ``cpu``, or
    ``None`` when it can. Pure: every fact comes in as an argument (``cpu`` is ``None`` off
    the CPU)."""
    if device_type != "cpu" or cpu is None:
        return f"it runs on CPU only, not {device_type}"
    if dtype not in PACKED_DTYPES:
        return (
            "it needs float32, bfloat16 or float16 weights, "
            f"not {str(dtype).removeprefix('torch.')}"
        )
    if not cpu.onednn:
        return "this torch build has no oneDNN"
    if dtype == torch.bfloat16 and not cpu.onednn_bf16:
        return (
            f"oneDNN's bfloat16 kernels need AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT, and this CPU "
            f"runs {cpu.label}"
        )
    if dtype == torch.float16 and not cpu.onednn_fp16:
        return (
            f"oneDNN's float16 kernels need AVX-512 FP16 or AVX-NE-CONVERT, and this CPU runs "
            f"{cpu.label}"
        )
    return None


#: The host's own layouts (registered in :mod:`selfspec._engine.runner.host_formats`, which reads
#: their products from :func:`own_builds`); a layout a package registers reaches the functions
#: below as its registered format.
OWN_LAYOUTS: tuple[str, ...] = ("model", "transposed", "packed", "packed-mkl")


def choose_layout(
    layout: str,
    device_type: str,
    dtype: torch.dtype,
    cpu: CpuCapability | None,
    why: str | None = None,
    known: Collection[str] = OWN_LAYOUTS,
) -> str:
    """Resolve a requested weight layout to the one that runs before anything is measured (a
    pure function: ``why`` is the layout's registered ``unsupported`` answer, ``known`` the
    registered names; :func:`selfspec._engine.runner.formats.check_layout` gives both).

    ``"auto"`` is ``"packed"`` where oneDNN can prepack for this device, dtype and CPU
    (:func:`packing_unsupported` says ``None``), and ``"model"`` everywhere else: float64,
    GPUs, bf16/fp16 on a CPU without oneDNN's low-precision kernels. It never raises for a
    capability. An explicit layout that cannot run raises :class:`WeightLayoutError` saying
    why; ``"model"`` and ``"transposed"`` run everywhere.
    """
    if layout == "auto":
        return "model" if packing_unsupported(device_type, dtype, cpu) else "packed"
    if layout not in known:
        raise WeightLayoutError(
            f"unknown weight layout {layout!r}; choose one of auto, {', '.join(known)}"
        )
    if layout == "packed":  # decided from the capability given, not this process's CPU
        why = packing_unsupported(device_type, dtype, cpu)
    if why:
        raise WeightLayoutError(
            f"weight layout {layout!r} cannot run here: {why}; use 'auto', 'transposed' or 'model'"
        )
    return layout


class _Layout(Protocol):
    """What the functions below need of a layout: its registered name and ``build(weight,
    bias)`` (``None``: the model's own weights)."""

    name: str
    build: Callable[[torch.Tensor, torch.Tensor | None], nn.Module] | None


def _as_layout(layout: str | _Layout) -> _Layout:
    """A layout given by name (one of :data:`OWN_LAYOUTS`) or as its registered format."""
    if not isinstance(layout, str):
        return layout
    builds = own_builds()
    if layout not in builds:
        raise WeightLayoutError(
            f"unknown weight layout {layout!r}; pass a package's layout as its registered "
            "format (selfspec.weight_formats())"
        )
    return SimpleNamespace(name=layout, build=builds[layout])


def own_builds() -> dict[str, Callable[[torch.Tensor, torch.Tensor | None], nn.Module] | None]:
    """``{name: build}`` of :data:`OWN_LAYOUTS` (``None``: the model's own weights)."""
    return dict(
        zip(OWN_LAYOUTS, (None, transposed_linear, PackedLinear, MklPackedLinear), strict=True)
    )


def build_copy(
    layout: str | _Layout, linear: nn.Module, files: list[tuple[int, int, int, str]] | None = None
) -> nn.Module:
    """``layout``'s module for a linear module's weight and bias, marked with the layout's name
    (``module.weight_format``), so it is never laid out twice."""
    fmt = _as_layout(layout)
    if fmt.build is None:
        return linear
    # read from the file, not through its mapping, where the weight is a view of one (residency.py)
    module = fmt.build(unmapped_copy(linear.weight.detach(), files), getattr(linear, "bias", None))
    module.weight_format = fmt.name
    return module


def adopt_layout(
    model: nn.Module, layers: list[nn.Module], lm_head: nn.Module, layout: str | _Layout
) -> nn.Module:
    """Apply ``layout`` to ``model`` itself: no copy, the original weights are released.

    Every ``nn.Linear`` inside ``layers``, and ``lm_head``, is replaced in its parent module by
    the layout's module (:class:`PackedLinear` for ``"packed"``; it still answers ``.weight``,
    rebuilt on demand, so code that reads a weight once keeps working; ``"transposed"``: an
    ``nn.Linear`` over the ``[in, out]``-contiguous weight). ``"model"``: nothing. Returns
    the LM head module now in the model. Idempotent. Tied weights (an LM head that is the
    embedding matrix) are not released: the embedding still holds them. Offloaded modules
    (weights on the meta device, see the module doc) are left as they are. The tensors left
    that view a memory-mapped file are copied into memory (:func:`own_file_backed`), so the
    file's mapping is released.
    """
    fmt = _as_layout(layout)
    if fmt.build is None:
        return lm_head
    layers = [layer for layer in layers if not is_offloaded(layer)]
    layout_head = not is_offloaded(lm_head)
    files = mapped_files()  # read once for every weight below
    for layer in layers:
        for sub in list(layer.modules()):
            for name, child in list(sub.named_children()):
                if _is_plain_linear(child):
                    setattr(sub, name, build_copy(fmt, child, files))
    if not _is_plain_linear(lm_head) or not layout_head:
        return lm_head
    laid_head = build_copy(fmt, lm_head, files)
    for parent in model.modules():
        for name, child in list(parent.named_children()):
            if child is lm_head:
                setattr(parent, name, laid_head)
    own_file_backed(model)
    return laid_head


def layout_copy(module: nn.Module, layout: str | _Layout) -> nn.Module:
    """``module`` itself for ``"model"`` or an offloaded module, else a copy with the layout
    (see the module doc)."""
    if _as_layout(layout).build is None or is_offloaded(module):
        return module
    return replace_linears(module, layout)


def _is_plain_linear(module: nn.Module) -> bool:
    """An ``nn.Linear`` not yet laid out (no layout's module)."""
    return isinstance(module, nn.Linear) and getattr(module, "weight_format", None) is None


#: Layout copies already made, per model: every Runner over one model shares them, so ten
#: decoders over one model (a benchmark, a sweep) hold one set of copies, not ten.
_COPIES: weakref.WeakKeyDictionary[nn.Module, dict[tuple, tuple[list[nn.Module], nn.Module]]] = (
    weakref.WeakKeyDictionary()
)


def shared_layout_copies(
    model: nn.Module, layers: list[nn.Module], lm_head: nn.Module, layout: str | _Layout
) -> tuple[list[nn.Module], nn.Module]:
    """``(layer copies, LM head copy)`` with ``layout`` for ``model``, made once and shared.

    The copies are stateless (weights only), so runners can share them. They are made again
    when any weight of ``layers``/``lm_head`` was replaced or changed in place since (the key
    holds each weight's storage pointer and version counter), so a shared copy is never stale.
    """
    if _as_layout(layout).build is None:
        return list(layers), lm_head
    weights = [p for m in [*layers, lm_head] for p in m.parameters()]
    key = (_as_layout(layout).name, len(layers), tuple(tensor_key(p) for p in weights))
    per_model = _COPIES.setdefault(model, {})
    if key not in per_model:
        per_model.clear()  # older copies of this model's weights are stale
        per_model[key] = (
            [layout_copy(layer, layout) for layer in layers],
            layout_copy(lm_head, layout),
        )
    return per_model[key]


def _shared_memo(module: nn.Module) -> dict[int, object]:
    """A ``deepcopy`` memo that makes a copy share the parameters, buffers, configs and
    accelerate hooks."""
    memo: dict[int, object] = share_hooks(module, {})
    for t in [*module.parameters(), *module.buffers()]:
        memo[id(t)] = t  # shared, not copied
    for sub in module.modules():
        config = getattr(sub, "config", None)
        if config is not None:
            memo[id(config)] = config
    return memo


def replace_linears(module: nn.Module, layout: str | _Layout) -> nn.Module:
    """A copy of ``module`` (sharing every parameter and buffer) whose plain ``nn.Linear``
    submodules are the layout's modules; a plain ``nn.Linear`` itself becomes one, any other
    product module (already laid out) is returned as it is."""
    fmt = _as_layout(layout)
    files = mapped_files()  # read once for every weight below
    if isinstance(module, nn.Linear):
        return build_copy(fmt, module, files) if _is_plain_linear(module) else module
    twin = copy.deepcopy(module, _shared_memo(module))
    for sub in list(twin.modules()):
        for child_name, child in list(sub.named_children()):
            if _is_plain_linear(child):
                setattr(sub, child_name, build_copy(fmt, child, files))
    return twin


def transposed_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """An ``nn.Linear`` over ``weight`` stored as a contiguous ``[in, out]`` matrix (its
    ``weight`` the ``[out, in]`` transpose view) and the same ``bias`` tensor."""
    out_f, in_f = weight.shape
    linear = nn.Linear(in_f, out_f, bias=False, device="meta", dtype=weight.dtype)
    # w_t: [out, in] with strides (1, out), a view of a contiguous [in, out] matrix
    linear.weight = nn.Parameter(weight.detach().t().contiguous().t(), requires_grad=False)
    linear.bias = (
        bias
        if isinstance(bias, nn.Parameter) or bias is None
        else nn.Parameter(bias, requires_grad=False)
    )
    return linear


class PackedLinear(nn.Linear):
    """``nn.Linear`` computed by oneDNN on a weight prepacked once. Inputs ``[..., in]`` ->
    ``[..., out]``.

    It holds the packed weight only (a non-persistent buffer, so layer copies share it);
    ``.weight`` unpacks it on demand (exactly: a reorder back, no arithmetic), a temporary copy
    for code that reads a weight once, such as a plugin compressing the layers. It is an
    ``nn.Linear`` subclass for that code's ``isinstance`` checks; ``state_dict`` does not hold
    the weight, so a model that adopted packed weights is for decoding, not for saving.

    The weight is reordered with no batch-size hint (oneDNN's generic blocked format), not for
    one row: a one-row hint picks a format that is no faster for one token and makes every
    wider block (draft verification, trees, branches) 20-35 % slower on CPU; see
    ``docs/performance.md``, "Prepacking for one row or for any width"."""

    def __init__(self, weight: torch.Tensor | nn.Linear, bias: torch.Tensor | None = None) -> None:
        nn.Module.__init__(self)  # not nn.Linear's: it would allocate a weight
        if isinstance(weight, nn.Module):  # an nn.Linear: its weight and bias
            weight, bias = weight.weight, weight.bias
        w = weight.detach()
        self.out_features, self.in_features = w.shape
        # opaque oneDNN layout, any width
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(w), persistent=False)
        self.bias = bias

    @property
    def weight(self) -> torch.Tensor:  # type: ignore[override]
        """The ``[out, in]`` weight, unpacked (a new tensor on every access)."""
        return self.packed.to_dense()

    def weight_spec(self) -> tuple[torch.Size, torch.dtype, torch.device]:
        """The weight's shape, dtype and device, without unpacking it."""
        return (
            torch.Size((self.out_features, self.in_features)),
            self.packed.dtype,
            self.packed.device,
        )

    #: rows a one-row input is computed in (the row, then zero rows): oneDNN's kernel for one row
    #: can be slower than for a few (it is on Zen 4). Measured per machine and model shape by the
    #: runner (:func:`selfspec._engine.runner.layout_choice.choose_one_row_width`); 1 unmeasured.
    one_row_width = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.one_row_width
        if w > 1 and x.dim() >= 2 and x.shape[-2] == 1:
            y = torch.ops.mkldnn._linear_pointwise(
                nn.functional.pad(x, (0, 0, 0, w - 1)), self.packed, self.bias, "none", [], ""
            )
            return y.narrow(-2, 0, 1)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN-packed"


class MklPackedLinear(PackedLinear):
    """A layout per width class: one-row products read a copy of the weight packed for MKL's
    sgemm at one row (``torch.ops.mkl._mkl_linear``, the fastest one-row product on some CPUs),
    every other row count reads :class:`PackedLinear`'s oneDNN copy. Two copies: MKL's packs
    1.1-1.6x the bytes of a large weight (5x a small one), so about 2.3x the float32 weights in
    all. float32, CPU with MKL."""

    def __init__(self, weight: torch.Tensor | nn.Linear, bias: torch.Tensor | None = None) -> None:
        if isinstance(weight, nn.Module):
            weight, bias = weight.weight, weight.bias
        super().__init__(weight, bias)
        w = weight.detach()
        self.register_buffer(
            "mkl", torch.ops.mkl._mkl_reorder_linear_weight(w, 1), persistent=False
        )
        # _mkl_linear reads its unpacked weight only for another row count, never taken here
        self.register_buffer(
            "_unused", torch.zeros(1).expand(self.out_features, self.in_features), persistent=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)  # rows: [n, in]
        if rows.shape[0] != 1:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        y = torch.ops.mkl._mkl_linear(rows, self.mkl, self._unused, self.bias, 1)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            "MKL-packed for one row, oneDNN"
        )


def weight_spec(module: nn.Module) -> tuple[torch.Size, torch.dtype, torch.device]:
    """Shape, dtype and device of a product module's ``[out, in]`` weight, without rebuilding
    it (a packed layout's ``.weight`` is a new copy on every access)."""
    spec = getattr(module, "weight_spec", None)
    if callable(spec):
        return spec()
    w = module.weight
    return w.shape, w.dtype, w.device


def weight_rows(module: nn.Module, rows: int) -> torch.Tensor:
    """The first ``rows`` rows of a product module's weight (rebuilding no more than those where
    the layout can)."""
    take = getattr(module, "weight_rows", None)
    if callable(take):
        return take(rows)
    return module.weight.detach()[:rows]


def weight_into(module: nn.Module, out: torch.Tensor) -> torch.Tensor:
    """A product module's ``[out, in]`` weight written into ``out`` (a contiguous tensor of its
    shape); returns ``out``. A layout that rebuilds its weight may write it there directly
    (a ``weight_into(out)`` method)."""
    write = getattr(module, "weight_into", None)
    if callable(write):
        return write(out)
    return out.copy_(module.weight.detach())


def rebuilt_weight(module: nn.Module) -> bool:
    """Whether ``module.weight`` is rebuilt on access (a layout's packed copy) rather
    than a stored tensor."""
    return isinstance(getattr(type(module), "weight", None), property)


def set_one_row_width(modules: list[nn.Module], width: int) -> None:
    """Compute one-row inputs of every :class:`PackedLinear` in ``modules`` as ``width`` rows."""
    for module in modules:
        for m in module.modules():
            if isinstance(m, PackedLinear):
                m.one_row_width = width


def is_transposed(weight: torch.Tensor) -> bool:
    """Whether a ``[out, in]`` weight is stored as a contiguous ``[in, out]`` matrix."""
    return weight.dim() == 2 and weight.t().is_contiguous() and not weight.is_contiguous()
