"""The kit's reach: long examples on every architecture, closed coverage buckets,
weights that are not the plugin's to change, and blame with one step number for all hooks.

a) Each blame test uses a mutant of ``selfspec.testing._mutants`` made to fail early (a low
   threshold), so that the step it went wrong at is small and known: the mutant records it
   (``fault_step``) and the audit's message must name that step and the hook.
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings

import selfspec
from selfspec import Decoder
from selfspec._engine.contract.audit import AuditError, LosslessError, WeightGuard
from selfspec._engine.contract.plugins import PluginError
from selfspec._engine.contract.reference import reference_generate
from selfspec.testing import ARCHS, assert_lossless
from selfspec.testing import LosslessError as KitLosslessError
from selfspec.testing._coverage import REQUIRED, REQUIRED_PER_ARCH, Coverage, length_bucket
from selfspec.testing._lossless import greedy_reference
from selfspec.testing._mutants import (
    DropsSlotEvery130,
    Echo,
    EditsHeadInSetup,
    PolicyCorruptsKVLate,
    WrongTokenAfter200,
)
from selfspec.testing._scenarios import LONG_NEW, LONGEST_NEW, Limits, reach, scenarios

PROMPT = [1, 2] * 32


def step_named(message: str) -> int:
    return int(re.search(r"at step (\d+)", message).group(1))


# ------------------------------------------------------------------ blame and numbering, see a)
def test_a_cache_fault_is_reported_at_the_step_the_hook_ran(tiny_model_factory):
    class DropsEarly(DropsSlotEvery130):
        every = 5

    with pytest.raises(
        AuditError, match="selfspec_verify or selfspec_cache left the KV cache wrong"
    ) as err:
        Decoder(
            tiny_model_factory("llama"), "drops", plugin_object=DropsEarly, audit=True
        ).generate(PROMPT, 40)
    assert DropsEarly.fault_step == 4 and step_named(str(err.value)) == 4  # was reported as 5


def test_a_cache_fault_at_the_first_step_is_step_0(tiny_model_factory):
    class DropsFirst(DropsSlotEvery130):
        every = 1

    with pytest.raises(AuditError) as err:
        Decoder(
            tiny_model_factory("qwen3"), "drops", plugin_object=DropsFirst, audit=True
        ).generate(PROMPT, 8)
    assert DropsFirst.fault_step == 0 and step_named(str(err.value)) == 0


def test_verify_and_cache_faults_share_one_numbering(tiny_model_factory):
    class WrongAt(WrongTokenAfter200):
        at = 6

    with pytest.raises(AuditError, match="selfspec_verify is lossy") as err:
        Decoder(tiny_model_factory("mistral"), "wrong", plugin_object=WrongAt, audit=True).generate(
            [3, 9, 4], 20
        )
    assert step_named(str(err.value)) == WrongAt.fault_step  # the step the hook ran at


def test_update_policy_that_corrupts_the_kv_cache_is_named(tiny_model_factory):
    class CorruptsEarly(PolicyCorruptsKVLate):
        at = 3

    with pytest.raises(AuditError, match="selfspec_update_policy left the KV cache wrong") as err:
        Decoder(
            tiny_model_factory("gemma3"), "policy", plugin_object=CorruptsEarly, audit=True
        ).generate(PROMPT, 30)
    assert "selfspec_propose" not in str(err.value)  # what it was blamed on before
    assert step_named(str(err.value)) == CorruptsEarly.fault_step


def test_audit_error_is_a_lossless_error_and_a_plugin_error():
    assert issubclass(AuditError, LosslessError) and issubclass(AuditError, PluginError)
    assert KitLosslessError is LosslessError


# ------------------------------------------------------------------ the model is not the plugin's
def test_a_plugin_that_edits_weights_in_setup_fails_naming_the_hook(tiny_model_factory):
    model = tiny_model_factory("qwen2")
    with pytest.raises(
        LosslessError, match=r"selfspec_setup changed the model's weights: it wrote lm_head\.weight"
    ):
        assert_lossless(model, "edits", PROMPT, 4, plugin_object=EditsHeadInSetup)
    fresh = tiny_model_factory("qwen2")  # the edit does not leak into the next suite
    assert fresh is not model and torch.equal(
        fresh.lm_head.weight, selfspec.testing.tiny_model("qwen2").lm_head.weight
    )


class _EditsInVerify(Echo):
    through_data = False

    def verify(self, state, draft):
        if state.step == 2:
            w = self.runner_head.weight
            if self.through_data:
                w.data[3] *= 2  # bumps no version counter: seen by the values, at the end
            else:
                with torch.no_grad():
                    w[3] *= 2
        return super().verify(state, draft)

    @selfspec.hookimpl
    def selfspec_setup(self, runner, options):
        super().selfspec_setup(options)
        self.runner_head = runner.lm_head


def test_weights_written_during_the_decode_are_caught():
    tiny_model = selfspec.testing.tiny_model
    with pytest.raises(
        AuditError,
        match=r"selfspec_verify at step 2 changed the model's weights: it wrote "
        r"lm_head\.weight in place",
    ):
        Decoder(tiny_model("llama"), "edits", plugin_object=_EditsInVerify, audit=True).generate(
            PROMPT, 8
        )

    class ThroughData(_EditsInVerify):
        through_data = True

    with pytest.raises(
        AuditError, match=r"selfspec_end or a hook before it .* lm_head\.weight \(row 3\)"
    ):
        Decoder(tiny_model("llama"), "edits", plugin_object=ThroughData, audit=True).generate(
            PROMPT, 8
        )


def test_weight_guard_sees_replacement_and_stays_quiet_otherwise():
    model = selfspec.testing.tiny_model("llama")
    guard = WeightGuard(model)
    assert guard.exact and guard.changed() is None
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    assert guard.changed() == ("replaced the parameter lm_head.weight", False)


def test_the_factory_rebuilds_a_hooked_model(tiny_model_factory):
    model = tiny_model_factory("mistral", seed=3)
    handle = model.lm_head.register_forward_hook(lambda *a: None)
    try:
        assert tiny_model_factory("mistral", seed=3) is not model
    finally:
        handle.remove()


def test_greedy_reference_is_a_prefix_and_cut_at_eos(tiny_model_factory):
    model = tiny_model_factory("qwen3")
    long = greedy_reference(model, [5, 6, 7], 30)
    assert long == reference_generate(model, [5, 6, 7], 30)
    assert greedy_reference(model, [5, 6, 7], 12) == reference_generate(model, [5, 6, 7], 12)
    eos = long[9]
    assert greedy_reference(model, [5, 6, 7], 30, [eos]) == reference_generate(
        model, [5, 6, 7], 30, [eos]
    )


# ------------------------------------------------------------------ reach and coverage
def test_reach_crosses_long_prompts_and_outputs_on_every_architecture():
    fixed = reach()
    for arch in ARCHS:
        assert any(
            len(s.prompt) > 512 and s.max_new_tokens >= LONG_NEW > 256
            for s in fixed
            if s.arch == arch
        )
    assert max(s.max_new_tokens for s in fixed) == LONGEST_NEW > 512
    assert all(len(s.prompt) + s.max_new_tokens <= 1024 for s in fixed)


@settings(max_examples=60, deadline=None)
@given(sc=scenarios(boundaries=(600,)))
def test_drawn_scenarios_are_never_trivial_and_reach_a_boundary(sc):
    assert len(sc.prompt) > 1 or sc.max_new_tokens > 1
    assert len(sc.prompt) + sc.max_new_tokens <= 1024


def test_a_boundary_past_the_limits_extends_them_or_says_why():
    assert Limits().extended((400,)) == Limits(768, 401)
    with pytest.raises(ValueError, match=r"boundary 1100 is past what the tiny models hold"):
        Limits().extended((1100,))
    assert Limits(positions=2048).extended((1100,)).max_new == 1101


def test_length_buckets_close():
    assert [length_bucket(n) for n in (1, 9, 33, 128, 129, 256, 257, 512, 513)] == [
        "1-8",
        "9-32",
        "33-128",
        "33-128",
        "129-256",
        "129-256",
        "257-512",
        "257-512",
        ">512",
    ]


def test_the_coverage_report_counts_examples_with_accepted_drafts_like_its_bucket():
    from selfspec._engine.contract.audit import StepRecord
    from selfspec._engine.contract.types import Result, Stats

    class Accepting:
        steps = [StepRecord(600, 0, 5, 5, False, 2, (7, 8, 9))] + [
            StepRecord(603, 3 + i, 1, 1, False, 0, (9,)) for i in range(300)
        ]

    class Rejecting:
        steps = [StepRecord(10, i, 1, 1, False, 0, (9,)) for i in range(130)]

    cov = Coverage("x")
    got = set(
        cov.record("qwen2", 600, Result([1] * 600, [7] * 303, Stats()), Accepting, window=None)
    )
    assert {
        "prompt:>512",
        "output:257-512",
        "prompt>512@qwen2",
        "output>256@qwen2",
        "steps>=256",
        "late>=200",
    } <= got
    got = set(cov.record("llama", 10, Result([1] * 10, [7] * 130, Stats()), Rejecting, window=None))
    assert "steps>=128" in got and "steps>=256" not in got and "output:129-256" in got
    assert cov.report().startswith(
        "selfspec coverage of x: 2 examples (1 with an accepted draft token)"
    )
    assert cov.counts["accepted>=1"] == cov.accepting == 1
    missing = cov.missing(["qwen2", "llama"])
    assert "prompt>512@llama" in missing and "prompt>512@qwen2" not in missing
    assert set(missing) >= {"prompt:129-256", "window-edge"} and "steps>=256" not in missing
    assert len(REQUIRED) == 13 and "sampled" in REQUIRED and len(REQUIRED_PER_ARCH) == 3
