"""Lean blocks: a draft pass's attention and MLP blocks as a few tensor operations.

A draft pass runs every layer's attention and MLP block, as a verification pass does, but on a
compressed copy whose products cost a quarter as much, so the rest of the block (the modules'
Python, their norms, rotary embedding, views and the attention call) is a third of a one-row
draft pass on a 2-core CPU. :class:`LeanBlocks` computes the same blocks of a pre-norm decoder
layer (Llama, Mistral, Qwen2, Qwen3) from the layer's own parameters with the same tensor
operations in the same order, without the modules' calls and argument handling, and runs a
fused product's members (q/k/v, gate/up) as one product it then slices.

The runner uses them for the layers of draft weights only (a draft changes what is proposed,
never a token), where :meth:`selfspec._engine.runner.adapters.Adapter.lean` recognises the
layer; anything else runs the adapter's own blocks. Every recognised architecture's lean blocks
are tested against the model's own modules (``tests/test_lean.py``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The pre-norm models' RMSNorm, step for step: float32 statistics, the weight applied in
    the input's dtype."""
    dtype = h.dtype
    x = h.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` ``[1, heads, q, d]`` by ``cos``/``sin`` ``[1, 1, q, d]``
    (halves rotated, as ``rotate_half``)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """Scaled dot-product attention of ``q`` ``[1, heads, q, d]`` over ``k``/``v``
    ``[1, kv_heads, kv, d]`` -> ``[1, q, heads, d]`` (contiguous), grouped query heads handled
    as the ``transformers`` SDPA integration handles them on a CPU: SDPA's own grouping when
    nothing is masked, one query's heads folded onto their key head, else the keys repeated."""
    groups = q.shape[1] // k.shape[1]
    n, d = q.shape[2], v.shape[-1]
    kw = {}
    if groups > 1:
        if mask is None:
            kw["enable_gqa"] = True
        elif n == 1:
            q = q.reshape(1, k.shape[1], groups, d)
        else:
            k, v = (
                t[:, :, None].expand(-1, -1, groups, -1, -1).reshape(1, -1, t.shape[2], d)
                for t in (k, v)
            )
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, **kw)
    return o.reshape(1, -1, n, d).transpose(1, 2).contiguous()


class LeanBlocks:
    """The attention and MLP blocks of one pre-norm decoder layer ``layer``.

    ``attn(h, rope, mask, kv)`` and ``mlp(h)`` take and return what
    :meth:`~selfspec._engine.runner.adapters.Adapter.attn_block` and ``mlp_block`` do: the
    residual stream ``[1, q, H]`` in and out, ``rope`` the rotary ``(cos, sin)`` ``[1, q, d]``,
    ``mask`` the attention mask (``None`` or ``[1, 1, q, kv]``) and ``kv`` the layer's cache
    view. Build them with :func:`lean_blocks`, which checks the layer's structure first.
    """

    def __init__(self, layer: nn.Module) -> None:
        at, mlp = layer.self_attn, layer.mlp
        self.attn_norm = _norm(layer.input_layernorm)
        self.mlp_norm = _norm(layer.post_attention_layernorm)
        self.q_norm = _norm(at.q_norm) if getattr(at, "q_norm", None) is not None else None
        self.k_norm = _norm(at.k_norm) if getattr(at, "k_norm", None) is not None else None
        self.qkv = _product([at.q_proj, at.k_proj, at.v_proj])
        self.o = at.o_proj
        self.gate_up = _product([mlp.gate_proj, mlp.up_proj])
        self.down = mlp.down_proj
        self.head_dim = int(at.head_dim)
        self.scaling = float(at.scaling)

    def attn(
        self,
        h: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None,
        kv: Any,
    ) -> torch.Tensor:
        q = h.shape[1]
        x = rms_norm(h, *self.attn_norm)
        qs, ks, vs = (t.view(1, q, -1, self.head_dim) for t in self.qkv(x))
        if self.q_norm is not None:
            qs, ks = rms_norm(qs, *self.q_norm), rms_norm(ks, *self.k_norm)
        cos, sin = (t.unsqueeze(1) for t in rope)
        qs = rotate(qs.transpose(1, 2), cos, sin)
        ks = rotate(ks.transpose(1, 2), cos, sin)
        ks, vs = kv.update(ks, vs.transpose(1, 2))
        o = attention(qs, ks, vs, mask, self.scaling)
        return h + self.o(o.reshape(1, q, -1))

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(rms_norm(h, *self.mlp_norm))
        return h + self.down(F.silu(gate) * up)


def lean_blocks(layer: nn.Module, config: Any) -> LeanBlocks | None:
    """:class:`LeanBlocks` of ``layer``, or ``None`` where the layer is not a pre-norm decoder
    layer they compute: it needs ``self_attn`` with ``q_proj``/``k_proj``/``v_proj``/``o_proj``,
    ``head_dim`` and ``scaling`` (and optionally Qwen3's ``q_norm``/``k_norm``), an MLP of
    ``gate_proj``/``up_proj``/``down_proj`` with ``config.hidden_act`` SiLU, RMSNorms with a
    ``weight`` and ``variance_epsilon`` as ``input_layernorm`` and
    ``post_attention_layernorm``, and no other norm (Gemma's sandwich norms are not)."""
    at, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if at is None or mlp is None or getattr(config, "hidden_act", None) not in ("silu", "swish"):
        return None
    needed = [(at, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")]
    needed += [(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")]
    if any(getattr(m, n, None) is None for m, n in needed):
        return None
    norms = [
        getattr(layer, "input_layernorm", None),
        getattr(layer, "post_attention_layernorm", None),
        *(getattr(at, n) for n in ("q_norm", "k_norm") if getattr(at, n, None) is not None),
    ]
    if any(_norm(n) is None for n in norms):
        return None
    if any(hasattr(layer, n) for n in ("pre_feedforward_layernorm", "post_feedforward_layernorm")):
        return None
    if getattr(at, "attn_logit_softcapping", None) or getattr(
        config, "attn_logit_softcapping", None
    ):
        return None
    return LeanBlocks(layer)


def _norm(module: nn.Module | None) -> tuple[torch.Tensor, float] | None:
    """``(weight, eps)`` of an RMSNorm module computed as :func:`rms_norm`, else ``None``."""
    if module is None or type(module).__name__ not in _RMS_NORMS:
        return None
    weight, eps = getattr(module, "weight", None), getattr(module, "variance_epsilon", None)
    return None if weight is None or eps is None else (weight, float(eps))


# The norm classes whose forward is rms_norm's: the weight times the normalised input (not
# Gemma's 1 + weight).
_RMS_NORMS = frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"})


def _product(linears: list[nn.Module]):
    """A function of ``x`` returning each of ``linears``' products of ``x``: one product sliced
    where they are the members of one fused product (draft weights' ``FusedMember``, in
    order), else one call each."""
    fused = getattr(linears[0], "product", None)
    if (
        fused is not None
        and all(getattr(m, "product", None) is fused and m.k == k for k, m in enumerate(linears))
        and len(fused.bounds) == len(linears) + 1
    ):
        lin, bounds = fused.linear, fused.bounds
        spans = list(zip(bounds[:-1], bounds[1:]))
        return lambda x: [y[..., a:b] for y in (lin(x),) for a, b in spans]
    return lambda x: [m(x) for m in linears]
