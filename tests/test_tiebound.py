"""The near-tie bound (selfspec._engine.contract.tiebound): its arithmetic, and that every check
judges with it.

a) The bound is ROUNDING_ULPS ulps of the dtype at the logits' largest magnitude; ``ulp`` must
   be the true spacing, or the bound would not scale with what the dtype can resolve.
b) A lossy plugin in bf16 still fails: its wrong token sits at a margin of whole logits, above
   a few ulps (the kit's mutants in bf16 are in tests/test_mutants.py).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from test_kit import Lossy  # tests/ is on sys.path (rootdir-relative imports)

from selfspec._engine.contract.reference import compare, reference_generate
from selfspec._engine.contract.tiebound import ROUNDING_ULPS, explain, tie_bound, ulp
from selfspec.app._cli.check import _check_line
from selfspec.testing import LosslessError, assert_lossless


def test_bounds_per_dtype():
    assert tie_bound(torch.float64, torch.tensor([30.0, 1.0])) == 0.0
    assert tie_bound(torch.float32, torch.tensor([30.0, 1.0])) == 1e-3  # unchanged
    assert tie_bound(torch.float32) == 1e-3
    assert ulp(torch.bfloat16, 20.0) == 0.125 and ulp(torch.bfloat16, 40.0) == 0.25
    assert tie_bound(torch.bfloat16, torch.tensor([20.0, -3.0])) == ROUNDING_ULPS * 0.125
    # largest |logit|
    assert tie_bound(torch.bfloat16, torch.tensor([1.0, -40.0])) == ROUNDING_ULPS * 0.25
    assert tie_bound(torch.float16, 20.0) == ROUNDING_ULPS * 2.0 ** (4 - 10)
    with pytest.raises(ValueError, match="needs the logits"):
        tie_bound(torch.bfloat16)


@given(st.floats(1e-3, 1e4), st.sampled_from([torch.bfloat16, torch.float16, torch.float32]))
def test_ulp_is_the_spacing_of_the_dtype(x, dtype):  # see a)
    u = ulp(dtype, x)
    t = torch.tensor(x, dtype=torch.float64)
    lo = t.to(dtype).to(torch.float64)
    nxt = torch.nextafter(t.to(dtype).to(torch.float32), torch.tensor(float("inf"))).to(
        torch.float64
    )
    # nextafter in float32 is finer; the dtype's own step is its rounding
    if dtype != torch.float32:
        # rounded up a binade
        assert abs(float(lo) - x) <= u / 2 * (1 + 1e-9) or abs(float(lo)) >= 2 * x
    else:
        assert float(nxt - lo) == pytest.approx(u) or float(lo) != pytest.approx(x, rel=1e-6)
    assert u <= x * 2.0 ** -{torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}[dtype]


@given(st.floats(0.01, 1000.0))
def test_bound_grows_with_the_magnitude(scale):
    assert tie_bound(torch.bfloat16, 2 * scale) == 2 * tie_bound(torch.bfloat16, scale)
    assert (
        scale * 2.0**-7 * ROUNDING_ULPS / 2
        < tie_bound(torch.bfloat16, scale)
        <= scale * 2.0**-7 * ROUNDING_ULPS
    )


def test_explain_says_rounding_or_divergence():
    assert explain(torch.bfloat16, 0.125, 0.5) == "within bf16 rounding (margin 0.125 <= bound 0.5)"
    assert explain(torch.bfloat16, 0.75, 0.5).startswith("margin 0.75 > near-tie bound 0.5")
    assert explain(torch.float64, 0.0, 0.0).startswith("margin 0 > near-tie bound 0")


def test_check_line_reports_rounding_not_divergence():
    row = {
        "status": "NEAR-TIE",
        "prompt": "p",
        "index": 3,
        "got": 5,
        "expected": 6,
        "margin": 0.125,
        "why": explain(torch.bfloat16, 0.125, 0.5),
    }
    line = _check_line(2, row)
    assert (
        line.startswith("NEAR-TIE  [2] 'p'")
        and "within bf16 rounding (margin 0.125 <= bound 0.5)" in line
    )


def test_compare_judges_with_the_scaled_bound_in_bf16(tiny_model_factory):
    model = tiny_model_factory("llama", dtype=torch.bfloat16)
    prompt = [1, 2, 3]
    ref = reference_generate(model, prompt, 6)
    wrong = ref[:2] + [(ref[2] + 1) % 128] + ref[3:]
    c = compare(model, prompt, wrong, ref)
    logits = model(torch.tensor([prompt + ref[:2]])).logits[0, -1]
    assert c.index == 2 and c.bound == tie_bound(torch.bfloat16, logits) > 0
    assert c.near_tie == (c.margin <= c.bound)
    # an explicit tolerance still wins
    assert compare(model, prompt, wrong, ref, tolerance=1e9).near_tie
    # a margin within the bound is not enough: the output's token must be one of the tied ones
    low = int(logits.float().argmin())
    far = ref[:2] + [low] + ref[3:]
    c = compare(model, prompt, far, ref, tolerance=max(c.margin, 1e-6))
    assert c.margin <= c.bound and not c.near_tie


def test_a_lossy_plugin_still_fails_in_bf16(tiny_model_factory):  # see b)
    model = tiny_model_factory("qwen3", dtype=torch.bfloat16)
    with pytest.raises(LosslessError, match=r"near-tie bound [0-9.e+-]+ \(bf16\)"):
        assert_lossless(model, "lossy", [1, 2, 3], 10, plugin_object=Lossy)


def test_vanilla_is_lossless_in_bf16_under_the_bound(tiny_model_factory):
    for arch in ("llama", "gemma3"):
        res = assert_lossless(
            tiny_model_factory(arch, dtype=torch.bfloat16), "vanilla", [5, 6, 7, 8], 24
        )
        assert len(res.output_ids) == 24
