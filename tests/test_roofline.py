"""The machine's limit in the bench: bytes of weights a decode reads (counted by the runner),
the roofline rows built from records, its table, and the vanilla-vs-HF comparison that does not
call HF's early stop at its own EOS a divergence. No timing is asserted."""

from __future__ import annotations

import pytest
import torch

from selfspec.app._bench.roofline import (
    markdown,
    model_bytes,
    read_bandwidth,
    read_bandwidths,
    roofline,
)
from selfspec.app._bench.vanilla import same_output

CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


def _model() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(LlamaConfig(**CONFIG)).to(torch.float64).eval()


def test_a_full_forward_reads_every_linear_and_the_head_once():
    model = _model()
    linears = sum(m.weight.numel() * 8 for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert model_bytes(model) == linears  # the head is a Linear too; norms and embedding left out


def test_vanilla_reads_the_whole_model_per_token_and_a_skipping_draft_reads_less():
    from selfspec import Decoder

    model = _model()
    full = model_bytes(model)
    res = Decoder(model, "vanilla").generate([1, 2, 3, 4, 5], 6)
    assert res.stats.weight_bytes == full * res.stats.new_tokens
    # a draft pass that skips every MLP reads the attention products and the head only
    runner = Decoder(model, "vanilla").runner
    before = runner.weight_bytes
    runner.forward(torch.tensor([1, 2]), skip_mlp=range(runner.n_layers))
    mlp = sum(
        m.weight.numel() * 8
        for layer in runner.layers
        for m in layer.mlp.modules()
        if isinstance(m, torch.nn.Linear)
    )
    assert runner.weight_bytes - before == full - mlp


def _rec(
    method, tokens, wall, weight_bytes=None, plugin=None, forwards=None, prefill=None, prefill_new=0
):
    return {
        "method": method,
        "new_tokens": tokens,
        "wall_time": wall,
        "weight_bytes": weight_bytes,
        "plugin": plugin,
        "forwards": forwards,
        "prefill_s": prefill,
        "prefill_new_tokens": prefill_new,
    }


def test_roofline_rows_divide_the_bandwidth_by_bytes_per_committed_token():
    recs = [
        _rec("hf", 10, 2.0, forwards=10, prefill=0.2, prefill_new=1),
        _rec("vanilla", 10, 1.5, 1000, "vanilla", prefill=0.5),
        _rec("spec", 10, 0.75, 400, "spec", prefill=0.5),
    ]
    roof = roofline(recs, bandwidth=1000.0, full_forward_bytes=100)
    rows = {r["method"]: r for r in roof["rows"]}
    assert rows["hf"]["bytes_per_token"] == 100 and rows["vanilla"]["bytes_per_token"] == 100
    assert rows["vanilla"]["limit_tokens_per_s"] == pytest.approx(10.0)
    # the limit bounds the decode: tokens after the prefill over the time after it (HF's prefill
    # gave its first token)
    assert rows["vanilla"]["decode_tokens_per_s"] == pytest.approx(10.0) and rows["vanilla"][
        "of_limit"
    ] == pytest.approx(1.0)
    assert rows["hf"]["decode_tokens_per_s"] == pytest.approx(9 / 1.8) and rows["hf"][
        "of_limit"
    ] == pytest.approx(0.5)
    # wall clock, prefill included
    assert rows["vanilla"]["tokens_per_s"] == pytest.approx(10 / 1.5)
    assert rows["spec"]["bytes_per_token"] == 40 and rows["spec"][
        "limit_vs_vanilla"
    ] == pytest.approx(2.5)
    assert rows["spec"]["decode_vs_vanilla"] == pytest.approx(4.0)
    assert roof["prefill_share"] == pytest.approx(1 / 3)
    table = "\n".join(markdown({"roofline": roof}))
    assert (
        "% of limit" in table
        and "| vanilla | 0.000 | 10.0 | 10.0 | 100% | 1.00× | 1.00× |" in table
    )
    assert "Prefill took 33% of `vanilla`'s wall time" in table and "exceed 3.0×" in table


def test_a_method_whose_prefill_is_unknown_has_no_decode_figures():
    recs = [
        _rec("vanilla", 10, 1.5, 1000, "vanilla", prefill=0.5),
        _rec("hf-pld", 10, 1.0, forwards=5),
        _rec("spec", 10, 0.75, 400, "spec", prefill=0.5),
        _rec("spec", 10, 0.75, 400, "spec"),
    ]
    rows = {
        r["method"]: r for r in roofline(recs, bandwidth=1000.0, full_forward_bytes=100)["rows"]
    }
    for m in ("hf-pld", "spec"):
        assert rows[m]["decode_tokens_per_s"] is None and rows[m]["of_limit"] is None
        assert rows[m]["decode_vs_vanilla"] is None and rows[m]["tokens_per_s"] > 0
    table = "\n".join(
        markdown({"roofline": roofline(recs[:2], bandwidth=1000.0, full_forward_bytes=100)})
    )
    assert "| hf-pld | 0.000 | 20.0 | – | – | 2.00× | – |" in table
    assert roofline(recs[1:2], bandwidth=1.0, full_forward_bytes=1)["prefill_share"] is None


def test_plugin_records_without_byte_counts_are_left_out():
    roof = roofline([_rec("old", 10, 1.0, None, "old")], bandwidth=1.0, full_forward_bytes=1)
    assert roof["rows"] == []


def test_the_bandwidth_is_a_positive_rate(selfspec_device):
    assert read_bandwidth(nbytes=1 << 22, repeats=2, device=selfspec_device) > 0


def test_every_streaming_read_gives_a_rate_on_every_device(selfspec_device):
    rates = read_bandwidths(nbytes=1 << 22, repeats=2, device=selfspec_device)
    assert set(rates) == {"sum", "mv"} and all(r > 0 for r in rates.values())


@pytest.mark.parametrize("rates", [{"sum": 2e9, "mv": 3e9}, {"sum": 3e9, "mv": 2e9}])
def test_the_limit_is_the_fastest_streaming_read(monkeypatch, rates):
    """A product kernel that reads faster than a sum raises the limit (the limit is never one
    that a kernel beats), in either order."""
    from selfspec.app._bench import roofline as rl

    monkeypatch.setattr(rl, "read_bandwidths", lambda *a, **k: dict(rates))
    assert rl.read_bandwidth() == 3e9


def test_the_limit_reads_the_bandwidth_of_the_memory_the_model_lives_on(monkeypatch):
    """The limit's bandwidth is measured on the model's device (a GPU's memory for a CUDA
    model, never the host's), recorded in the roofline and named in its table."""
    from selfspec.app._bench import roofline as rl

    asked: list[torch.device] = []
    monkeypatch.setattr(
        rl, "read_bandwidth", lambda device="cpu", **_: asked.append(torch.device(device)) or 1e9
    )
    model = _model().to("meta")
    model.lm_head.to_empty(device="cpu")  # the first weight off the meta device decides
    assert rl.model_device(model) == torch.device("cpu")
    summary = {"machine": {}}
    rl.add_limits(summary, [_rec("vanilla", 4, 1.0, 400, "vanilla")], _model())
    assert asked == [torch.device("cpu")] and summary["roofline"]["device"] == "cpu"
    assert "of the cpu's memory" in "\n".join(markdown(summary))


def test_hf_stopping_at_its_own_eos_is_not_a_divergence():
    assert same_output([1, 2, 3, 9, 9], [1, 2, 3], max_new_tokens=5)
    assert not same_output([1, 2, 4, 9, 9], [1, 2, 3], max_new_tokens=5)
    # the host stopped early: not the same
    assert not same_output([1, 2], [1, 2, 3], max_new_tokens=5)
    assert same_output([1, 2, 3], [1, 2, 3], max_new_tokens=3)


def test_hf_generate_times_its_prefill_and_a_peer_leaves_it_unknown():
    """Plain HF greedy's prefill is its first forward (which gives the first new token); a
    peer's first forward also verifies drafts, so its prefill stays unknown."""
    from selfspec.app._bench import harness

    model = _model()
    run = harness.make_runner(harness.Method("hf", "hf"), model)([1, 2, 3, 4, 5, 6], 6, set())
    assert 0 < run.prefill_s < run.wall_time and run.prefill_new_tokens == 1
    pld = harness.make_runner(
        harness.Method("hf-pld", "hf-pld", extra={"prompt_lookup_num_tokens": 3}), model
    )
    run = pld([1, 2, 3, 1, 2, 3], 6, set())
    assert run.prefill_s is None and run.prefill_new_tokens == 0
