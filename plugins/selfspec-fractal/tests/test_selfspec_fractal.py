"""selfspec-fractal: installed, lossless under the kit, and the mechanics of the draft pass."""

import pytest
import torch
from hypothesis import strategies as st
from selfspec_fractal.draft import draft_pass, evenly_spaced

from selfspec import Decoder, OptionError, PluginError, Runner, draft_weights
from selfspec.testing import ARCHS, PluginSuite, assert_lossless, tiny_model
from selfspec.testing import strategies as sst

BACKENDS = ("auto", "int8", "int8-weights", "bf16", "none", "bnb-int8")  # drawn where they run


class TestFractal(PluginSuite):
    """The kit's standard suite: installed, valid options, lossless (with coverage)."""

    plugin = "fractal"
    option_strategies = {
        "w": st.integers(0, 4),
        "draft_weights": lambda m: sst.draft_weights(m, BACKENDS),
        "draft_vocab": st.sampled_from((0, 16, 48)),
        "kv": st.sampled_from(("shared", "none")),
    }
    # see b): drafts accepted, deep windows
    reach_options = {"draft_weights": "none", "n": 2, "w": 4}
    # the reach drafts take the kit's 520-token output in under 128 steps; with no fractal layer
    # a step drafts nothing and commits the verification's one token: 520 steps (steps>=256)
    long_options = {"n": 0, "w": 0}

    def options_strategy(self, model, declared):
        # a) positions are any non-empty subset of the layers, or the default spacing for a random n
        L = model.config.num_hidden_layers
        layers = st.one_of(
            st.sets(st.integers(0, L - 1), min_size=1, max_size=L).map(
                lambda p: {"positions": ",".join(map(str, sorted(p)))}
            ),
            st.integers(0, L).map(lambda n: {"n": n}),
        )
        rest = super().options_strategy(
            model, {k: v for k, v in declared.items() if k not in ("n", "positions")}
        )
        return st.tuples(rest, layers).map(lambda t: {**t[0], **t[1]})


@pytest.mark.parametrize("arch", ["llama", "gemma3"])  # the property test covers every architecture
def test_it_drafts_and_some_drafts_are_accepted(arch):
    # b) with no compression the first draft token is the model's own next token, so every
    # verification accepts at least one token: a plugin that never drafts cannot pass
    result = assert_lossless(
        tiny_model(arch), "fractal", [3, 4, 5, 6, 7], 24, {"draft_weights": "none", "n": 2, "w": 2}
    )
    assert result.stats.drafted > 0
    # see b); the last step may be budget-cut
    assert result.stats.accepted >= result.stats.steps - 1


def _prefilled(arch="llama", prompt=(3, 9, 4, 1, 7, 2)):
    model = tiny_model(arch)
    runner = Runner(model)
    committed = torch.tensor(prompt)
    cache = runner.new_cache(64)
    runner.forward(committed[:-1], cache=cache, start=0, logits=None)
    return model, runner, committed, cache


@pytest.mark.parametrize("n,w", [(1, 0), (2, 3), (3, 1), (0, 2), (4, 4)])
@pytest.mark.parametrize("kv", ["shared", "none"])
def test_one_pass_drafts_w_plus_n_plus_1_tokens(n, w, kv):
    model, runner, committed, cache = _prefilled()
    cm = draft_weights(runner, "int8-weights")
    positions = (
        evenly_spaced(runner.n_layers, n) if n <= runner.n_layers else list(range(runner.n_layers))
    )
    tokens = draft_pass(runner, cm, cache, committed, positions[:n], w, kv)
    assert tokens.shape == (w + len(positions[:n]) + 1,)
    assert tokens.dtype == torch.long


def test_the_plugin_proposes_w_plus_n_plus_1_tokens():
    model = tiny_model("llama")
    dec = Decoder(model, "fractal", {"n": 2, "w": 3})
    seen = []
    original = dec.plugin.selfspec_propose

    def spy(state):
        draft = original(state)
        seen.append(len(draft))
        return draft

    dec.plugin.selfspec_propose = spy
    dec.pm.unregister(dec.plugin)
    dec.pm.register(dec.plugin)
    dec.generate([1, 2, 3], 40)
    assert seen and seen[0] == 3 + 2 + 1  # before the host's budget cut


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kv", ["shared", "none"])
def test_merge_keeps_the_prefix_rows(arch, kv):
    # c) the prefix rows entering every fractal layer are exactly those of a plain forward of
    # the committed tokens (causal attention: drafts after them cannot change them), and the
    # merge passes them through bit for bit; only the draft rows are replaced
    model, runner, committed, cache = _prefilled(arch)
    cm = draft_weights(runner, "int8")
    L = runner.n_layers
    positions = list(range(L))
    plain = runner.forward(committed, capture=range(L + 1), logits=None).captured  # {layer: [T, H]}
    r = 1 if kv == "shared" else len(committed)
    calls = []

    def on_merge(f, before, after):
        calls.append(f)
        assert torch.equal(after[:, :r], before[:, :r])  # see c)
        assert after.shape[1] == before.shape[1] + 1  # one more draft row per fractal layer
        torch.testing.assert_close(before[0, :r], plain[f][-r:], rtol=1e-9, atol=1e-9)  # see c)

    draft_pass(runner, cm, cache, committed, positions, 2, kv, on_merge=on_merge)
    assert calls == positions


@pytest.mark.parametrize("arch", ARCHS)
def test_the_draft_pass_leaves_the_committed_slots_alone(arch):
    # d) the proposer may write slots from state.length - 1 on (verification overwrites them);
    # the slots of the committed prefix before the pending token must not change
    model, runner, committed, cache = _prefilled(arch)
    T = len(committed)
    before = [
        (k[:, :, : T - 1].clone(), v[:, :, : T - 1].clone())
        for k, v in zip(cache.keys, cache.values)
    ]
    pos = cache.pos[: T - 1].clone()
    cm = draft_weights(runner, "int8")
    draft_pass(runner, cm, cache, committed, evenly_spaced(runner.n_layers, 2), 3, "shared")
    for (k0, v0), k, v in zip(before, cache.keys, cache.values):
        assert torch.equal(k[:, :, : T - 1], k0) and torch.equal(v[:, :, : T - 1], v0)  # see d)
    assert torch.equal(cache.pos[: T - 1], pos)


def test_the_original_model_is_never_modified():
    model = tiny_model("qwen2", dtype=torch.float32)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    Decoder(model, "fractal", {"draft_weights": "int8", "draft_vocab": 40}).generate([1, 2, 3], 8)
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k


def test_evenly_spaced_follows_the_paper():
    assert evenly_spaced(28, 7) == [3, 7, 11, 15, 19, 23, 27]  # every 4th layer, as in Appendix A
    assert evenly_spaced(30, 7) == [3, 7, 11, 15, 19, 23, 27]
    assert evenly_spaced(3, 0) == []


@pytest.mark.parametrize(
    "opts, message",
    [
        ({"positions": "0,9"}, "'positions'.*outside"),
        ({"positions": "1,1"}, "listed twice"),
        ({"positions": "0,1", "n": 3}, "n=3"),
        ({"positions": "a"}, "not a layer"),
        ({"n": 9}, "only 3 layers"),
        ({"draft_weights": "int8native"}, "not one of"),
    ],
)
def test_bad_options_are_refused(opts, message):
    # malformed layer lists fail when the options are parsed, the rest at setup
    with pytest.raises((PluginError, OptionError), match=message):
        Decoder(tiny_model("llama"), "fractal", opts)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bitsandbytes LLM.int8 needs CUDA")
def test_bitsandbytes_on_cuda():
    pytest.importorskip("bitsandbytes")
    model = tiny_model("llama", dtype=torch.float16, device="cuda")
    result = assert_lossless(
        model,
        "fractal",
        [3, 4, 5, 6, 7],
        24,
        {"draft_weights": "bnb-int8", "n": 2, "w": 2},
        tolerance=0.05,
    )
    assert result.stats.drafted > 0
    assert draft_weights(Runner(model), "bnb-int8").nbytes > 0


def test_defaults_are_the_cpu_sweeps_best():
    # n = 4 fractal layers (at most the model's depth) evenly spaced, no placeholder window
    dec = Decoder(tiny_model("llama", num_hidden_layers=8), "fractal")
    assert dec.plugin.positions == evenly_spaced(8, 4) == [1, 3, 5, 7] and dec.plugin.w == 0
    dec = Decoder(tiny_model("llama", num_hidden_layers=2), "fractal")
    assert dec.plugin.positions == [0, 1]
    dec = Decoder(tiny_model("llama", num_hidden_layers=1), "fractal")
    assert dec.plugin.positions == [0]
    # the paper's setting stays one option away: n = L/4 = 1 here, w = n
    dec = Decoder(tiny_model("llama", num_hidden_layers=4), "fractal", {"n": 1, "w": 1})
    assert dec.plugin.positions == evenly_spaced(4, 1) and dec.plugin.w == 1


@pytest.mark.parametrize("budget", [1, 2, 3, 5, 9])
def test_drafts_stay_within_the_depth_the_host_keeps(budget):
    # a pass drafts w + n + 1 tokens: near the budget's end the window shrinks first, then the
    # fractal layers, so no draft is cut by the host and no row runs past the prompt plus the
    # budget, even where that is the model's last position
    L, positions = 8, 24
    model = tiny_model("llama", num_hidden_layers=L, max_position_embeddings=positions)
    prompt = [3 + i % 50 for i in range(positions - budget)]
    result = assert_lossless(
        model, "fractal", prompt, budget, {"n": 4, "w": 2, "draft_weights": "none"}
    )
    assert result.stats.truncated_drafts == 0
    assert len(result.output_ids) == budget
    if budget >= 3:  # room for a draft with a fractal layer: the early drafts are accepted
        assert result.stats.accepted > 0
