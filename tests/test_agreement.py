"""The agreement gate of ``draft_weights="auto"``
(:mod:`selfspec._engine.drafting.draftweights.agreement`): a 4-bit copy measured fastest runs only
when its rate by the rule (agreement for acceptance, measured seconds for cost) is at least the
fallback's; the rule's arithmetic; agreement measured on the model's own text (the model's own
weights agree at every position, the text is deterministic); the verdict kept per weights and read
back; the choice and its reason recorded. No timing is asserted: the timings are injected."""

from __future__ import annotations

import pytest
import torch

from selfspec import Runner, draft_weights
from selfspec._engine.drafting.draftweights import agreement, shadow
from selfspec._engine.tuning import calibration
from selfspec._engine.tuning.artefacts import ArtefactStore
from selfspec.testing import tiny_model

SECONDS = {"int8": {1: 0.060, 4: 0.060}, "none": {1: 0.200, 4: 0.300}, "int4": {1: 0.036, 4: 0.048}}


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    monkeypatch.setattr(calibration, "_MEMO", {})
    monkeypatch.setattr(agreement, "_MEMO", {})
    monkeypatch.setattr(calibration, "STORE", ArtefactStore("calibration", root=tmp_path))
    monkeypatch.delenv(calibration.ENV, raising=False)


def _speed_says(monkeypatch, chosen: str, seconds=SECONDS) -> None:
    """``auto``'s timing picks ``chosen`` with ``seconds``, whatever the candidates."""

    def fake_choose(runner, static, candidates):
        return calibration.Choice("draft_weights", chosen, "measured", seconds, "k")

    monkeypatch.setattr(shadow, "choose_draft_weights", fake_choose)


def _agree(values: dict[str, float]):
    calls = []

    def measure(runner, backends):
        calls.append(tuple(backends))
        return {b: values[b] for b in backends}

    measure.calls = calls
    return measure


def test_rate_is_the_best_chain_length_of_committed_tokens_per_second():
    a, c, v = 0.9, 0.05, 0.2
    by_k = [(1 - a ** (k + 1)) / (1 - a) / (k * c + v) for k in range(1, agreement.DEPTH + 1)]
    assert agreement.rate(a, c, v) == pytest.approx(max(by_k))
    # nothing accepted: one token a pass
    assert agreement.rate(0.0, c, v) == pytest.approx(1 / (c + v))
    assert agreement.rate(1.0, c, v) == pytest.approx(
        max((k + 1) / (k * c + v) for k in range(1, 9)), rel=1e-6
    )
    assert agreement.rate(0.95, c, v) > agreement.rate(0.90, c, v)  # more agreement, more tokens
    assert agreement.rate(0.9, 0.04, v) > agreement.rate(0.9, c, v)  # cheaper drafts, more tokens


@pytest.mark.parametrize(
    ("gated", "fallback", "admitted"), [(0.95, 0.97, True), (0.80, 0.97, False)]
)
def test_a_4bit_winner_runs_only_when_its_rate_beats_the_fallbacks(
    monkeypatch, gated, fallback, admitted
):
    _speed_says(monkeypatch, "int4")
    measure = _agree({"int4": gated, "int8": fallback})
    runner = Runner(tiny_model("llama", dtype=torch.float32), weight_layout="model")
    chosen = shadow.measured_backend(runner, measure_agreement=measure)
    assert chosen == ("int4" if admitted else "int8")
    assert measure.calls == [("int4", "int8")]  # against the fastest ungated copy
    how = runner.choices["draft_weights"].how
    assert ("admitted" if admitted else "refused") in how and f"{gated:.3f}" in how
    assert runner.choices["draft_weights"].seconds == SECONDS  # the timings that chose it are kept


def test_the_fallback_is_the_fastest_ungated_copy(monkeypatch):
    seconds = {**SECONDS, "int8-intmm": {1: 0.040, 4: 0.050}}
    _speed_says(monkeypatch, "int4", seconds)
    measure = _agree({"int4": 0.5, "int8-intmm": 0.97})
    runner = Runner(tiny_model("llama", dtype=torch.float32), weight_layout="model")
    assert shadow.measured_backend(runner, measure_agreement=measure) == "int8-intmm"
    assert measure.calls == [("int4", "int8-intmm")]


def test_an_ungated_winner_is_not_gated(monkeypatch):
    _speed_says(monkeypatch, "int8")
    measure = _agree({})
    runner = Runner(tiny_model("llama", dtype=torch.float32), weight_layout="model")
    assert shadow.measured_backend(runner, measure_agreement=measure) == "int8"
    assert measure.calls == []


def test_the_models_own_weights_agree_at_every_position_of_a_deterministic_own_text():
    runner = Runner(tiny_model("llama"), weight_layout="model")  # float64: exact
    measure = shadow.agreement_measure(runner)
    first = measure(runner, ("int8", "none"), tokens=24, positions=16)
    assert first["none"] == 1.0
    assert 0.0 <= first["int8"] <= 1.0 and first["int8"] * 16 == round(first["int8"] * 16)
    text = agreement._own_text(runner, draft_weights(runner, "none"), 24)
    assert text.shape == (24,) and torch.equal(
        text, agreement._own_text(runner, draft_weights(runner, "none"), 24)
    )
    assert len(set(text.tolist())) > 3  # sampled, not one token repeated
    with pytest.raises(ValueError, match="positions"):
        measure(runner, ("none",), tokens=8, positions=8)


def test_the_measured_agreement_is_kept_per_weights_and_read_back(monkeypatch):
    monkeypatch.setattr(agreement, "TOKENS", 20)
    monkeypatch.setattr(agreement, "POSITIONS", 12)
    costs = {"int8": 0.05, "none": 0.2}
    runner = Runner(tiny_model("llama"), weight_layout="model")
    first = agreement.gate(
        runner, "int8", "none", costs, 0.2, measure=shadow.agreement_measure(runner)
    )
    assert first.how == "measured" and first.agreement["none"] == 1.0 and first.positions == 12
    monkeypatch.setattr(agreement, "_MEMO", {})  # a new process: the store
    again = agreement.gate(
        runner, "int8", "none", {"int8": 0.001, "none": 0.2}, 0.2, measure=_agree({})
    )
    assert again.how == "cached" and again.agreement == first.agreement
    assert again.rate["int8"] > first.rate["int8"]  # the rule is applied to today's timings
    listed = agreement.cached_agreements()  # what `specdec plugins` lists
    label = f"llama {len(runner.layers)}x{runner.embedding.weight.shape[1]}"
    assert listed == [f"{label}: int8 {first.agreement['int8']:.3f}, none 1.000 (12 positions)"]
    # the same shape, other weights
    other = Runner(tiny_model("llama", seed=1), weight_layout="model")
    assert (
        agreement.gate(
            other, "int8", "none", costs, 0.2, measure=_agree({"int8": 1.0, "none": 1.0})
        ).how
        == "measured"
    )


def test_the_verdict_note_names_both_copies_and_the_outcome():
    v = agreement.Verdict(
        "int4", "int8", True, {"int4": 0.948, "int8": 0.979}, {"int4": 11.4, "int8": 10.8}, 96
    )
    assert v.note() == (
        "int4 agrees 0.948 with the model, int8 0.979 (96 positions, measured; "
        "11.4 against 10.8 tokens/s by the rule): admitted"
    )


def test_the_weights_digest_names_the_weights_not_their_layout():
    a = agreement._weights_digest(
        Runner(tiny_model("llama", dtype=torch.float32), weight_layout="model")
    )
    b = agreement._weights_digest(
        Runner(tiny_model("llama", dtype=torch.float32), weight_layout="transposed")
    )
    c = agreement._weights_digest(
        Runner(tiny_model("llama", dtype=torch.float32, seed=1), weight_layout="model")
    )
    assert a == b != c


def test_measuring_keeps_only_the_gated_copy_it_built_and_every_copy_built_before():
    runner = Runner(tiny_model("llama", dtype=torch.float32), weight_layout="model")
    backends = lambda: {k[0] for k in shadow._LAYERS.get(runner.model, {})}  # noqa: E731
    shadow.agreement_measure(runner)(runner, ("int8-weights", "int8"), tokens=12, positions=8)
    # the fallback's copy, built for the measurement, is freed
    assert backends() == {"int8-weights"}
    kept = draft_weights(runner, "int8")
    shadow.agreement_measure(runner)(runner, ("int8-weights", "int8"), tokens=12, positions=8)
    assert (
        backends() == {"int8-weights", "int8"}
        and draft_weights(runner, "int8").layers is kept.layers
    )
