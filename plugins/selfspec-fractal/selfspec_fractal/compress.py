"""The compressed model: 8-bit copies of the decoder layers, LM head and embedding.

The original model is never modified: every compressed layer is a copy of the model's own
layer module that shares its norms, biases and rotary buffers and has each ``nn.Linear``
replaced by an 8-bit linear of one backend. Every compressed linear takes and returns the
model's dtype (it computes in its own), so compressed layers can attend to the original
layers' KV cache without changing its dtype.

Backends (see results/logs/fractal.md for the measurements behind ``auto``):

* ``int8-weight-only``: int8 weights with one float scale per output channel, activations in
  float (``torch.ops.aten._weight_int8pack_mm``, gpt-fast's CPU path). CPU.
* ``dynamic-int8``: PyTorch's dynamic quantization (int8 weights, activations quantized per
  call, fbgemm/oneDNN int8 GEMM). CPU.
* ``bitsandbytes``: LLM.int8 (``bnb.nn.Linear8bitLt``, outlier threshold 6.0), the paper's
  compression. CUDA only.
* ``none``: no compression, the runner's own layers: a control.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field

import torch
from torch import nn

BACKENDS: tuple[str, ...] = ("auto", "int8-weight-only", "dynamic-int8", "bitsandbytes", "none")


class BackendError(ValueError):
    """A backend this device, dtype or installation cannot run."""


def resolve_backend(backend: str, device: torch.device) -> str:
    """``auto``: ``dynamic-int8`` on CPU (the fastest here, see results/logs/fractal.md), ``bitsandbytes``
    on CUDA when installed, else ``none``. Checks that an explicit backend can run."""
    if backend not in BACKENDS:
        raise BackendError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "auto":
        if device.type == "cpu":
            return "dynamic-int8"
        if device.type == "cuda" and _bnb() is not None:
            return "bitsandbytes"
        return "none"
    if backend in ("int8-weight-only", "dynamic-int8") and device.type != "cpu":
        raise BackendError(f"backend {backend!r} runs on CPU only, the model is on {device}; use 'bitsandbytes' or 'none'")
    if backend == "bitsandbytes":
        if device.type != "cuda" or not torch.cuda.is_available():
            raise BackendError(f"backend 'bitsandbytes' (LLM.int8) needs CUDA, the model is on {device}")
        if _bnb() is None:
            raise BackendError("backend 'bitsandbytes' needs the bitsandbytes package: pip install bitsandbytes")
    return backend


def _bnb():
    try:
        import bitsandbytes  # noqa: PLC0415 (optional, CUDA only)
    except Exception:  # ImportError, or a broken CUDA set-up inside the package
        return None
    return bitsandbytes


# ----------------------------------------------------------------------------- linears
class Int8WeightOnlyLinear(nn.Module):
    """int8 weight ``[out, in]`` + float32 scale per output channel; float activations."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        w = weight.detach().float()
        scale = (w.abs().amax(1) / 127.0).clamp_min(1e-12)  # [out]
        self.register_buffer("qweight", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous())
        self.register_buffer("scale", scale.contiguous())
        self.bias = None if bias is None else bias.detach().float()
        self.in_features, self.out_features = w.shape[1], w.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x2 = x.reshape(-1, self.in_features).float()
        y = torch.ops.aten._weight_int8pack_mm(x2, self.qweight, self.scale)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(dtype)

    def nbytes(self) -> int:
        return self.qweight.numel() + self.scale.numel() * 4 + (0 if self.bias is None else self.bias.numel() * 4)


class DynamicInt8Linear(nn.Module):
    """PyTorch dynamic quantization: int8 weights, activations quantized per call."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        lin = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
        with torch.no_grad():
            lin.weight.copy_(weight.detach().float())
            if bias is not None:
                lin.bias.copy_(bias.detach().float())
        with warnings.catch_warnings():  # torch.ao.quantization is deprecated, still works
            warnings.simplefilter("ignore")
            qconfig = torch.ao.quantization.per_channel_dynamic_qconfig  # a scale per output channel
            self.q = torch.ao.quantization.quantize_dynamic(nn.Sequential(lin), {nn.Linear: qconfig}, dtype=torch.qint8)[0]
        self.in_features, self.out_features = lin.in_features, lin.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return self.q(x)
        return self.q(x.float()).to(x.dtype)

    def nbytes(self) -> int:
        w = self.q.weight()
        b = self.q.bias()
        scales = w.q_per_channel_scales().numel() * 8 if w.qscheme() == torch.per_channel_affine else 8
        return w.numel() + scales + (0 if b is None else b.numel() * 4)


class BnbInt8Linear(nn.Module):
    """bitsandbytes LLM.int8 (``Linear8bitLt``, threshold 6.0) in float16, on CUDA."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        bnb = _bnb()
        out_f, in_f = weight.shape
        lin = bnb.nn.Linear8bitLt(in_f, out_f, bias=bias is not None, has_fp16_weights=False, threshold=6.0)
        lin.weight = bnb.nn.Int8Params(weight.detach().to("cpu", torch.float16), requires_grad=False, has_fp16_weights=False)
        if bias is not None:
            lin.bias = nn.Parameter(bias.detach().to("cpu", torch.float16), requires_grad=False)
        self.q = lin.to(weight.device)  # quantizes on the move to CUDA
        self.in_features, self.out_features = in_f, out_f

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        return self.q(x.to(torch.float16)).to(dtype)

    def nbytes(self) -> int:
        w = self.q.weight
        extra = getattr(w, "SCB", None)
        return w.numel() * w.element_size() + (0 if extra is None else extra.numel() * extra.element_size())


LINEARS: dict[str, type[nn.Module]] = {
    "int8-weight-only": Int8WeightOnlyLinear,
    "dynamic-int8": DynamicInt8Linear,
    "bitsandbytes": BnbInt8Linear,
}


def compress_linear(linear: nn.Module, backend: str) -> nn.Module:
    return LINEARS[backend](linear.weight, getattr(linear, "bias", None))


# Linears of one module that Hugging Face models call on the same input tensor, one after the
# other: computed as one fused product (one activation quantization, one kernel call).
FUSE_GROUPS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class FusedProduct:
    """One compressed product over the concatenated weights of a group of linears.

    The first member called with ``x`` computes ``x @ [W_1; W_2; ...].T`` and keeps it; the
    other members called with the *same* tensor object take their slice. A member called with
    any other input recomputes (correct, just slower), so nothing relies on the call order.
    """

    def __init__(self, linears: list[nn.Module], backend: str) -> None:
        weight = torch.cat([lin.weight.detach() for lin in linears])
        biases = [getattr(lin, "bias", None) for lin in linears]
        bias = None
        if any(b is not None for b in biases):
            bias = torch.cat([b.detach() if b is not None else lin.weight.new_zeros(lin.out_features)
                              for b, lin in zip(biases, linears)])
        self.linear = LINEARS[backend](weight, bias)
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


def compressed_layer(layer: nn.Module, backend: str) -> nn.Module:
    """A copy of ``layer`` sharing every parameter and buffer, its linears compressed (the
    groups in :data:`FUSE_GROUPS` fused into one product each)."""
    memo: dict[int, object] = {}
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
            if all(isinstance(m, nn.Linear) for m in members) and len({m.in_features for m in members}) == 1:
                product = FusedProduct(members, backend)
                for k, name in enumerate(group):
                    setattr(sub, name, FusedMember(product, k))
        for name, child in list(sub.named_children()):
            if isinstance(child, nn.Linear):
                setattr(sub, name, compress_linear(child, backend))
    return twin


# ----------------------------------------------------------------------------- the model
@dataclass
class CompressedModel:
    """Compressed decoder layers (``substitutes`` for the runner), head and embedding.

    ``layers`` is empty for backend ``none`` (the runner's own layers run). ``nbytes`` is the
    memory the copy adds (int8 weights, scales, the int8 embedding table)."""

    backend: str
    layers: dict[int, nn.Module] = field(default_factory=dict)
    head_linear: nn.Module | None = None
    emb_q: torch.Tensor | None = None  # [V, H] int8
    emb_scale: torch.Tensor | None = None  # [V, 1]
    emb_mult: float | torch.Tensor = 1.0
    nbytes: int = 0


def build(runner, backend: str) -> CompressedModel:
    """Compress ``runner``'s model with ``backend`` (already resolved)."""
    cm = CompressedModel(backend)
    if backend == "none":
        return cm
    with torch.inference_mode(False), torch.no_grad():
        cm.layers = {i: compressed_layer(layer, backend) for i, layer in enumerate(runner.layers)}
        head = runner.lm_head
        cm.head_linear = compress_linear(head, backend)
        emb = runner.embedding
        w = emb.weight.detach().float()
        scale = (w.abs().amax(1, keepdim=True) / 127.0).clamp_min(1e-12)  # [V, 1]
        cm.emb_q = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
        cm.emb_scale = scale
        cm.emb_mult = getattr(emb, "embed_scale", 1.0)
    cm.nbytes = _nbytes(cm)
    return cm


def embed(cm: CompressedModel, runner, ids: torch.Tensor) -> torch.Tensor:
    """Compressed embedding: ids ``[q]`` -> ``[1, q, H]`` in the model's dtype."""
    if cm.emb_q is None:
        return runner.embed(ids)
    rows = cm.emb_q.index_select(0, ids).float() * cm.emb_scale.index_select(0, ids)
    mult = cm.emb_mult
    if isinstance(mult, torch.Tensor):
        mult = mult.to(rows.dtype)
    return (rows * mult).to(runner.dtype)[None]


def head(cm: CompressedModel, runner, hidden: torch.Tensor) -> torch.Tensor:
    """Final norm (shared) + compressed LM head (+ soft-capping): ``[..., H]`` -> ``[..., V]``."""
    if cm.head_linear is None:
        return runner.head(hidden)
    return runner.head(hidden, lm_head=cm.head_linear)


def _nbytes(cm: CompressedModel) -> int:
    linears = []
    for m in [*cm.layers.values(), cm.head_linear]:
        for sub in m.modules():
            if isinstance(sub, FusedMember):
                if sub.k == 0:
                    linears.append(sub.product.linear)
            elif isinstance(sub, tuple(LINEARS.values())):
                linears.append(sub)
    total = sum(lin.nbytes() for lin in linears)
    if cm.emb_q is not None:
        total += cm.emb_q.numel() + cm.emb_scale.numel() * cm.emb_scale.element_size()
    return total
