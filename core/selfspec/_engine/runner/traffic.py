"""Bytes of weights a forward reads: what bounds a decode on a machine limited by memory.

A one-token forward of a model in a CPU's memory is bound by how fast the weights stream in,
so the machine's limit for a method is ``bandwidth / bytes of weights read per committed
token``. The runner adds up, for every forward, the product weights of each attention and MLP
block it runs (the model's own, in the runner's layout, or the draft weights' compressed
copies, which hold fewer bytes) and of the head it projects with; norms, biases and the
embedding lookup are left out (a few rows, not a stream). ``Stats.weight_bytes`` carries a
decode's total; the bench turns it into a roofline.
"""

from __future__ import annotations

import weakref

from torch import nn

_BYTES: weakref.WeakKeyDictionary[nn.Module, tuple[int, int]] = weakref.WeakKeyDictionary()


def product_bytes(module: nn.Module) -> int:
    """Bytes of the product weights ``module`` holds: every leaf with ``in_features`` (an
    ``nn.Linear``, a packed or compressed linear, a member of a fused product counted once)."""
    total = 0
    for m in module.modules():
        if not hasattr(m, "in_features") or any(hasattr(c, "in_features") for c in m.children()):
            continue
        product = getattr(m, "product", None)  # a fused member: its product, by its first member
        if product is not None:
            total += product.linear.nbytes() if m.k == 0 else 0
        elif hasattr(m, "nbytes"):
            total += int(m.nbytes())
        elif hasattr(m, "packed"):  # oneDNN-packed: opaque, as many elements as the weight
            total += m.in_features * m.out_features * m.packed.element_size()
        else:
            w = getattr(m, "weight", None)
            total += w.numel() * w.element_size() if w is not None else 0
    return total


def block_bytes(layer: nn.Module) -> tuple[int, int]:
    """``(attention bytes, MLP bytes)`` of a decoder layer's products (cached per module);
    the MLP is the layer's ``mlp`` child, the attention everything else."""
    cached = _BYTES.get(layer)
    if cached is None:
        mlp = getattr(layer, "mlp", None)
        mlp_bytes = product_bytes(mlp) if isinstance(mlp, nn.Module) else 0
        cached = _BYTES[layer] = (product_bytes(layer) - mlp_bytes, mlp_bytes)
    return cached
