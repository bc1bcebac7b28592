"""The losslessness kit itself: it must catch a lossy plugin, and stay cheap to import."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import selfspec
from selfspec import Draft, Option, Verdict
from selfspec._engine.contract.builtin.verify import verify_greedy
from selfspec.testing import ARCHS, LosslessError, NearTieWarning, assert_lossless, tiny_model
from selfspec.testing import strategies as sst
from selfspec.testing.pytest_plugin import CI_PROFILE, DEV_PROFILE, RELEASE_PROFILE, profile_name


class Lossy:
    """Accepts every draft token without checking it: lossy whenever a draft is wrong."""

    @selfspec.hookimpl
    def selfspec_propose(self, state):
        return Draft.chain([7, 7], device=state.runner.device)

    @selfspec.hookimpl
    def selfspec_verify(self, state, draft):
        v = verify_greedy(state, Draft.chain([], device=state.runner.device))
        return Verdict(
            accepted=tuple(draft.tokens.tolist()),
            bonus=v.bonus,
            accepted_nodes=tuple(range(len(draft))),
        )

    @selfspec.hookimpl
    def selfspec_cache(self, state, verdict):
        # keep the cache consistent (re-run the accepted tokens) so only the output is wrong
        state.cache.crop(state.length - 1)
        ids = torch.tensor([state.pending, *verdict.accepted], device=state.runner.device)
        state.runner.forward(ids, cache=state.cache, start=state.length - 1, logits=None)


def test_importing_the_kit_and_its_pytest_plugin_is_cheap():
    code = (
        "import sys, selfspec.testing, selfspec.testing.pytest_plugin; "
        "print(sorted(m for m in ('torch', 'transformers', 'hypothesis') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_assert_lossless_catches_a_lossy_plugin(tiny_model_factory):
    model = tiny_model_factory("llama")
    with pytest.raises(LosslessError) as err:
        assert_lossless(model, "lossy", [1, 2, 3], 10, plugin_object=Lossy)
    # the audit stops the decode at the step that goes wrong, naming the hook and the token
    msg = str(err.value)
    assert "plugin 'lossy': selfspec_verify is lossy at step 0 (output token 0" in msg
    assert (
        "accepted draft token 0 is 7, the full model's greedy token is" in msg and "margin" in msg
    )
    assert "prompt of 3 tokens, max_new_tokens=10" in msg


def test_float64_is_exact_whatever_the_tolerance(tiny_model_factory):
    with pytest.raises(LosslessError):
        assert_lossless(
            tiny_model_factory("llama"), "lossy", [1, 2, 3], 10, plugin_object=Lossy, tolerance=1e9
        )


def test_near_tie_rule_in_float32(tiny_model_factory):
    model = tiny_model_factory("qwen3", dtype=torch.float32)
    with pytest.raises(LosslessError, match="bound 0.001"):
        assert_lossless(model, "lossy", [1, 2, 3], 10, plugin_object=Lossy)
    # a tolerance above the margin makes the same divergence a reported near-tie
    with pytest.warns(NearTieWarning, match=r"(?s)near-tie.*margin there: [0-9.e+-]+ "):
        res = assert_lossless(model, "lossy", [1, 2, 3], 10, plugin_object=Lossy, tolerance=1e9)
    assert res.near_ties == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ok = assert_lossless(model, "vanilla", [1, 2, 3], 10)
    assert ok.near_ties == 0


def test_assert_lossless_takes_a_decoder_and_eos(tiny_model_factory):
    model = tiny_model_factory("mistral")
    dec = selfspec.Decoder(model)
    ref = assert_lossless(model, dec, [4, 5, 6], 12).output_ids
    res = assert_lossless(model, dec, [4, 5, 6], 12, eos_token_ids=[ref[3]])
    assert res.output_ids == ref[: ref.index(ref[3]) + 1]
    with pytest.raises(ValueError, match="another model"):
        assert_lossless(tiny_model_factory("llama"), dec, [1], 2)


def test_tiny_models_are_deterministic_and_not_degenerate():
    from selfspec._engine.contract.reference import reference_generate

    for arch in ARCHS:
        a, b = tiny_model(arch, seed=1), tiny_model(arch, seed=1)
        for pa, pb in zip(a.parameters(), b.parameters()):
            assert torch.equal(pa, pb)
        assert a.dtype == torch.float64 and a.config.eos_token_id is None
        out = reference_generate(a, [1, 2, 3], 40)
        assert len(set(out)) >= 10, f"{arch}: greedy output repeats: {out}"
        assert a.config.num_key_value_heads < a.config.num_attention_heads  # GQA
    assert not torch.equal(
        tiny_model("llama", seed=1).lm_head.weight, tiny_model("llama", seed=2).lm_head.weight
    )
    with pytest.raises(ValueError, match="choose one of llama"):
        tiny_model("gpt2")


def test_tiny_model_factory_caches(tiny_model_factory):
    assert tiny_model_factory("llama") is tiny_model_factory("llama")
    assert tiny_model_factory("llama", seed=1) is not tiny_model_factory("llama")
    assert tiny_model_factory("gemma3", eos_token_id=5).config.eos_token_id == 5


def test_selfspec_arch_parametrizes_every_arch(request, selfspec_arch):
    assert selfspec_arch in ARCHS
    assert request.node.callspec.params["selfspec_arch"] == selfspec_arch


def test_selfspec_device_runs_on_cpu_and_cuda_when_present(tiny_model_factory, selfspec_device):
    model = tiny_model_factory("llama", device=selfspec_device)
    assert assert_lossless(model, "vanilla", [1, 2, 3], 5).stats.new_tokens == 5


def test_hypothesis_profiles(monkeypatch):
    from hypothesis import settings as hs

    ci = hs.get_profile(CI_PROFILE)
    assert ci.derandomize and ci.deadline is None and ci.max_examples <= 20
    assert hs.get_profile(DEV_PROFILE).deadline is None
    release = hs.get_profile(RELEASE_PROFILE)  # the deep one, for a release check
    assert not release.derandomize and release.deadline is None
    assert release.max_examples >= 5 * hs.get_profile(DEV_PROFILE).max_examples
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    monkeypatch.setenv("CI", "1")
    assert profile_name() == CI_PROFILE
    monkeypatch.delenv("CI")
    assert profile_name() == DEV_PROFILE
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "mine")
    assert profile_name() == "mine"


def _pytest_in(
    tmp_path,
    profile: str,
    conftest: str = "",
    *,
    uses_kit: bool = True,
    ini: str = "",
) -> subprocess.CompletedProcess:
    (tmp_path / "test_one.py").write_text(
        ("import selfspec.testing  # noqa: F401\n" if uses_kit else "")
        + "from hypothesis import given, settings, strategies as st\n"
        "@given(st.integers())\n"  # decorated at import: the profile must be loaded before
        "def test_profile(x):\n    pass\n"
        "def test_max():\n"
        "    print('MAX', test_profile._hypothesis_internal_use_settings.max_examples)\n"
    )
    (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "pytest.ini").write_text(f"[pytest]\n{ini}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**env, "HYPOTHESIS_PROFILE": profile, "CI": "1"},
    )


def test_unknown_hypothesis_profile_is_a_usage_error(tmp_path):
    # found while collecting the first file that uses the kit: pytest stops with the usage
    # error as a collection error
    run = _pytest_in(tmp_path, "no-such-profile")
    assert run.returncode == pytest.ExitCode.INTERRUPTED, run.stdout + run.stderr
    assert "UsageError: HYPOTHESIS_PROFILE='no-such-profile' names no registered" in run.stdout


def test_profile_registered_in_a_conftest_is_loaded(tmp_path):
    conftest = (
        "from hypothesis import settings\nsettings.register_profile('mine', max_examples=7)\n"
    )
    run = _pytest_in(tmp_path, "mine", conftest)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "MAX 7" in run.stdout


def test_the_pytest_plugin_is_inert_in_a_suite_that_does_not_use_the_kit(tmp_path):
    # a) another project installed beside selfspec: no profile of ours, no usage error
    # (a suite that imports the kit gets its profile: test_profile_registered_in_a_conftest_...)
    run = _pytest_in(tmp_path, "no-such-profile", uses_kit=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "MAX 100" in run.stdout  # Hypothesis's own default


def test_a_suite_can_opt_in_by_ini(tmp_path):
    run = _pytest_in(tmp_path, CI_PROFILE, uses_kit=False, ini="selfspec_kit = true")
    assert "MAX 15" in run.stdout, run.stdout + run.stderr


DECLARED = {
    "k": Option("k", int, 4, "draft length", min=1, max=12),
    "n": Option("n", int, 3, "unbounded above", min=1),
    "mode": Option("mode", str, "a", "mode", choices=("a", "b")),
    "adapt": Option("adapt", bool, False, "adapt"),
    "threshold": Option("threshold", float, 0.5, "threshold", min=0.0, max=1.0),
    "scale": Option("scale", float, None, "plugin decides"),
    "even": Option(
        "even", int, 2, "even only", check=lambda v: None if v % 2 == 0 else "must be even"
    ),
}


@settings(max_examples=40)
@given(values=sst.options(DECLARED))
def test_option_strategy_draws_valid_values(values):
    from selfspec._engine.contract.options import resolve

    assert set(values) <= set(DECLARED)
    assert resolve(DECLARED, values, "p") == {
        **{k: o.default for k, o in DECLARED.items()},
        **values,
    }
    assert values.get("n", 1) <= 3 + 8


@given(values=sst.options(DECLARED, fixed={"k": 2}))
def test_option_strategy_fixed(values):
    assert values["k"] == 2


DRAFTING = {
    "draft_weights": Option("draft_weights", str, "auto", "weights", choices=selfspec.DRAFT_WEIGHTS)
}


@settings(max_examples=30)
@given(data=st.data())
def test_an_option_strategy_may_depend_on_the_model(data):
    """A callable option strategy is called with the model; ``draft_weights`` draws only the
    backends that run on the model's device (on a CPU never a GPU-only format)."""
    model = tiny_model("llama", dtype=torch.float32)
    drawn = data.draw(
        sst.options(
            DRAFTING,
            strategies={"draft_weights": lambda m: sst.draft_weights(m, ("int8", "gpu-only"))},
            model=model,
        )
    )
    assert drawn.get("draft_weights", "int8") == "int8"


def test_draft_weights_strategy_refuses_when_nothing_runs():
    with pytest.raises(ValueError, match="runs on cpu"):
        sst.draft_weights(tiny_model("llama", dtype=torch.float32), ("gpu-only",))


@given(draft=sst.drafts(max_nodes=6), prompt=sst.prompts(min_len=2, max_len=5), n=sst.lengths(3, 9))
def test_draft_and_prompt_strategies(draft, prompt, n):
    assert isinstance(draft, Draft) and draft.tokens.dtype == torch.long and len(draft) <= 6
    assert all(0 <= t < sst.TINY_VOCAB for t in draft.tokens.tolist())
    if draft.is_tree:
        assert all(-1 <= p < i for i, p in enumerate(draft.parents.tolist()))
    assert 2 <= len(prompt) <= 5 and 3 <= n <= 9


@given(st.data())
def test_draft_kinds(data):
    assert not data.draw(sst.drafts(kind="chain")).is_tree
    assert data.draw(sst.drafts(kind="tree")).is_tree
    with pytest.raises(ValueError):
        sst.drafts(kind="dag")
