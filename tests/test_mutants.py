"""The kit's mutation score: a plugin's standard suite under ``selfspec-ci`` catches every
known-lossy plugin of :mod:`selfspec.testing._mutants`, and passes the correct control.

a) Each mutant runs exactly as a plugin author's suite does (a :class:`PluginSuite` with
   ``plugin_object=``, the ``selfspec-ci`` profile), architecture after architecture, without
   shrinking, then the suite's decodes on one instance (``test_lossless_across_decodes``, each
   decode one example), then the verifier on the kit's drafts (``test_verify_any_draft``); the
   score is the number of examples run up to the first that fails.
b) The derandomized profile makes that number exact, so docs/testing-plugins.md states it
   and this test keeps the table true.
c) A mutant that names the hook the audit must blame (``hook``) and records the step it first
   went wrong at (``fault_step``) is checked for both: the blame is right, not merely raised.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from selfspec._engine.contract.plugins import PluginError
from selfspec.testing import LosslessError, PluginSuite
from selfspec.testing._mutants import MUTANTS, Echo
from selfspec.testing.pytest_plugin import CI_PROFILE

DOC = Path(__file__).resolve().parents[1] / "docs" / "testing-plugins.md"


def run_suite(plugin_object, factory, dtype=None) -> tuple[int | None, str]:
    """Run the standard property test of ``plugin_object`` (tiny models in ``dtype``, float64
    by default); (examples to the first failure, its message), or (None, its coverage report
    and missing buckets) when every example passed."""
    calls = []

    class Suite(PluginSuite):  # see a)
        plugin = "echo"
        hypothesis_profile = CI_PROFILE
        shrink = False

        def check_example(self, *args, **kwargs):
            calls.append(1)
            return super().check_example(*args, **kwargs)

        def check_any_draft_example(self, *args, **kwargs):
            calls.append(1)
            return super().check_any_draft_example(*args, **kwargs)

    Suite.plugin_object = plugin_object
    Suite.model_dtype = dtype
    Suite.coverage().__init__(Suite.suite_name())  # fresh counters for each run
    suite = Suite()
    for arch in Suite.archs:
        try:
            suite.test_lossless(arch, "cpu", factory)
        except (LosslessError, PluginError) as exc:
            return len(calls), str(exc)
    # then the decodes on one instance (each decode counted as one example), arch after arch
    import selfspec.testing._lossless as lossless

    original = lossless.assert_lossless

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    lossless.assert_lossless = counted
    try:
        for arch in Suite.archs:
            suite.test_lossless_across_decodes(arch, "cpu", factory)
    except (LosslessError, PluginError) as exc:
        return len(calls), str(exc)
    finally:
        lossless.assert_lossless = original
    # then the verifier on the kit's drafts (each decode one example), arch after arch
    for arch in Suite.archs:
        try:
            suite.test_verify_any_draft(arch, "cpu", factory)
        except (LosslessError, PluginError) as exc:
            return len(calls), str(exc)
    cov = Suite.coverage()
    return None, f"{cov.report()}\nmissing: {cov.missing(Suite.archs)}"


def documented_score() -> dict[str, int]:
    rows = re.findall(r"^\| `(\w+)` \|[^|]*\|[^|]*\| (\d+) \|$", DOC.read_text(), re.M)
    return {name: int(n) for name, n in rows}


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.__name__)
def test_the_ci_profile_catches_every_mutant(mutant, tiny_model_factory):
    n, message = run_suite(mutant, tiny_model_factory)
    assert n is not None, f"{mutant.__name__} ({mutant.bug}; {mutant.trigger}) escaped:\n{message}"
    assert "selfspec_" in message  # the error names the hook at fault
    if mutant.hook is not None:  # see c)
        assert f"plugin 'echo': {mutant.hook} " in message, message
    if mutant.fault_step is not None:
        assert f" at step {mutant.fault_step} " in message, message
    assert documented_score().get(mutant.__name__) == n, (  # see b)
        f"{mutant.__name__} was caught after {n} examples; update the table in {DOC.name}"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "mutant", [m for m in MUTANTS if m.float64_only is None], ids=lambda m: m.__name__
)
def test_the_ci_profile_catches_every_mutant_in_bf16(mutant, tiny_model_factory):
    """c) The same suite on bf16 tiny models, where differences within the near-tie bound
    (selfspec._engine.contract.tiebound) are allowed: every mutant is still caught, at a margin
    above it or by the audit's KV check. (The number of examples may differ from float64's: not
    asserted.) A mutant whose error lies within that bound (``float64_only``, a verifier accepting
    near-ties) is a near-tie in bf16 by definition: only float64 tells it apart, and it is left out
    here."""
    n, message = run_suite(mutant, tiny_model_factory, dtype=torch.bfloat16)
    assert n is not None, (
        f"{mutant.__name__} ({mutant.bug}; {mutant.trigger}) escaped in bf16:\n{message}"
    )
    assert "selfspec_" in message


def test_the_correct_control_passes_with_full_coverage(tiny_model_factory):
    n, report = run_suite(Echo, tiny_model_factory)
    assert n is None, report
    assert "missing: []" in report  # every required bucket, the long ones of every architecture too
    for bucket in ("accepted>=1", "prompt:>512", "output:>512", "steps>=256"):
        assert bucket in report
