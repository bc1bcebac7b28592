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
from selfspec._engine.draftweights import built_nbytes, linears, quantize, resolve_backend, vocab
from selfspec._engine.draftweights.layers import FusedMember, FusedProduct
from selfspec._engine.runner.native import ENV as NATIVE_ENV
from selfspec._engine.runner.native import (
    int4avx2_unsupported,
    native_unsupported,
    vnni_unsupported,
)
from selfspec.testing import ARCHS, tiny_model

NATIVE = native_unsupported() is None
VNNI = NATIVE and vnni_unsupported() is None
AVX2 = NATIVE and int4avx2_unsupported() is None
CPU = ("int8", "int8wo", "bf16") + (("int8native", "int4native") if NATIVE else ()) + (
    ("int8vnni", "int4vnni") if VNNI else ()) + (("int4avx2",) if AVX2 else ())
# see a); the *vnni ones as int8: blocks of more than 2 rows round the activations to 8 bits
BOUND = {"int8": 0.12, "int8wo": 0.03, "int8native": 0.03, "int8vnni": 0.12, "int4native": 0.45, "int4vnni": 0.5,
         "int4avx2": 0.5, "bf16": 0.02}
AGREE = {"int8": 0.6, "int8wo": 0.8, "int8native": 0.8, "int8vnni": 0.6, "int4native": 0.2, "int4vnni": 0.2,
         "int4avx2": 0.2, "bf16": 0.8}


def test_auto_is_int8_on_cpu_and_impossible_backends_are_refused():
    assert resolve_backend("auto", torch.device("cpu")) == "int8"
    assert resolve_backend("none", torch.device("cpu")) == "none"
    with pytest.raises(DraftWeightsError, match="CUDA"):
        resolve_backend("bnb", torch.device("cpu"))
    with pytest.raises(DraftWeightsError, match="CPU only"):
        resolve_backend("int8", torch.device("meta"))
    with pytest.raises(DraftWeightsError, match="unknown"):
        resolve_backend("int4", torch.device("cpu"))


@pytest.mark.parametrize("backend", ["int8vnni", "int4vnni"])
def test_vnni_backends_are_refused_where_the_kernel_has_no_vnni(monkeypatch, backend):
    from selfspec._engine.runner import native

    if NATIVE:
        monkeypatch.setattr(native._library(), "selfspec_native_vnni", lambda: 0)
        with pytest.raises(DraftWeightsError, match=f"'{backend}' cannot run here: .*no AVX-512 VNNI"):
            resolve_backend(backend, torch.device("cpu"))
    monkeypatch.setenv(NATIVE_ENV, "0")
    with pytest.raises(DraftWeightsError, match=f"'{backend}' cannot run here: {NATIVE_ENV}=0"):
        resolve_backend(backend, torch.device("cpu"))


@pytest.mark.skipif(not VNNI, reason="the VNNI products cannot run here")
@pytest.mark.parametrize("rows", [1, 2, 5])
def test_int4vnni_computes_the_int4native_product_within_its_activations_rounding(rows):
    n_in = linears.INT4_GROUP + 12  # a whole group and a partial one
    w, b = torch.randn(70, n_in), torch.randn(70)
    x = torch.randn(rows, n_in)
    lin = linears.NativeInt4VnniLinear(w, b)
    codes, scale, offset = linears.quantize_groups(w, linears.INT4_GROUP)
    g = torch.arange(n_in) // linears.INT4_GROUP
    coded = codes.double() * scale.double()[:, g]  # the part of a weight the rounded activations meet
    want = x.double() @ (coded + offset.double()[:, g]).T + b.double()
    step = x.double().abs().amax(1, keepdim=True) / (32767.0 if rows <= 2 else 127.0)
    bound = step / 2 * coded.abs().sum(1) + 1e-5 * (x.double().abs() @ (coded + offset.double()[:, g]).abs().T) + 1e-5
    assert ((lin(x).double() - want).abs() <= bound).all()
    assert lin(x.double()).dtype == torch.float64
    assert lin.nbytes() == 70 * (-(-n_in // 2)) + 70 * 2 * 12 + 70 * 4  # codes; scale, offset, sum per group; bias


@pytest.mark.skipif(not VNNI, reason="the int8vnni products cannot run here")
@pytest.mark.parametrize("rows", [1, 4, 9])
def test_int8vnni_computes_the_int8wo_product_within_its_activations_rounding(rows):
    from selfspec._engine.runner.native import vnni_error_bound

    w, b = torch.randn(70, 45), torch.randn(70)
    x = torch.randn(rows, 45)
    lin = linears.NativeVnniLinear(w, b)
    q, scale = linears.quantize_rows(w)
    wq = q.double() * scale.double()[:, None]
    err = (lin(x).double() - (x.double() @ wq.T + b.double())).abs()
    assert (err <= vnni_error_bound(x, wq) + 1e-5).all()
    assert lin(x.double()).dtype == torch.float64 and lin.nbytes() == 70 * 45 + 70 * 8 + 70 * 4


@pytest.mark.skipif(not AVX2, reason="the int4avx2 products cannot run here")
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
def test_int4avx2_computes_the_int4native_product_within_its_activations_rounding(rows):
    from selfspec._engine.runner.native import int4avx2_error_bound

    n_in = linears.INT4_GROUP + 12  # a whole group and a partial one
    w, b = torch.randn(70, n_in), torch.randn(70)
    x = torch.randn(rows, n_in) * torch.linspace(0.1, 8, n_in)  # a few large inputs set each row's step
    lin = linears.NativeInt4Avx2Linear(w, b)
    codes, scale, offset = linears.quantize_groups(w, linears.INT4_GROUP)
    g = torch.arange(n_in) // linears.INT4_GROUP
    coded = codes.double() * scale.double()[:, g]  # the part of a weight the rounded activations meet
    full = coded + offset.double()[:, g]
    err = (lin(x).double() - (x.double() @ full.T + b.double())).abs()
    assert (err <= int4avx2_error_bound(x, coded) + 1e-5 * (x.double().abs() @ full.abs().T) + 1e-5).all()
    # a row's result is its own: the same in any block of the product's width (15-bit up to 2 rows)
    if rows > 2:
        assert torch.equal(lin(x)[-3:], lin(x[-3:]))
    assert torch.equal(lin(x[:1]), lin(x[:2])[:1])
    assert lin(x.double()).dtype == torch.float64
    assert lin.nbytes() == 70 * (-(-n_in // 2)) + 70 * 2 * 8 + 70 * 4  # codes; scale, offset per group; bias


@pytest.mark.skipif(not AVX2, reason="the int4avx2 products cannot run here")
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_int4avx2_sums_the_largest_codes_and_activations_without_overflow(rows, sign):
    # codes 15 by activations at the top of their range (8-bit: 127; 15-bit: a high byte of
    # -128 or 127): a 16-bit lane holds 8 steps of 2 * 15 * 128
    n_in = 2 * linears.INT4_GROUP
    w = torch.zeros(16, n_in)
    w[:, ::2] = 1.0  # every group's codes 0 and 15
    x = torch.full((rows, n_in), sign)
    x[:, 1::2] = -sign  # the code-0 inputs carry the others: the sum is n_in / 2 (times sign)
    lin = linears.NativeInt4Avx2Linear(w, None)
    torch.testing.assert_close(lin(x), torch.full((rows, 16), sign * n_in / 2.0), rtol=1e-5, atol=1e-4)


def test_int4avx2_is_refused_where_the_kernel_has_no_avx2(monkeypatch):
    from selfspec._engine.runner import native

    if NATIVE:
        monkeypatch.setattr(native._library(), "selfspec_native_i4avx2", lambda: 0)
        with pytest.raises(DraftWeightsError, match="'int4avx2' cannot run here: .*no AVX2"):
            resolve_backend("int4avx2", torch.device("cpu"))


@pytest.mark.parametrize("backend", ["int8native", "int8vnni", "int4native", "int4vnni", "int4avx2"])
def test_native_backends_are_refused_where_their_kernel_cannot_run(monkeypatch, backend):
    with pytest.raises(DraftWeightsError, match="CPU only"):
        resolve_backend(backend, torch.device("meta"))
    monkeypatch.setenv(NATIVE_ENV, "0")
    with pytest.raises(DraftWeightsError, match=f"'{backend}' cannot run here: {NATIVE_ENV}=0"):
        resolve_backend(backend, torch.device("cpu"))


@settings(max_examples=30, deadline=None)
@given(out_f=st.integers(1, 40), in_f=st.integers(1, 100), group=st.sampled_from([4, 32, 64]),
       seed=st.integers(0, 2**16))
def test_4bit_groups_hold_codes_0_to_15_within_half_a_step_of_the_weight(out_f, in_f, group, seed):
    w = torch.randn(out_f, in_f, generator=torch.Generator().manual_seed(seed)) * 3
    codes, scale, offset = linears.quantize_groups(w, group)
    assert codes.dtype == torch.uint8 and codes.shape == w.shape and int(codes.max()) <= 15
    assert scale.shape == offset.shape == (out_f, -(-in_f // group))
    g = torch.arange(in_f) // group
    back = codes.float() * scale[:, g] + offset[:, g]
    assert ((back - w).abs() <= scale[:, g] / 2 + 1e-5).all()
    assert torch.allclose(offset[:, g].amin(1), w.amin(1))  # each group's minimum is exact


@pytest.mark.skipif(not NATIVE, reason="the native kernel cannot run here")
@pytest.mark.parametrize("rows", [1, 5, 17])
def test_int4native_computes_the_product_of_its_dequantized_weights_in_float32(rows):
    n_in = linears.INT4_GROUP + 13  # a whole group and a partial one
    w, b = torch.randn(70, n_in), torch.randn(70)
    x = torch.randn(2, rows, n_in)
    lin = linears.NativeInt4Linear(w, b)
    codes, scale, offset = linears.quantize_groups(w, linears.INT4_GROUP)
    g = torch.arange(n_in) // linears.INT4_GROUP
    want = x.double() @ (codes.double() * scale.double()[:, g] + offset.double()[:, g]).T + b.double()
    torch.testing.assert_close(lin(x).double(), want, rtol=1e-5, atol=1e-4)
    assert lin(x.double()).dtype == torch.float64
    # 4-bit codes, a scale and an offset per group, the bias
    assert lin.nbytes() == 70 * (-(-n_in // 2)) + 70 * 2 * 8 + 70 * 4


def test_auto_measures_every_copy_that_runs_here_but_the_4bit_one_for_float32_activations(monkeypatch):
    from selfspec._engine import calibration
    from selfspec._engine.draftweights import shadow

    seen = {}

    def fake_choose(runner, static, candidates):
        seen["candidates"] = list(candidates)
        return calibration.Choice("draft_weights", static, "injected")

    monkeypatch.setattr(calibration, "choose_draft_weights", fake_choose)
    runner = Runner(tiny_model("llama", dtype=torch.float32), weight_layout="model")
    assert shadow.measured_backend(runner) == "int8"
    assert "int8" in seen["candidates"] and "int4native" not in seen["candidates"]
    assert ("int8vnni" in seen["candidates"]) == VNNI  # measured wherever it can run
    assert ("int4vnni" in seen["candidates"]) == VNNI  # and the 4-bit ones too, behind the agreement gate
    assert ("int4avx2" in seen["candidates"]) == AVX2


@pytest.mark.skipif(not NATIVE, reason="the native kernel cannot run here")
@pytest.mark.parametrize("rows", [1, 5, 17])
def test_int8native_computes_the_int8wo_product_in_float32(rows):
    # the same int8 weights and scales as int8wo, the activations never quantized
    w, b = torch.randn(70, 45), torch.randn(70)
    x = torch.randn(2, rows, 45)
    lin = linears.NativeInt8Linear(w, b)
    q, scale = linears.quantize_rows(w)
    want = (x.double() @ (q.double() * scale.double()[:, None]).T) + b.double()
    torch.testing.assert_close(lin(x).double(), want, rtol=1e-5, atol=1e-4)
    assert lin(x.double()).dtype == torch.float64 and lin.nbytes() == 70 * 45 + 70 * 4 + 70 * 4


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
    got = runner.forward(ids, weights=draft_weights(runner, "int8wo")).logits
    assert ((got - want).norm() / want.norm()).item() < 2 * BOUND["int8wo"]


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
    monkeypatch.setattr(quantize, "CHUNK_ROWS", 5)  # built a few rows at a time (the quantizers' own constant)
    q, s = linears.quantize_rows(w)
    assert torch.equal(q, q_all) and torch.equal(s, s_all)
    assert (q.float() * s[:, None] - w).abs().max() <= s.max() / 2 + 1e-6


def test_fused_products_are_used_and_fall_back_on_other_inputs():
    lin_a, lin_b = torch.nn.Linear(8, 4), torch.nn.Linear(8, 6)
    product = FusedProduct([lin_a, lin_b], "int8wo")
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
    monkeypatch.setattr("selfspec._engine.corpus._CORPUS", [None])
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
    monkeypatch.setattr("selfspec._engine.corpus._CORPUS", [None])
    selfspec.provisional.set_vocab_corpus(lambda tasks: iter(()))
    runner = Runner(tiny_model("llama"))
    assert selfspec.draft_vocab(runner, 16, _Tokenizer(), progress=False) is None
    assert "no corpus" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.npy"))


def test_the_corpus_is_whatever_was_registered(monkeypatch, tmp_path, capsys):
    """a) nothing registered: no ranking, one line on stderr naming set_vocab_corpus; b) the
    command line registers the app's dev-split texts; c) a non-callable is refused."""
    monkeypatch.setenv("SELFSPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("selfspec._engine.corpus._CORPUS", [None])
    runner = Runner(tiny_model("llama"))
    assert selfspec.draft_vocab(runner, 16, _Tokenizer(), progress=False) is None  # see a)
    assert "set_vocab_corpus" in capsys.readouterr().err
    import selfspec.app._cli as cli  # noqa: PLC0415

    cli._register_corpus()  # see b)
    from selfspec._engine.corpus import corpus_source  # noqa: PLC0415

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
    assert (codes.float() * scale[:, groups] + offset[:, groups] - w).abs().max() <= scale.max() / 2 + 1e-6


def test_copies_built_through_the_reused_buffer_equal_copies_built_without_it_and_it_is_freed():
    from selfspec._engine.draftweights import layers as layers_mod
    from selfspec._engine.draftweights.layers import compressed_layer, reused_buffer, stacked_weight

    model = tiny_model("qwen2", dtype=torch.float32)
    layer = model.model.layers[0]
    x = torch.randn(1, 3, model.config.hidden_size)
    plain = compressed_layer(layer, "int8wo")
    with reused_buffer():
        reused = compressed_layer(layer, "int8wo")
        attn = layer.self_attn
        stack = stacked_weight([attn.q_proj, attn.k_proj, attn.v_proj])
        assert torch.equal(stack, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
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
