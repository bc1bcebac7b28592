"""The near-tie bound: how far apart two logits may be and still swap places by rounding alone.

Verifying a block of tokens in one forward and decoding one token at a time (``generate``)
compute the same logits with different matrix shapes, so in float32/bf16/float16 they differ by
rounding, and a greedy token may differ where the reference's top-1/top-2 margin is within that
rounding. :func:`tie_bound` is the largest margin at which such a difference is accepted as a
*near-tie* (reported, never retried); above it a difference is a divergence, an error.

The bound scales with the dtype's resolution at the magnitude of the logits it judges:

* ``bfloat16`` / ``float16``: ``ROUNDING_ULPS`` units in the last place of the dtype at the
  row's largest absolute logit (``scale``): ``ROUNDING_ULPS * 2**(floor(log2(scale)) - m)``,
  ``m`` the dtype's mantissa bits (7 for bf16, 10 for float16). In bf16 the logits themselves
  are rounded to that spacing (0.125 at 16-32, 0.25 at 32-64), so a fixed tolerance below it
  judges numbers it cannot resolve. ``ROUNDING_ULPS`` = 4 comes from the measurement in
  ``docs/losslessness.md`` (block forward against one-token forwards, real prompts, widths
  1-32, SmolLM2-135M on a CPU with native bf16): the top-1/top-2 margin moved by at most 3
  ulps there (p99 2-3), and every argmax flip sat at a margin of at most 1 ulp.
* ``float32``: ``1e-3`` as before (about 260 ulps at a logit of 32, far above the measured
  error of a few ulps; kept so float32 behaviour is unchanged).
* ``float64``: ``0``: exact, any difference is an error.

A near-tie needs the reference margin at or below the bound (and, in ``reference.compare`` and
the audit, the output's token within the bound of the top-1 logit); a real bug (a wrong token
accepted, a wrong bonus, a stale cache entry) shows as a difference at a margin of whole
logits, far above a few ulps, and stays an error.
"""

from __future__ import annotations

import math

import torch

#: Units in the last place (of the dtype, at the logits' largest magnitude) a reference margin
#: may have and still count as a rounding flip, for the half-precision dtypes.
ROUNDING_ULPS = 4

#: Fixed bounds of the dtypes whose bound does not scale (float32 unchanged, float64 exact).
FIXED_BOUND: dict[torch.dtype, float] = {torch.float64: 0.0, torch.float32: 1e-3}

_MANTISSA_BITS: dict[torch.dtype, int] = {torch.bfloat16: 7, torch.float16: 10}


def ulp(dtype: torch.dtype, magnitude: float) -> float:
    """Spacing of ``dtype``'s floating-point numbers at ``|magnitude|`` (normal range).

    >>> ulp(torch.bfloat16, 20.0)
    0.125
    """
    bits = {torch.float32: 23, torch.float64: 52, **_MANTISSA_BITS}.get(dtype)
    if bits is None:
        raise ValueError(f"no floating-point spacing for {dtype}")
    x = abs(float(magnitude))
    if x == 0.0 or not math.isfinite(x):
        x = torch.finfo(dtype).tiny
    return 2.0 ** (math.floor(math.log2(x)) - bits)


def logit_scale(logits: torch.Tensor) -> float:
    """The magnitude a bound is taken at: the largest ``|logit|`` of the row ``[V]`` (or rows)."""
    return float(logits.detach().to(torch.float32).abs().max())


def tie_bound(dtype: torch.dtype, logits: torch.Tensor | float | None = None) -> float:
    """The near-tie bound of a top-1/top-2 margin, for a model in ``dtype``.

    ``logits``: the reference row ``[V]`` the margin was taken from (or its scale, the largest
    ``|logit|``, as a float). Needed for bfloat16/float16, whose bound is
    ``ROUNDING_ULPS`` ulps at that scale; ignored for float32 (``1e-3``) and float64 (``0``).
    Any other dtype gets ``0`` (exact).
    """
    if dtype in FIXED_BOUND:
        return FIXED_BOUND[dtype]
    if dtype not in _MANTISSA_BITS:
        return 0.0
    if logits is None:
        raise ValueError(
            f"the {str(dtype).removeprefix('torch.')} near-tie bound needs the logits it judges"
        )
    scale = logits if isinstance(logits, (int, float)) else logit_scale(logits)
    return ROUNDING_ULPS * ulp(dtype, scale)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bf16"``, ``torch.float16`` -> ``"fp16"``, else the torch name."""
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(
        dtype, str(dtype).removeprefix("torch.")
    )


def explain(dtype: torch.dtype, margin: float, bound: float) -> str:
    """One phrase for a report: ``within bf16 rounding (margin 0.125 <= bound 0.5)``, or the
    margin above the bound (a divergence)."""
    if bound > 0 and margin <= bound:
        return f"within {dtype_name(dtype)} rounding (margin {margin:.3g} <= bound {bound:g})"
    return f"margin {margin:.3g} > near-tie bound {bound:g} ({dtype_name(dtype)})"
