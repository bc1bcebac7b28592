"""selfspec-qspec: installed, lossless under the kit (trees and chains), and its mechanics:
it drafts on the compressed copy and refuses the model's own weights."""

import pytest
import torch
from hypothesis import strategies as st

from selfspec import Decoder, PluginError
from selfspec.testing import PluginSuite, tiny_model
from selfspec.testing import strategies as sst


class TestQSpec(PluginSuite):
    """The kit's standard suite: installed, valid options, lossless (with coverage)."""

    plugin = "qspec"
    option_strategies = {
        "num_draft": st.integers(1, 10),
        "tree": st.booleans(),
        # on m's device
        "draft_weights": lambda m: sst.draft_weights(
            m, ("int8", "int8-dynamic", "int8-weights", "int4", "bf16", "bnb-int8")
        ),
    }
    # deep chains reach the deep buckets
    reach_options = {"num_draft": 10, "tree": False, "exit": 0.0}
    # the int8 copy of a tiny model agrees with it on most tokens: deep chains would take the kit's
    # 520-token output in under 128 steps, one-token chains take at least 260 (steps>=256)
    long_options = {"num_draft": 1}


def test_the_draft_reads_the_compressed_copy_and_agrees_often():
    model = tiny_model("llama", dtype=torch.float32)
    dec = Decoder(model, "qspec", {"draft_weights": "int8", "tree": False, "exit": 0.0})
    # every layer compressed
    assert dec.plugin.weights.backend == "int8" and dec.plugin.weights.layers
    res = dec.generate([3, 4, 5, 6, 7] * 4, 32, eos_token_ids=())
    # int8 of the same model mostly agrees
    assert res.stats.drafted > 0 and res.stats.acceptance > 0.5


def test_the_models_own_weights_are_refused():
    with pytest.raises(PluginError, match="draft_weights=none"):
        Decoder(tiny_model("llama", dtype=torch.float32), "qspec", {"draft_weights": "none"})


def test_auto_without_a_compressed_copy_drafts_on_bf16(monkeypatch):
    """Where the host's auto gives no compressed copy (CUDA without bitsandbytes), qspec drafts on
    the bf16 copy, never on the full model's own weights."""
    import selfspec

    real = selfspec.draft_weights
    monkeypatch.setattr(
        selfspec,
        "draft_weights",
        lambda runner, backend="auto", vocab=None: real(
            runner, "none" if backend == "auto" else backend, vocab
        ),
    )
    dec = Decoder(tiny_model("llama", dtype=torch.float32), "qspec", {"tree": False})
    assert dec.plugin.weights.backend == "bf16"


@pytest.mark.parametrize("budget", ["auto", "6"])
def test_a_draft_pass_costs_less_than_a_forward_in_any_weight_layout(budget):
    """The tree's draft cost: measured against full forwards (``tree_budget=auto``; on a tiny model
    the int8 pass can be the slower one), else the int8 copy's bytes over the layers' own, counted
    in whatever layout the decoder laid them out in (an adopted layout holds them as buffers)."""
    model = tiny_model("llama", dtype=torch.float32)
    opts = {"draft_weights": "int8", "tree": True, "tree_budget": budget}
    # packed: the weights held as buffers
    for layout, adopt in (("model", False), ("packed", True)):
        dec = Decoder(model, "qspec", opts, weight_layout=layout, adopt_weights=adopt)
        if budget == "auto":
            assert dec.plugin.draft_cost == dec.plugin.tree.draft_curve.relative > 0
        else:
            # int8: a quarter, + scales
            assert 0.2 < dec.plugin.draft_cost < 0.5, (layout, dec.plugin.draft_cost)
