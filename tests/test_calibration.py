"""Measured choices (``weight_layout="auto"``, ``draft_weights="auto"``): the decision from
injected timings in both orders of preference, the fallback to the static rule when the
measurement cannot tell, the cache (and a busy machine's measurement taken again once it is
quiet), explicit choices never overridden, and a real measurement
on a tiny model that lands in the decode's stats. No timing is asserted."""

from __future__ import annotations

import json

import pytest
import torch

from selfspec._engine.drafting.draftweights import choice as draft_choice
from selfspec._engine.drafting.draftweights.choice import choose_draft_weights
from selfspec._engine.runner import layout_choice
from selfspec._engine.runner import runner as runner_module
from selfspec._engine.runner.formats import candidates
from selfspec._engine.runner.layout import packing_unsupported
from selfspec._engine.runner.layout_choice import choose_one_row_width, choose_weight_layout
from selfspec._engine.tuning import calibration
from selfspec._engine.tuning.artefacts import ArtefactStore
from selfspec._engine.tuning.calibration import Choice, decide
from selfspec._engine.tuning.machine import cpu_capability

CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)
PACKS = packing_unsupported("cpu", torch.float32, cpu_capability()) is None


def _model(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(LlamaConfig(**CONFIG)).to(dtype).eval()


def _fake(seconds: dict[str, float], jitter: float = 0.0):
    """A measuring function that reports ``seconds[c]`` (times the width) for candidate ``c``,
    each round ``jitter`` apart, and checks it was given runnable candidates."""

    def measure(candidates, widths):
        out = {}
        for c, run in candidates.items():
            assert callable(run)
            out[c] = {w: [seconds[c] * w * (1 + jitter * r) for r in range(5)] for w in widths}
        return out

    return measure


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    monkeypatch.setattr(calibration, "_MEMO", {})
    monkeypatch.setattr(calibration, "STORE", ArtefactStore("calibration", root=tmp_path))
    monkeypatch.delenv(calibration.ENV, raising=False)
    # a quiet machine unless a test says not
    monkeypatch.setattr(calibration, "_busy_load", lambda: None)
    # the progress lines in full (one headline by default)
    monkeypatch.setenv("SELFSPEC_VERBOSE", "1")


@pytest.mark.parametrize("faster", ["model", "packed"])
def test_the_layout_measured_fastest_is_chosen_in_either_order(faster):
    model = _model()
    from selfspec._engine.runner.adapters import adapter_for

    ad = adapter_for(model)
    slower = "packed" if faster == "model" else "model"
    choice = choose_weight_layout(
        model,
        list(ad.layers),
        ad.lm_head,
        static="packed",
        candidates=[slower, faster],
        measure=_fake({faster: 1.0, slower: 2.0}),
    )
    assert choice.chosen == faster and choice.how == "measured"
    assert (
        set(choice.seconds) == {"model", "packed"}
        and choice.seconds[faster][1] < choice.seconds[slower][1]
    )


@pytest.mark.parametrize("faster", ["int8", "none"])
def test_the_draft_weights_measured_fastest_are_chosen_in_either_order(faster):
    from selfspec._engine.runner import Runner

    runner = Runner(_model(), weight_layout="model")
    slower = "none" if faster == "int8" else "int8"
    choice = choose_draft_weights(
        runner,
        static="int8",
        candidates=["int8", "none"],
        measure=_fake({faster: 1.0, slower: 3.0}),
    )
    assert choice.chosen == faster


@pytest.mark.skipif(not PACKS, reason="oneDNN cannot prepack float32 here")
@pytest.mark.parametrize("faster", ["1", "4"])
def test_the_one_token_width_measured_fastest_is_chosen_in_either_order(faster):
    from selfspec._engine.runner.adapters import adapter_for

    model = _model()
    ad = adapter_for(model)
    slower = "4" if faster == "1" else "1"
    choice = choose_one_row_width(
        model, list(ad.layers), ad.lm_head, measure=_fake({faster: 1.0, slower: 2.0})
    )
    assert (
        choice.chosen == faster and choice.how == "measured" and set(choice.seconds) == {"1", "4"}
    )
    tie = choose_one_row_width(
        model, list(ad.layers), ad.lm_head, refresh=True, measure=_fake({"1": 1.0, "4": 0.99})
    )
    assert tie.chosen == "1" and tie.how.startswith("static:")  # a tie keeps one row


@pytest.mark.skipif(not PACKS, reason="oneDNN cannot prepack float32 here")
@pytest.mark.parametrize("width", ["1", "4"])
def test_a_packed_runner_computes_one_token_products_in_the_width_chosen(monkeypatch, width):
    from selfspec._engine.runner import Runner
    from selfspec._engine.runner.layout import PackedLinear

    monkeypatch.setattr(
        runner_module,
        "choose_one_row_width",
        lambda *a, **k: Choice("one_row_width", width, "measured", {}),
    )
    r = Runner(_model(), weight_layout="packed")
    assert r.choices["one_row_width"].chosen == width
    packed = [m for layer in r._run_layers for m in layer.modules() if isinstance(m, PackedLinear)]
    assert packed and all(m.one_row_width == int(width) for m in packed)
    x = torch.randn(1, 1, packed[0].in_features)
    alone, four = packed[0](x), packed[0](torch.nn.functional.pad(x, (0, 0, 0, 3)))[:, :1]
    if width == "4":  # the row as the first of four rows, bitwise
        assert torch.equal(alone, four)
    torch.testing.assert_close(
        alone, torch.nn.functional.linear(x, packed[0].weight, packed[0].bias)
    )


def test_a_lead_within_the_measurement_spread_keeps_the_static_rule():
    # packed 5 % faster, but each candidate's rounds spread by 20 %: too close to call
    chosen, how = decide(
        {"packed": {1: 0.95}, "model": {1: 1.0}}, {"packed": 0.2, "model": 0.2}, static="model"
    )
    assert chosen == "model" and how.startswith("static:") and "spread" in how
    # the same lead on a quiet machine (1 % spread) is a measured choice
    assert decide(
        {"packed": {1: 0.90}, "model": {1: 1.0}}, {"packed": 0.01, "model": 0.01}, "model"
    ) == ("packed", "measured")


def test_a_lead_below_the_minimum_margin_is_a_tie():
    chosen, how = decide({"packed": {1: 0.99}, "model": {1: 1.0}}, {}, static="model")
    assert chosen == "model" and how.startswith("static:")


def test_the_sum_over_widths_decides():
    # faster for one token, much slower for a block: the block's loss outweighs
    secs = {"a": {1: 1.0, 8: 5.0}, "b": {1: 1.2, 8: 2.0}}
    assert decide(secs, {}, static="a")[0] == "b"


def test_calibrate_0_takes_the_static_rule_without_measuring(monkeypatch):
    monkeypatch.setenv(calibration.ENV, "0")
    model = _model()
    from selfspec._engine.runner.adapters import adapter_for

    ad = adapter_for(model)

    def boom(*_):
        raise AssertionError("measured")

    choice = choose_weight_layout(
        model,
        list(ad.layers),
        ad.lm_head,
        static="packed",
        candidates=["model", "packed"],
        measure=boom,
    )
    assert choice.chosen == "packed" and choice.how == f"static: {calibration.ENV}=0"


def test_one_candidate_is_not_measured():
    model = _model(torch.float64)
    from selfspec._engine.runner.adapters import adapter_for

    ad = adapter_for(model)
    choice = choose_weight_layout(
        model, list(ad.layers), ad.lm_head, static="model", candidates=["model"]
    )
    assert choice.chosen == "model" and choice.how.startswith("static:") and not choice.seconds


@pytest.mark.skipif(not PACKS, reason="oneDNN cannot prepack float32 here")
def test_a_real_measurement_is_saved_reused_and_reported_in_the_stats(capsys):
    from selfspec import Decoder

    model = _model()
    dec = Decoder(model, "vanilla")
    err = capsys.readouterr().err
    assert "measuring which weight layout is fastest here" in err and "weight layout" in err
    choice = dec.runner.choices["weight_layout"]
    assert choice.how == "measured" or choice.how.startswith("static:")
    assert set(choice.seconds) == set(candidates("layout", "cpu", torch.float32))
    assert all(s > 0 for ws in choice.seconds.values() for s in ws.values())
    assert dec.runner.weight_layout == choice.chosen
    saved = list(calibration.STORE.path("x").parent.glob("weight_layout-*.json"))
    assert len(saved) == 1 and json.loads(saved[0].read_text())["chosen"] == choice.chosen
    result = dec.generate([1, 2, 3, 4], 4)
    assert result.stats.as_dict()["choices"]["weight_layout"]["chosen"] == choice.chosen
    # another process (the in-process memo cleared) reads the file instead of measuring
    calibration._MEMO.clear()
    again = Decoder(model, "vanilla").runner.choices["weight_layout"]
    assert again.how.startswith("cached") and again.chosen == choice.chosen
    assert "measuring" not in capsys.readouterr().err


@pytest.mark.skipif(not PACKS, reason="oneDNN cannot prepack float32 here")
def test_a_choice_measured_on_a_busy_machine_is_kept_while_busy_and_measured_again_when_quiet(
    monkeypatch, capsys
):
    from selfspec import Decoder

    def saved() -> dict:
        (path,) = calibration.STORE.path("x").parent.glob("weight_layout-*.json")
        return json.loads(path.read_text())

    model = _model()
    monkeypatch.setattr(calibration, "_busy_load", lambda: 3.5)
    busy = Decoder(model, "vanilla").runner.choices["weight_layout"]
    assert "on a busy machine (load 3.5)" in busy.how and saved()["busy_load"] == 3.5
    calibration._MEMO.clear()  # another process, still busy: the cached choice
    assert Decoder(model, "vanilla").runner.choices["weight_layout"].how.startswith("cached")
    capsys.readouterr()
    calibration._MEMO.clear()  # another process, the machine quiet: measured again, saved as quiet
    monkeypatch.setattr(calibration, "_busy_load", lambda: None)
    quiet = Decoder(model, "vanilla").runner.choices["weight_layout"]
    err = capsys.readouterr().err
    assert (
        "was measured on a busy machine (load 3.5)" in err
        and "measuring which weight layout" in err
    )
    assert "busy" not in quiet.how and saved()["busy_load"] is None
    calibration._MEMO.clear()
    assert Decoder(model, "vanilla").runner.choices["weight_layout"].how.startswith("cached")


@pytest.mark.skipif(not PACKS, reason="packed cannot run here")
@pytest.mark.parametrize("fastest", ["packed-mkl", "transposed"])
def test_auto_measures_every_registered_layout_that_runs_here_and_picks_the_fastest(
    monkeypatch, fastest
):
    from selfspec._engine.runner import Runner

    runs = candidates("layout", "cpu", torch.float32)
    if fastest not in runs:
        pytest.skip(f"{fastest} does not run here")
    fake = _fake({c: 0.5 if c == fastest else 3.0 for c in runs})
    real = layout_choice.choose_weight_layout
    monkeypatch.setattr(
        runner_module, "choose_weight_layout", lambda *a, **k: real(*a, **k, measure=fake)
    )
    r = Runner(_model())
    choice = r.choices["weight_layout"]
    assert set(choice.seconds) == set(runs) >= {"model", "transposed", "packed"}
    assert r.weight_layout == choice.chosen == fastest


def test_an_explicit_layout_is_never_measured(capsys):
    from selfspec import Decoder

    dec = Decoder(_model(), "vanilla", weight_layout="model")
    assert dec.runner.weight_layout == "model" and "weight_layout" not in dec.runner.choices
    assert "measuring" not in capsys.readouterr().err


def test_the_note_names_every_candidate_and_width():
    c = Choice(
        "weight_layout",
        "packed",
        "measured",
        {"packed": {1: 0.02, 8: 0.03}, "model": {1: 0.04, 8: 0.05}},
    )
    assert c.note() == (
        "weight layout packed (measured: packed 20.0/30.0, model 40.0/50.0 ms at 1/8 tokens)"
    )
    assert Choice.from_dict(c.as_dict()) == c


@pytest.mark.skipif(not PACKS, reason="oneDNN cannot prepack float32 here")
def test_a_sample_of_laid_out_layers_takes_the_layers_and_scale_of_the_models_own(monkeypatch):
    # the draft-weights choice times the runner's layers against compressed copies of the
    # model's own: both samples must cover the same layers, or one is scaled wrongly
    from selfspec._engine.runner.adapters import adapter_for
    from selfspec._engine.runner.layout import layout_copy
    from selfspec._engine.runner.traffic import product_bytes

    model = _model()
    ad = adapter_for(model)
    layers = list(ad.layers)
    monkeypatch.setattr(layout_choice, "SAMPLE_BYTES", product_bytes(layers[0]) + 1)
    own = layout_choice.sample(layers, ad.lm_head)
    packed = layout_choice.sample([layout_copy(m, "packed") for m in layers], ad.lm_head)
    assert len(own[0]) == len(packed[0]) == 2 and own[2] == packed[2] == len(layers) / 2


def test_a_new_candidate_is_measured_again_not_answered_from_an_earlier_choice():
    from selfspec._engine.runner.adapters import adapter_for

    model = _model()
    ad = adapter_for(model)
    args = (model, list(ad.layers), ad.lm_head)
    first = choose_weight_layout(
        *args,
        static="model",
        candidates=["model", "transposed"],
        measure=_fake({"model": 1.0, "transposed": 2.0}),
    )
    again = choose_weight_layout(
        *args,
        static="model",
        candidates=["model", "transposed", "packed"],
        measure=_fake({"model": 1.0, "transposed": 2.0, "packed": 0.5}),
    )
    assert first.chosen == "model" and set(again.seconds) == {"model", "transposed", "packed"}
    assert again.chosen == "packed" and again.key != first.key


def test_a_cached_choice_is_read_without_sampling_the_model(monkeypatch):
    model = _model()
    from selfspec._engine.runner import Runner

    runner = Runner(model, weight_layout="model")
    first = choose_draft_weights(runner, static="int8", candidates=["int8", "none"], measure=None)
    calibration._MEMO.clear()  # another process: the file, not the memo

    def no_sampling(*_args, **_kwargs):
        raise AssertionError("a cached choice copied the model's weights to measure them")

    monkeypatch.setattr(draft_choice, "sample", no_sampling)
    again = choose_draft_weights(runner, static="int8", candidates=["int8", "none"])
    assert again.how.startswith("cached") and again.chosen == first.chosen


def test_first_use_work_says_one_line_unless_verbose(monkeypatch, capsys):
    from selfspec._engine.tuning import progress

    monkeypatch.setenv("SELFSPEC_VERBOSE", "0")
    monkeypatch.setattr(progress, "_SAID", set())
    for detail in (
        "measuring which weight layout is fastest here...",
        "weight layout packed (measured: ...)",
    ):
        progress.say(detail, headline=progress.MEASURING)
    err = capsys.readouterr().err.splitlines()
    assert err == [f"selfspec: {progress.MEASURING} (SELFSPEC_VERBOSE=1 for the details)"]
    monkeypatch.setenv("SELFSPEC_VERBOSE", "1")
    progress.say("weight layout packed (measured: ...)", headline=progress.MEASURING)
    assert capsys.readouterr().err == "selfspec: weight layout packed (measured: ...)\n"
