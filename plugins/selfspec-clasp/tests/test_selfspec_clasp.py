"""selfspec-clasp: installed, lossless under the kit, drafting, the search schedule."""

import pytest
from hypothesis import strategies as st
from selfspec_clasp import CLaSp
from selfspec_clasp.search import initial_skip

import selfspec
from selfspec import Decoder, PluginError
from selfspec.testing import PluginSuite, assert_lossless, tiny_model
from selfspec.testing import strategies as sst


class TestCLaSp(PluginSuite):
    """The kit's standard suite: installed, valid options, lossless (with coverage)."""

    plugin = "clasp"
    option_strategies = {
        "LOI": st.integers(1, 4),
        "DET": st.sampled_from([0.0, 0.2, 0.5, 0.7, 0.95]) | st.floats(0.0, 1.0),
        "num_draft": st.integers(1, 8),
        "backoff": st.sampled_from([0, 1, 4]),
        # tree drafts: auto from the cost curve, or N
        "tree_budget": st.sampled_from(["auto", "1", "3", "8"]),
        "tree_topk": st.integers(1, 4),
        # those that run on m's device
        "draft_weights": lambda m: sst.draft_weights(
            m, ("auto", "none", "int8", "int8-weights", "bf16", "bnb-int8")
        ),
        "draft_vocab": st.sampled_from((0, 16, 48, 1 << 20)),
    }
    # no exit threshold and a fresh layer set every step: deep chain drafts every step (a tree's
    # depth follows its cost curve; trees are drawn by the property test)
    reach_options = {
        "M": 1,
        "LOI": 1,
        "DET": 0.0,
        "num_draft": 8,
        "draft_weights": "none",
        "tree": False,
    }

    def options_strategy(self, model, declared):
        # a) M ranges over every size the model allows, from no layer skipped to all of them
        m = st.integers(0, model.config.num_hidden_layers)
        return st.tuples(super().options_strategy(model, declared), m).map(
            lambda t: {**t[0], "M": t[1]}
        )


def test_drafts_on_every_architecture():
    # b) with no exit threshold every step drafts, the layer set changes between steps
    # (LOI=1), and the output is still exactly greedy's: a plugin that never drafts fails
    for arch in ("llama", "gemma3"):  # the property test covers every architecture
        model = tiny_model(arch)
        result = assert_lossless(
            model, "clasp", [5, 9, 17, 3, 5, 9], 24, {"M": 1, "LOI": 1, "DET": 0.0, "num_draft": 4}
        )
        assert result.stats.drafted > 0
        assert result.stats.phase_s["layer_search"] > 0


class _CaptureSpy:
    """Records, per step, whether the verifier was asked for hidden states."""

    def __init__(self) -> None:
        self.captured: list[bool] = []

    @selfspec.hookimpl(wrapper=True)
    def selfspec_verify(self, state):
        self.captured.append(state.capture_layers is not None)
        return (yield)


@pytest.mark.parametrize("loi", [1, 3, 5])
def test_search_runs_every_loi_steps(loi):
    model = tiny_model("llama", num_hidden_layers=4)
    dec = Decoder(model, "clasp", {"M": 2, "LOI": loi, "DET": 0.0, "num_draft": 2})
    spy = _CaptureSpy()
    dec.pm.register(spy)
    result = dec.generate([1, 2, 3, 4], max_new_tokens=30)
    steps = result.stats.steps
    # c) states are captured on steps 0, LOI, 2*LOI, ... and only there; the search follows
    # each of them except after the last step (nothing is drafted after it)
    assert spy.captured == [s % loi == 0 for s in range(steps)]
    assert dec.plugin.search_steps == [s for s in range(steps - 1) if s % loi == 0]
    assert len(dec.plugin.skip) == 2


def test_initial_skip():
    for n_layers in range(1, 33):
        for m in range(n_layers + 1):
            s = initial_skip(n_layers, m)
            assert len(s) == m == len(set(s))
            assert all(0 <= i < n_layers for i in s)
            if m <= n_layers - 2:  # the first and last layers are kept while there is room
                assert 0 not in s and n_layers - 1 not in s


def test_bad_options_are_refused():
    with pytest.raises(PluginError, match="M=9"):
        Decoder(tiny_model("llama"), "clasp", {"M": 9})


def test_default_m_is_half_the_layers():
    dec = Decoder(tiny_model("llama", num_hidden_layers=6), "clasp")
    assert isinstance(dec.plugin, CLaSp) and dec.plugin.n_skip == 3


class _AttemptSpy:
    """Records the steps at which the plugin ran its draft model."""

    def __init__(self, plugin) -> None:
        self.plugin = plugin
        self.steps: list[int] = []

    @selfspec.hookimpl(wrapper=True)
    def selfspec_propose(self, state):
        draft = yield
        if self.plugin._attempted:
            self.steps.append(state.step)
        return draft


def test_backoff_pauses_drafting_after_failures():
    # e) DET=1 makes every attempt exit at its first token, dropped without keep_exit (nothing
    # accepted), so with backoff=4 the attempts come at steps 0, 2, 5, 10, 15 (pauses 1, 2, 4, 4)
    model = tiny_model("llama", num_hidden_layers=4)
    dec = Decoder(
        model, "clasp", {"M": 2, "DET": 1.0, "backoff": 4, "keep_exit": False, "tree": False}
    )  # chain drafts
    spy = _AttemptSpy(dec.plugin)
    dec.pm.register(spy)
    result = dec.generate([1, 2, 3], max_new_tokens=20)
    assert result.stats.steps == 20
    assert spy.steps == [0, 2, 5, 10, 15]


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
@pytest.mark.parametrize("budget", ["auto", "5"])
def test_tree_drafts_are_lossless(arch, budget):
    # tree=1: the current layer set drafts a dynamic tree, verified in one tree pass by the host
    opts = {"M": 1, "LOI": 2, "tree": True, "tree_budget": budget, "tree_topk": 3, "num_draft": 5}
    model = tiny_model(arch)
    result = assert_lossless(model, "clasp", [5, 9, 17, 3, 5, 9], 20, opts)
    assert result.stats.drafted > 0
    dec = Decoder(model, "clasp", opts)
    spy = _TreeSpy()
    dec.pm.register(spy)
    dec.generate([5, 9, 17, 3, 5, 9], 12, eos_token_ids=())
    assert any(spy.trees)


class _TreeSpy:
    def __init__(self):
        self.trees = []

    @selfspec.hookimpl(wrapper=True)
    def selfspec_propose(self, state):
        draft = yield
        self.trees.append(draft.parents is not None)
        return draft
