"""Weight layouts the runner can execute the model's own modules with.

* ``"model"`` (the default): the model's weights as they are. The runner's logits are
  bitwise those of the model's own forward, in every dtype.
* ``"transposed"``: the runner keeps its own copy of every ``nn.Linear`` weight of the decoder
  layers and the LM head, stored as a contiguous ``[in, out]`` matrix and handed to the
  module as its ``[out, in]`` transpose (a view). ``nn.Linear`` computes ``x @ W.T``, which is
  then a plain product with a contiguous matrix: on CPU BLAS streams it markedly faster than
  the row-major ``W`` (see ``docs/performance.md``). The math is the same, the summation order
  inside the products is not: logits differ from the model's by rounding (about 1e-5 relative
  in float32, 1e-13 in float64), so greedy tokens can differ only at near-ties. It costs one
  extra copy of those weights in memory.

The layout is applied to *copies* of the layer modules that share every other parameter and
buffer with the model; the model itself is never modified, and each copy runs its own
``forward`` (no modeling code is copied).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

LAYOUTS: tuple[str, ...] = ("model", "transposed")


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"unknown weight layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    return layout


def transposed_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose ``nn.Linear`` weights are ``[in, out]``-contiguous.

    Every other parameter and buffer (norms, biases, rotary tables) is shared with
    ``module``, not copied; the new weights hold the same values as the old ones.
    """
    memo: dict[int, object] = {}
    for t in [*module.parameters(), *module.buffers()]:
        memo[id(t)] = t  # shared, not copied
    for sub in module.modules():
        config = getattr(sub, "config", None)
        if config is not None:
            memo[id(config)] = config
        if isinstance(sub, nn.Linear):
            w = sub.weight.detach()
            # w_t: [out, in] with strides (1, out), a view of a contiguous [in, out] matrix
            w_t = w.t().contiguous().t()
            memo[id(sub.weight)] = nn.Parameter(w_t, requires_grad=False)
    return copy.deepcopy(module, memo)


def is_transposed(weight: torch.Tensor) -> bool:
    """Whether a ``[out, in]`` weight is stored as a contiguous ``[in, out]`` matrix."""
    return weight.dim() == 2 and weight.t().is_contiguous() and not weight.is_contiguous()
