"""The kit's composed suite: pairs of the shipped plugins and the authoring template, proven
lossless as compositions (one merged draft, one verifying pass), and a lossy member caught
with the blame on that member.

a) Each suite draws only the composition's own options and the member options it names; the
   members' own suites explore the rest. Few drawn examples per architecture (the fixed reach
   examples run regardless) keep the CI time bounded.
b) The lossy member is composed with a correct one (``lookup``); the suite must fail, and the
   error must name the member and the hook it broke, not the composition.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import strategies as st

from selfspec._engine.contract.plugins import PluginError, load_file
from selfspec.testing import ComposedSuite, LosslessError
from selfspec.testing._composed import COMPOSED_MUTANTS
from selfspec.testing._scenarios import LONGEST_NEW
from selfspec.testing.pytest_plugin import CI_PROFILE

TEMPLATE = Path(__file__).resolve().parents[1] / "plugins" / "_template" / "selfspec_mymethod.py"


class TestLookupSelfSD(ComposedSuite):
    plugin = "lookup+selfsd"
    examples_per_arch = 1  # see a)
    option_strategies = {
        "lookup.num_draft": st.integers(1, 12),
        "selfsd.num_draft": st.integers(1, 8),
        "selfsd.gamma": st.sampled_from([0.0, 0.6, 1.0]),
        "selfsd.tree": st.booleans(),
        "budget": st.sampled_from(["auto", "1", "4"]),
    }
    reach_options = {
        "lookup.num_draft": 12,
        "selfsd.skip_attn": "none",
        "selfsd.skip_mlp": "2",
        "selfsd.gamma": 0.0,
        "selfsd.adaptive": False,
        "selfsd.num_draft": 8,
    }


class TestSelfDraftClasp(ComposedSuite):
    plugin = "selfdraft+clasp"
    examples_per_arch = 1  # see a)
    # see a): building the default corpus cache takes minutes
    fixed_options = {"selfdraft.corpus": "off"}
    option_strategies = {
        "clasp.num_draft": st.integers(1, 8),
        "clasp.LOI": st.integers(1, 4),
        "selfdraft.max_candidates": st.integers(0, 4),
    }
    reach_options = {
        "clasp.DET": 0.0,
        "clasp.num_draft": 8,
        "selfdraft.corpus": "off",
        "selfdraft.context": False,
        "selfdraft.branch_len": 1,
        "selfdraft.history_len": 16,
        "selfdraft.history_halving": False,
    }


class TestTemplateHispecFractal(ComposedSuite):
    plugin = "mymethod+hispec+fractal"
    plugin_object = {"mymethod": load_file(TEMPLATE)[1]}
    examples_per_arch = 1  # see a)
    option_strategies = {
        "mymethod.num_draft": st.integers(0, 6),
        "hispec.num_draft": st.integers(1, 6),
    }
    reach_options = {"mymethod.num_draft": 6, "hispec.num_draft": 6}


@pytest.mark.parametrize("mutant", COMPOSED_MUTANTS, ids=lambda m: m.__name__)
def test_a_lossy_member_is_caught_and_blamed(mutant, tiny_model_factory):
    class Suite(ComposedSuite):  # see b)
        plugin = "lookup+lossy"
        plugin_object = {"lossy": mutant}
        hypothesis_profile = CI_PROFILE
        shrink = False

    Suite.coverage().__init__(Suite.suite_name())
    suite = Suite()
    with pytest.raises((LosslessError, PluginError)) as info:
        for arch in Suite.archs:
            suite.test_lossless(arch, "cpu", tiny_model_factory)
    assert getattr(info.value, "plugin", None) == "lossy", str(info.value)
    assert mutant.hook in str(info.value)
    assert f"at step {mutant.fault_step}" in str(info.value)


def test_the_longest_reach_example_bounds_the_merged_draft_and_runs_256_steps(tiny_model_factory):
    seen = []

    class Suite(TestTemplateHispecFractal):
        hypothesis_profile = CI_PROFILE
        examples_per_arch = 1

        def check_example(self, model, scenario, options, cov):
            seen.append((scenario, options))

    # the arch of the 520-token reach example
    Suite().test_lossless("mistral", "cpu", tiny_model_factory)
    longest = [(sc, o) for sc, o in seen if sc.max_new_tokens == LONGEST_NEW]
    assert len(longest) == 1 and longest[0][1] == {**Suite.reach_options, "budget": "1"}
    assert all(o.get("budget") != "1" for sc, o in seen if sc.max_new_tokens != LONGEST_NEW)

    from selfspec import Decoder

    sc, options = longest[0]
    model = tiny_model_factory("mistral")
    result = Decoder(model, Suite.plugin, options, plugin_object=Suite.plugin_object).generate(
        list(sc.prompt), LONGEST_NEW
    )
    assert len(result.output_ids) == LONGEST_NEW and result.stats.steps >= 260
