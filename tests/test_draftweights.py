"""The host's draft weights (``selfspec.draft_weights``) and draft vocabulary.

Set-up, and why:
a) float32 for the compressed backends, as they run on CPU: a small per-layer relative error
   and most greedy tokens kept (bounds measured on the tiny random model, whose outliers make
   dynamic int8 and 4-bit groups coarse; the real model's agreement is in
   lab/results/logs/draftweights.md).
b) float64 for the ``none`` backend: it reads the model's own weights, so its draft pass must
   equal a plain forward exactly, and its head over a vocabulary must equal those rows.
c) a draft vocabulary keeps the logits ``[.., V]`` with ``-inf`` outside it: a token outside
   can never be the argmax, so it is never drafted.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import selfspec
from selfspec import DraftWeightsError, Runner, draft_weights, skip_layer_draft
from selfspec._engine.drafting.draftweights import built_nbytes, resolve_backend, vocab
from selfspec._engine.drafting.draftweights.layers import FusedMember, FusedProduct
from selfspec._engine.runner import linears, quantize
from selfspec._engine.runner.formats import candidates
from selfspec._engine.tuning.machine import cpu_capability
from selfspec.testing import ARCHS, tiny_model

BNB = linears.bnb_module() is not None
FP16 = cpu_capability().onednn_fp16
CPU = (
    ("int8", "int8-dynamic", "int8-intmm", "int8-weights", "int4", "bf16")
    + (("bnb-int8",) if BNB else ())
    + (("fp16-weights",) if FP16 else ())
)
# see a)
BOUND = {
    "int8": 0.12,
    "int8-dynamic": 0.12,
    "int8-intmm": 0.12,
    "int8-weights": 0.03,
    "int4": 0.5,
    "fp16-weights": 0.01,
    "bf16": 0.02,
    "bnb-int8": 0.12,
    "bnb-nf4": 0.5,
}
AGREE = {
    "int8": 0.6,
    "int8-dynamic": 0.6,
    "int8-intmm": 0.6,
    "int8-weights": 0.8,
    "int4": 0.2,
    "fp16-weights": 0.9,
    "bf16": 0.8,
    "bnb-int8": 0.6,
    "bnb-nf4": 0.2,
}


def test_auto_is_int8_on_cpu_and_impossible_backends_are_refused():
    assert resolve_backend("auto", torch.device("cpu")) == "int8"
    assert resolve_backend("none", torch.device("cpu")) == "none"
    with pytest.raises(DraftWeightsError, match="CPU only"):
        resolve_backend("int8", torch.device("meta"))
    with pytest.raises(
        DraftWeightsError,
        match="unknown draft weights 'int8native'; choose one of auto, none, int8",
    ):
        resolve_backend("int8native", torch.device("cpu"))


@pytest.mark.skipif(BNB, reason="bitsandbytes is installed here")
def test_bitsandbytes_formats_are_refused_without_it_saying_how_to_get_it():
    for backend in ("bnb-int8", "bnb-nf4"):
        with pytest.raises(
            DraftWeightsError, match=r"needs bitsandbytes \(pip install 'selfspec\[bnb\]'\)"
        ):
            resolve_backend(backend, torch.device("cpu"))


@pytest.mark.parametrize("rows", [1, 5, 17])
@pytest.mark.parametrize("shape", [(70, 141), (64, 256)])  # padded rows and inputs, and whole ones
def test_int4_computes_the_product_of_its_dequantized_weights_within_bf16_rounding(rows, shape):
    out_f, in_f = shape
    w, b = torch.randn(out_f, in_f) * 0.1, torch.randn(out_f)
    x = torch.randn(2, rows, in_f)
    lin = linears.Int4Linear(w, b)
    codes, scale, offset = linears.quantize_groups(w, linears.INT4_GROUP)
    g = torch.arange(in_f) // linears.INT4_GROUP
    deq = codes.double() * scale.double()[:, g] + offset.double()[:, g]
    want = x.double() @ deq.T + b.double()
    # bf16 activations, scales and offsets: each term's relative error is a few 2**-8
    bound = 3 * 2**-8 * (x.double().abs() @ deq.abs().T) + 1e-4
    assert ((lin(x).double() - want).abs() <= bound).all()
    assert lin(x.double()).dtype == torch.float64 and lin(x).shape == (2, rows, out_f)


@pytest.mark.skipif(not BNB, reason="bitsandbytes is not installed")
@pytest.mark.parametrize("rows", [1, 5])
def test_bnb_nf4_computes_the_product_of_its_own_dequantized_weights(rows):
    # NF4 in blocks of 64 is too coarse for the tiny models' outliers to bound per layer as the
    # others are; what the host owns is the wiring: bf16 activations times bitsandbytes' own
    # dequantized weight, plus the bias
    import bitsandbytes.functional as bf

    w, b = torch.randn(64, 128) * 0.1, torch.randn(64)
    lin = linears.BnbLinear(w, b, kind="nf4")
    deq = bf.dequantize_4bit(lin.q.weight.data, lin.q.weight.quant_state).float()
    assert ((deq - w).abs() <= w.abs().amax() / 4).all()
    x = torch.randn(1, rows, 128)
    want = x.double() @ deq.double().T + b.double()
    got = lin(x).double()
    assert (
        (got - want).abs() <= 3 * 2**-8 * (x.double().abs() @ deq.double().abs().T) + 0.02
    ).all()
    assert lin(x).dtype == torch.float32 and lin.nbytes() >= 64 * 128 // 2


@pytest.mark.parametrize("rows", [1, 5])
def test_fp16_weights_compute_the_product_of_their_float16_weights(rows):
    # the kernel is oneDNN's wherever torch has it; the format is offered only where it is fast
    w, b = torch.randn(70, 45), torch.randn(70)
    x = torch.randn(1, rows, 45)
    lin = linears.Fp16WeightsLinear(w, b)
    want = x.double() @ w.half().double().T + b.double()
    torch.testing.assert_close(lin(x).double(), want, rtol=1e-3, atol=1e-3)
    assert lin.nbytes() == 70 * 45 * 2 + 70 * 4


@pytest.mark.skipif(FP16, reason="this CPU has oneDNN's float16 kernels")
def test_fp16_weights_are_refused_where_onednn_has_no_float16_kernels():
    with pytest.raises(DraftWeightsError, match="float16 kernels need AVX-512 FP16"):
        resolve_backend("fp16-weights", torch.device("cpu"))


@pytest.mark.parametrize("backend", ["int8", "int8-dynamic", "int8-intmm"])
@pytest.mark.parametrize("rows", [1, 5, 17])
def test_int8_products_compute_the_int8_weights_product_within_their_activations_rounding(
    backend, rows
):
    # the same int8 weights and scales as int8-weights; activations rounded to 8 bits (int8: one
    # scale for the block, int8-intmm: one per row), so each row is off by at most half a step
    # of its activation scale times the sum of the weights' magnitudes
    w, b = torch.randn(70, 45), torch.randn(70)
    x = torch.randn(2, rows, 45)
    lin = {
        "int8": linears.Int8Linear,
        "int8-dynamic": linears.DynamicInt8Linear,
        "int8-intmm": linears.IntMmLinear,
    }[backend](w, b)
    q, scale = linears.quantize_rows(w)
    deq = q.double() * scale.double()[:, None]
    want = x.double() @ deq.T + b.double()
    # int8-dynamic rounds to 7 bits (reduce_range) over the block's range, offset included
    step = {
        "int8": x.abs().amax() / 127,
        "int8-dynamic": (x.amax() - x.amin()) / 127,
        "int8-intmm": x.abs().amax(-1, keepdim=True) / 127,
    }[backend]
    bound = step.double() / 2 * deq.abs().sum(1) + 1e-4
    assert ((lin(x).double() - want).abs() <= bound).all()
    assert lin.nbytes() == 70 * 45 + 70 * 4 + 70 * 4 + (70 * 4 if backend == "int8-dynamic" else 0)


def test_auto_measures_every_registered_copy_that_runs_here(monkeypatch):
    from selfspec._engine.drafting.draftweights import shadow
    from selfspec._engine.tuning import calibration

    seen = {}

    def fake_choose(runner, static, candidates):
        seen["candidates"] = list(candidates)
        return calibration.Choice("draft_weights", static, "injected")

    monkeypatch.setattr(shadow, "choose_draft_weights", fake_choose)
    runner = Runner(tiny_model("llama", dtype=torch.float32), weight_layout="model")
    assert shadow.measured_backend(runner) == "int8"
    assert seen["candidates"] == candidates("draft", "cpu", torch.float32)
    assert {"none", "int8", "int8-dynamic", "int8-intmm", "int8-weights", "int4", "bf16"} <= set(
        seen["candidates"]
    )
    assert ("bnb-int8" in seen["candidates"]) == BNB


@settings(max_examples=30, deadline=None)
@given(
    out_f=st.integers(1, 40),
    in_f=st.integers(1, 100),
    group=st.sampled_from([4, 32, 64]),
    seed=st.integers(0, 2**16),
)
def test_4bit_groups_hold_codes_0_to_15_within_half_a_step_of_the_weight(out_f, in_f, group, seed):
    w = torch.randn(out_f, in_f, generator=torch.Generator().manual_seed(seed)) * 3
    codes, scale, offset = linears.quantize_groups(w, group)
    assert codes.dtype == torch.uint8 and codes.shape == w.shape and int(codes.max()) <= 15
    assert scale.shape == offset.shape == (out_f, -(-in_f // group))
    g = torch.arange(in_f) // group
    back = codes.float() * scale[:, g] + offset[:, g]
    assert ((back - w).abs() <= scale[:, g] / 2 + 1e-5).all()
    assert torch.allclose(offset[:, g].amin(1), w.amin(1))  # each group's minimum is exact


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_compressed_layers_and_head_stay_close(arch, backend):
    model = tiny_model(arch, dtype=torch.float32, seed=3)  # see a)
    runner = Runner(model, weight_layout="model")
    dw = draft_weights(runner, backend)
    ids = torch.arange(2, 40) % model.config.vocab_size
    h = runner.embed(ids)
    for i in range(runner.n_layers):
        ref = runner.forward(hidden=h, layers=(i, i + 1), logits=None).hidden
        out = runner.forward(hidden=h, layers=(i, i + 1), logits=None, weights=dw).hidden
        assert ((out - ref).norm() / ref.norm()).item() < BOUND[backend]  # see a)
        h = ref
    ref_logits = runner.forward(ids).logits
    q_logits = runner.forward(ids, weights=dw).logits
    assert q_logits.shape == ref_logits.shape
    assert ((q_logits - ref_logits).norm() / ref_logits.norm()).item() < 2 * BOUND[backend]
    assert (q_logits.argmax(-1) == ref_logits.argmax(-1)).float().mean().item() >= AGREE[backend]
    assert dw.nbytes > 0 and dw.layer_bytes > 0 and dw.head_bytes > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_none_backend_is_the_model_itself(arch):
    model = tiny_model(arch)  # float64, see b)
    runner = Runner(model)
    ids = torch.arange(1, 15) % model.config.vocab_size
    dw = draft_weights(runner, "none")
    assert dw.layers == {} and dw.head_module is None and dw.nbytes == 0
    assert torch.equal(runner.forward(ids, weights=dw).logits, runner.forward(ids).logits)


@settings(max_examples=15, deadline=None)
@given(arch=st.sampled_from(ARCHS), data=st.data())
def test_a_draft_vocabulary_keeps_its_rows_and_masks_the_rest(arch, data):
    model = tiny_model(arch)  # float64, see b)
    runner = Runner(model)
    V = runner.vocab_size
    ids = sorted(data.draw(st.sets(st.integers(0, V - 1), min_size=1, max_size=V - 1)))
    v = torch.tensor(ids)
    dw = draft_weights(runner, "none", v)
    x = torch.arange(3, 12) % V
    full = runner.forward(x).logits
    sub = runner.forward(x, weights=dw).logits  # see c)
    outside = torch.ones(V, dtype=torch.bool)
    outside[v] = False
    torch.testing.assert_close(sub[:, v], full[:, v], rtol=1e-12, atol=1e-12)
    assert torch.isinf(sub[:, outside]).all() and (sub[:, outside] < 0).all()
    assert bool(torch.isin(sub.argmax(-1), v).all())


@pytest.mark.parametrize("backend", ["none", "int8"])
def test_a_draft_never_leaves_its_vocabulary(backend):
    model = tiny_model("llama", dtype=torch.float32)
    runner = Runner(model)
    v = torch.arange(0, runner.vocab_size, 3)
    dw = draft_weights(runner, backend, v)
    prompt = torch.tensor([5, 9, 2, 7])
    cache = runner.new_cache(32)
    runner.forward(prompt[:-1], cache=cache, logits=None)
    out = skip_layer_draft(runner, cache, prompt[-1:], 3, max_tokens=8, weights=dw)
    assert len(out.tokens) == 8 and bool(torch.isin(out.tokens, v).all())  # see c)


def test_built_once_per_model_and_shared_by_runners():
    model = tiny_model("qwen2", dtype=torch.float32)
    a, b = Runner(model), Runner(model)
    first = draft_weights(a, "int8")
    again = draft_weights(b, "int8", torch.arange(10))  # another runner, another vocabulary
    assert again.layers is first.layers  # one copy of the layers
    assert draft_weights(a, "int8").head_module is first.head_module
    assert built_nbytes(model) == first.nbytes + again.head_bytes
    with torch.no_grad():  # new weights: the copies are rebuilt, never stale
        model.model.layers[0].mlp.up_proj.weight.mul_(2.0)
    assert draft_weights(a, "int8").layers is not first.layers


def test_head_only_builds_no_layers():
    model = tiny_model("llama", dtype=torch.float32)
    runner = Runner(model)
    dw = draft_weights(runner, "int8", layers=False)
    assert dw.layers == {} and dw.layer_bytes == 0 and dw.head_bytes > 0
    assert built_nbytes(model) == dw.head_bytes


@pytest.mark.parametrize("backend", CPU)
def test_the_model_is_never_modified(backend):
    model = tiny_model("qwen2", dtype=torch.float32)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    runner = Runner(model)
    draft_weights(runner, backend, torch.arange(20))
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k


def test_adopted_packed_weights_compress_too():
    # the CLI adopts oneDNN-packed weights in place: compressing reads them through .weight
    model = tiny_model("llama", dtype=torch.float32, seed=3)
    ref = Runner(model, weight_layout="model")
    ids = torch.arange(2, 30) % model.config.vocab_size
    want = ref.forward(ids).logits
    runner = Runner(model, weight_layout="packed", adopt=True)
    got = runner.forward(ids, weights=draft_weights(runner, "int8-weights")).logits
    assert ((got - want).norm() / want.norm()).item() < 2 * BOUND["int8-weights"]


def test_bad_vocabularies_are_refused():
    runner = Runner(tiny_model("llama"))
    V = runner.vocab_size
    for bad, message in (([], "needs"), ([0, V], "needs"), ([-1], "needs"), ([3, 3], "repeated")):
        with pytest.raises(DraftWeightsError, match=message):
            draft_weights(runner, "none", torch.tensor(bad, dtype=torch.long))
    assert draft_weights(runner, "none", torch.arange(V)).vocab is None  # all of it: no subset


def test_quantization_is_the_same_in_any_chunking(monkeypatch):
    w = torch.randn(37, 16)
    q_all, s_all = linears.quantize_rows(w)
    # built a few rows at a time (the quantizers' own constant)
    monkeypatch.setattr(quantize, "CHUNK_ROWS", 5)
    q, s = linears.quantize_rows(w)
    assert torch.equal(q, q_all) and torch.equal(s, s_all)
    assert (q.float() * s[:, None] - w).abs().max() <= s.max() / 2 + 1e-6


def test_fused_products_are_used_and_fall_back_on_other_inputs():
    lin_a, lin_b = torch.nn.Linear(8, 4), torch.nn.Linear(8, 6)
    product = FusedProduct([lin_a, lin_b], "int8-weights")
    a, b = FusedMember(product, 0), FusedMember(product, 1)
    x, y = torch.randn(3, 8), torch.randn(3, 8)
    with torch.no_grad():
        out_a = a(x)
        out_b = b(y)  # a different input: recomputed, not the slice of x's product
        torch.testing.assert_close(out_b, lin_b(y), rtol=0.05, atol=0.05)
        torch.testing.assert_close(out_a, lin_a(x), rtol=0.05, atol=0.05)


class _Tokenizer:
    all_special_ids = [9]

    def get_vocab(self):
        return {f"t{i}": i for i in range(12)}

    def __len__(self):
        return 12


def test_the_ranking_puts_special_tokens_then_the_frequent_first(monkeypatch):
    counts = np.array([0, 5, 0, 9, 1, 0, 5, 0, 0, 0, 2, 0], dtype=np.int64)
    monkeypatch.setattr(vocab, "token_counts", lambda tok, n, progress=True: counts[:n])
    order = vocab.vocab_ranking(12, _Tokenizer()).tolist()
    assert order[:6] == [9, 3, 1, 6, 10, 4]  # special, then by count, ties by id
    assert sorted(order) == list(range(12))
    assert vocab.vocab_ranking(5).tolist() == [0, 1, 2, 3, 4]  # no tokenizer: the ids in order
    runner = Runner(tiny_model("llama"))
    assert selfspec.draft_vocab(runner, 0) is None
    assert selfspec.draft_vocab(runner, runner.vocab_size) is None
    assert selfspec.draft_vocab(runner, 4).tolist() == [0, 1, 2, 3]


def test_token_counts_are_cached_per_tokenizer(monkeypatch, tmp_path):
    monkeypatch.setenv("SELFSPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("selfspec._engine.drafting.corpus._CORPUS", [None])
    selfspec.provisional.set_vocab_corpus(lambda tasks: iter(["a b", "b c b"]))

    class Tok(_Tokenizer):
        calls = 0

        def __call__(self, texts, add_special_tokens=False):
            Tok.calls += 1
            return {"input_ids": [[{"a": 1, "b": 2, "c": 3}[w] for w in t.split()] for t in texts]}

    counts = vocab.token_counts(Tok(), 12, progress=False)
    assert counts.tolist()[:4] == [0, 1, 3, 1]
    assert vocab.token_counts(Tok(), 12, progress=False).tolist() == counts.tolist()
    assert Tok.calls == 1  # the second came from the artefact


def test_no_corpus_means_the_whole_vocabulary(monkeypatch, tmp_path, capsys):
    # the data packages missing: nothing to rank by, so no subset (and nothing cached)
    monkeypatch.setenv("SELFSPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("selfspec._engine.drafting.corpus._CORPUS", [None])
    selfspec.provisional.set_vocab_corpus(lambda tasks: iter(()))
    runner = Runner(tiny_model("llama"))
    assert selfspec.draft_vocab(runner, 16, _Tokenizer(), progress=False) is None
    assert "no corpus" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.npy"))


def test_the_corpus_is_whatever_was_registered(monkeypatch, tmp_path, capsys):
    """a) nothing registered: no ranking, one line on stderr naming set_vocab_corpus; b) the
    command line registers the app's dev-split texts; c) a non-callable is refused."""
    monkeypatch.setenv("SELFSPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("selfspec._engine.drafting.corpus._CORPUS", [None])
    runner = Runner(tiny_model("llama"))
    assert selfspec.draft_vocab(runner, 16, _Tokenizer(), progress=False) is None  # see a)
    assert "set_vocab_corpus" in capsys.readouterr().err
    import selfspec.app._cli as cli  # noqa: PLC0415

    cli._register_corpus()  # see b)
    from selfspec._engine.drafting.corpus import corpus_source  # noqa: PLC0415

    assert corpus_source() is cli._dev_corpus
    with pytest.raises(TypeError):  # see c)
        selfspec.provisional.set_vocab_corpus("corpus.txt")


@pytest.mark.parametrize("in_features", [256, 300])  # whole groups, and a partial last group
def test_quantizing_leaves_the_weight_it_reads_untouched(in_features):
    w = torch.randn(40, in_features)
    before = w.clone()
    codes, scale, offset = linears.quantize_groups(w, linears.INT4_GROUP)
    q, s = linears.quantize_rows(w)
    assert torch.equal(w, before)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 15 and q.dtype == torch.int8
    groups = torch.arange(in_features) // linears.INT4_GROUP
    assert (
        codes.float() * scale[:, groups] + offset[:, groups] - w
    ).abs().max() <= scale.max() / 2 + 1e-6


def test_copies_built_through_the_reused_buffer_equal_copies_built_without_it_and_it_is_freed():
    from selfspec._engine.drafting.draftweights import layers as layers_mod
    from selfspec._engine.drafting.draftweights.layers import (
        compressed_layer,
        reused_buffer,
        stacked_weight,
    )

    model = tiny_model("qwen2", dtype=torch.float32)
    layer = model.model.layers[0]
    x = torch.randn(1, 3, model.config.hidden_size)
    plain = compressed_layer(layer, "int8-weights")
    with reused_buffer():
        reused = compressed_layer(layer, "int8-weights")
        attn = layer.self_attn
        stack = stacked_weight([attn.q_proj, attn.k_proj, attn.v_proj])
        assert torch.equal(
            stack, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        )
        assert layers_mod._BUFFER  # lent while open
    assert not layers_mod._BUFFER  # freed on exit
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        a, b = getattr(plain.self_attn, name), getattr(reused.self_attn, name)
        assert torch.equal(a(x), b(x))
    for name in ("gate_proj", "up_proj", "down_proj"):
        h = torch.randn(1, 3, getattr(plain.mlp, name).in_features)
        assert torch.equal(getattr(plain.mlp, name)(h), getattr(reused.mlp, name)(h))
    # one stored weight is read in place, never copied
    assert stacked_weight([attn.o_proj]).data_ptr() == attn.o_proj.weight.data_ptr()
