"""Audit mode and the coverage check: errors name the hook at fault; a suite that never
exercised what matters fails."""

from __future__ import annotations

import pytest
import torch

import selfspec
from selfspec import Decoder, Verdict
from selfspec._engine.contract.audit import AuditError
from selfspec._engine.contract.builtin.verify import verify_greedy
from selfspec._engine.contract.plugins import PluginError
from selfspec.testing import PluginSuite, assert_lossless
from selfspec.testing._coverage import REQUIRED, REQUIRED_PER_ARCH, Coverage
from selfspec.testing._mutants import Echo, StaleKVLate

PROMPT = [3, 4, 5, 3, 4, 5, 3, 4]


class UnwrittenSlots:
    """A verifier naming a KV slot past what its forward wrote (and no cache hook of its own)."""

    @selfspec.hookimpl
    def selfspec_verify(self, state, draft):
        v = verify_greedy(state, draft)
        return (
            Verdict(v.accepted, v.bonus, v.accepted_nodes, kv_slots=(len(draft) + 3,))
            if not v.accepted
            else v
        )


def test_kv_slots_never_written_are_blamed_on_the_verifier(tiny_model_factory):
    # a) before: "selfspec_cache raised CacheError", for a plugin without a cache hook
    with pytest.raises(
        PluginError, match=r"selfspec_verify returned kv_slots \[\d+\]: .* slots its forward wrote"
    ):
        Decoder(tiny_model_factory("llama"), "unwritten", plugin_object=UnwrittenSlots).generate(
            PROMPT, 4
        )


def test_audit_is_off_unless_asked(tiny_model_factory, monkeypatch):
    model = tiny_model_factory("llama")
    monkeypatch.delenv("SELFSPEC_AUDIT", raising=False)
    dec = Decoder(model, "stale", plugin_object=StaleKVLate)
    dec.generate(PROMPT, 8)
    assert dec.auditor is None
    monkeypatch.setenv("SELFSPEC_AUDIT", "1")
    dec = Decoder(model, "echo", plugin_object=Echo)
    dec.generate(PROMPT, 8)
    assert dec.auditor is not None
    assert [s.generated for s in dec.auditor.steps][:1] == [0] and dec.auditor.steps[
        -1
    ].generated < 8


def test_audit_names_the_hook_step_and_slot(tiny_model_factory):
    # b) a stale kept slot changes no token at this step: only the KV check sees it
    class StaleEarly(StaleKVLate):
        at = 0

    model = tiny_model_factory("gemma3")  # its greedy output loops: drafts get accepted
    with pytest.raises(
        AuditError, match=r"selfspec_verify or selfspec_cache left the KV cache wrong at step \d+"
    ):
        Decoder(model, "stale", plugin_object=StaleEarly, audit=True).generate([1, 2] * 32, 64)


def test_audit_passes_a_correct_custom_verifier_in_float32(tiny_model_factory):
    # c) in float32 the shadow's chain forward rounds differently from the verifier's: the KV
    # comparison has a tolerance and a different token is allowed only at a near-tie
    model = tiny_model_factory("qwen3", dtype=torch.float32)
    res = assert_lossless(model, "echo", [1, 2] * 32, 40, plugin_object=Echo)
    assert res.stats.accepted > 0


def test_coverage_buckets_of_one_example():
    from selfspec._engine.contract.audit import StepRecord
    from selfspec._engine.contract.types import Result, Stats

    class Log:
        steps = [
            StepRecord(130, 0, 5, 5, False, 2, (7, 8, 9)),
            StepRecord(133, 70, 3, 3, True, 0, (9,)),
        ]

    cov = Coverage("x")
    res = Result([1] * 130, [7] * 129 + [9], Stats())
    got = set(cov.record("llama", 130, res, Log, window=None, eos=(8,)))
    assert {
        "prompt:129-256",
        "output:129-256",
        "depth>=4",
        "accepted>=1",
        "late>=64",
        "chain",
        "tree",
        "eos-mid-draft",
        "arch:llama",
    } <= got
    assert "window-edge" not in got and "accepted>=4" not in got


class _Suite(PluginSuite):
    plugin = "echo"
    plugin_object = Echo


def test_the_coverage_check_fails_a_suite_that_missed_a_bucket():
    cov = _Suite.coverage()
    cov.__init__(_Suite.suite_name())
    suite = _Suite()
    with pytest.raises(pytest.skip.Exception):  # d) not every test_lossless ran: nothing to judge
        suite.test_lossless_coverage()
    cov.done.update(_Suite.archs)
    cov.counts.update(
        [b.format(arch=a) for a in _Suite.archs for b in REQUIRED_PER_ARCH]
        + [b for b in REQUIRED if b != "accepted>=1"]
    )
    with pytest.raises(AssertionError, match=r"never exercised \['accepted>=1'\]"):
        suite.test_lossless_coverage()
    _Suite.coverage_exempt = {"accepted>=1": "a test of the exemption"}
    try:
        suite.test_lossless_coverage()
    finally:
        _Suite.coverage_exempt = {}
