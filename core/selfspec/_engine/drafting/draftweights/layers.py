"""Compressed copies of decoder layers: the model's own layer module, copied, sharing every
parameter and buffer, with each ``nn.Linear`` replaced by a compressed linear of one draft
format (:mod:`selfspec._engine.runner.formats`), and the linears Hugging Face models call on one
input fused into one product."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from selfspec._engine.runner.formats import weight_format
from selfspec._engine.runner.layout import rebuilt_weight, weight_into, weight_spec
from selfspec._engine.runner.linears import CompressedLinear
from selfspec._engine.runner.placement import detach_hooks, own_tensors, share_hooks

# Linears of one module that Hugging Face models call on the same input tensor, one after the
# other: computed as one fused product (one activation quantization, one kernel call).
FUSE_GROUPS: tuple[tuple[str, ...], ...] = (
    ("q_proj", "k_proj", "v_proj"),
    ("gate_proj", "up_proj"),
)


def compress_linear(linear: nn.Module, backend: str) -> CompressedLinear:
    """A compressed copy of ``linear`` (an ``nn.Linear``, or any module with its ``weight``)."""
    return draft_linear(backend, stacked_weight([linear]), getattr(linear, "bias", None))


def draft_linear(backend: str, weight: torch.Tensor, bias: torch.Tensor | None) -> CompressedLinear:
    """The draft format ``backend``'s module for ``weight`` ``[out, in]`` and ``bias``, as a
    :class:`CompressedLinear` (a format's own module that is not one is wrapped)."""
    module = weight_format(backend, "draft").build(weight, bias)
    if not isinstance(module, CompressedLinear):
        module = _Wrapped(module, weight.shape[1], weight.shape[0])
    module.weight_format = backend
    return module


class _Wrapped(CompressedLinear):
    """A registered draft format's module that is not a :class:`CompressedLinear`: its bytes
    are those of its tensors."""

    def __init__(self, inner: nn.Module, in_features: int, out_features: int) -> None:
        super().__init__()
        self.inner, self.in_features, self.out_features = inner, in_features, out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)

    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size() for t in [*self.inner.parameters(), *self.inner.buffers()]
        )


# The buffer :func:`reused_buffer` lends to :func:`stacked_weight` (a flat tensor), and how many
# builds hold it open.
_BUFFER: dict[str, torch.Tensor] = {}
_OPEN = [0]


@contextmanager
def reused_buffer() -> Iterator[None]:
    """Within it, the float weights a compression reads (a group's stack, a layout's rebuilt
    weight) are written to one buffer reused from product to product, not to fresh memory each
    time (whose first touch costs more than the copy); the buffer is freed when the outermost
    one exits. The compressed linears copy what they keep, so none holds the buffer."""
    _OPEN[0] += 1
    try:
        yield
    finally:
        _OPEN[0] -= 1
        if not _OPEN[0]:
            _BUFFER.clear()


def stacked_weight(linears: list[nn.Module]) -> torch.Tensor:
    """The ``[sum of out, in]`` weights of ``linears`` stacked in order: the weight itself for
    one linear that stores it, else a tensor each weight is written into (within
    :func:`reused_buffer`, a view of its buffer, valid until the next call)."""
    if len(linears) == 1 and not rebuilt_weight(linears[0]):
        return linears[0].weight.detach()
    specs = [weight_spec(lin) for lin in linears]
    (_, in_f), dtype, device = specs[0]
    rows = sum(shape[0] for shape, _, _ in specs)
    if _OPEN[0]:
        buf = _BUFFER.get("flat")
        if buf is None or buf.numel() < rows * in_f or buf.dtype != dtype or buf.device != device:
            buf = _BUFFER["flat"] = torch.empty(rows * in_f, dtype=dtype, device=device)
        out = buf[: rows * in_f].view(rows, in_f)
    else:
        out = torch.empty(rows, in_f, dtype=dtype, device=device)
    start = 0
    for lin, (shape, _, _) in zip(linears, specs):
        weight_into(lin, out[start : start + shape[0]])
        start += shape[0]
    return out


class FusedProduct:
    """One compressed product over the concatenated weights of a group of linears.

    The first member called with ``x`` computes ``x @ [W_1; W_2; ...].T`` and keeps it; the
    other members called with the *same* tensor object take their slice. A member called with
    any other input recomputes (correct, just slower), so nothing relies on the call order.
    """

    def __init__(self, linears: list[nn.Module], backend: str) -> None:
        weight = stacked_weight(linears)  # one layer's group
        biases = [getattr(lin, "bias", None) for lin in linears]
        bias = None
        if any(b is not None for b in biases):
            bias = torch.cat(
                [
                    b.detach() if b is not None else weight.new_zeros(lin.out_features)
                    for b, lin in zip(biases, linears)
                ]
            )
        self.linear = draft_linear(backend, weight, bias)
        del weight
        bounds = [0]
        for lin in linears:
            bounds.append(bounds[-1] + lin.out_features)
        self.bounds = bounds
        self._x: torch.Tensor | None = None
        self._y: torch.Tensor | None = None

    def slice(self, k: int, x: torch.Tensor) -> torch.Tensor:
        if self._x is not x:
            self._x, self._y = x, self.linear(x)
        y = self._y[..., self.bounds[k] : self.bounds[k + 1]]
        if k == len(self.bounds) - 2:  # the last member: drop the references
            self._x = self._y = None
        return y


class FusedMember(nn.Module):
    """Member ``k`` of a :class:`FusedProduct`, in place of one ``nn.Linear``."""

    def __init__(self, product: FusedProduct, k: int) -> None:
        super().__init__()
        self.product, self.k = product, k
        self.in_features = product.linear.in_features
        self.out_features = product.bounds[k + 1] - product.bounds[k]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.product.slice(self.k, x)


def compressed_layer(layer: nn.Module, backend: str, *, own: bool = False) -> nn.Module:
    """A copy of ``layer`` sharing every parameter and buffer, its linears compressed (the
    groups in :data:`FUSE_GROUPS` fused into one product each).

    The copy carries no accelerate hook (a dispatched model's hooks stay on the model: the
    copy's inputs are the runner's business). ``own=True``: the copy keeps its own copies of
    the tensors it does not compress (norms, biases) instead of sharing them: for a layer
    whose weights were loaded from the disk for the build
    (:func:`selfspec._engine.runner.placement.loaded`)."""
    memo: dict[int, object] = share_hooks(layer, {})
    for t in [*layer.parameters(), *layer.buffers()]:
        memo[id(t)] = t  # shared, not copied (the linears are replaced below)
    for sub in layer.modules():
        config = getattr(sub, "config", None)
        if config is not None:
            memo[id(config)] = config
    twin = copy.deepcopy(layer, memo)
    for sub in list(twin.modules()):
        children = dict(sub.named_children())
        for group in FUSE_GROUPS:
            members = [children.get(name) for name in group]
            if (
                all(isinstance(m, nn.Linear) for m in members)
                and len({m.in_features for m in members}) == 1
            ):
                product = FusedProduct(members, backend)
                for k, name in enumerate(group):
                    setattr(sub, name, FusedMember(product, k))
        for name, child in list(sub.named_children()):
            if isinstance(child, nn.Linear):
                setattr(sub, name, compress_linear(child, backend))
    detach_hooks(twin)
    if own:
        own_tensors(twin, skip=(CompressedLinear,))
    return twin


def layer_nbytes(layer: nn.Module) -> int:
    """Bytes the compressed linears of one compressed layer hold (each fused product once)."""
    total = 0
    for sub in layer.modules():
        if isinstance(sub, FusedMember):
            total += sub.product.linear.nbytes() if sub.k == 0 else 0
        elif isinstance(sub, CompressedLinear):
            total += sub.nbytes()
    return total
