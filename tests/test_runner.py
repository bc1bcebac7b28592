"""The runner against the model's own forward, in float64, for every supported architecture.

Set-up, and why:
a) float64 throughout: the runner calls the model's own modules in the model's own order, so a
   full forward must match Hugging Face's to rounding (it is bitwise equal on CPU); the tight
   tolerance only leaves room for kernels that reorder sums on other devices.
b) prompts of 14+ tokens: the tiny models slide windows of 3-4 tokens (Mistral on every layer,
   Qwen2 on all but the first, Gemma 3 on alternate layers), so every test crosses a window.
c) the same checks run with SDPA and eager attention: the runner builds bool masks for one
   and additive masks for the other.
d) Hugging Face's eager attention takes its softmax in float32 even for float64 models, so
   when the same token is computed in blocks of different shapes (incremental vs full, tree vs
   chain) eager results agree to float32 rounding only; SDPA stays at float64 rounding. A
   wrong mask or position shows up orders of magnitude above either.
"""

from __future__ import annotations

import copy

import pytest
import torch

from selfspec._engine.runner import (
    KVCache,
    Runner,
    UnsupportedModelError,
    masks,
    supported_model_types,
)
from selfspec.testing import ARCHS
from selfspec.testing._models import WINDOW

TIGHT = {"rtol": 1e-10, "atol": 1e-10}  # see a)
F32_SOFTMAX = {"rtol": 1e-5, "atol": 1e-4}  # see d)
LONG = 14  # see b)


@pytest.fixture(params=["sdpa", "eager"])
def impl(request: pytest.FixtureRequest) -> str:
    return request.param  # see c)


def shape_tol(model) -> dict[str, float]:
    """Tolerance between blocks of different shapes (see d)."""
    return F32_SOFTMAX if model.config._attn_implementation == "eager" else TIGHT


@pytest.fixture
def model(tiny_model_factory, selfspec_arch: str, impl: str):
    return tiny_model_factory(selfspec_arch, attn_implementation=impl)


def ids_of(n: int, seed: int = 0, vocab: int = 128) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g)


def hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids[None]).logits[0]


def hf_hidden(model, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        return tuple(h[0] for h in model(ids[None], output_hidden_states=True).hidden_states)


def test_tiny_models_have_sliding_windows(tiny_model_factory):
    # see b): the window tests below are only meaningful if the windows are there
    windows = {a: Runner(tiny_model_factory(a)).windows for a in ARCHS}
    assert windows["mistral"] == [WINDOW] * 3
    assert None in windows["qwen2"] and WINDOW in windows["qwen2"]
    assert None in windows["gemma3"] and WINDOW - 1 in windows["gemma3"]
    assert all(max(w or 0 for w in ws) < LONG for ws in windows.values())


def test_full_forward_equals_hf(model):
    ids = ids_of(LONG + 3)
    out = Runner(model).forward(ids)
    torch.testing.assert_close(out.logits, hf_logits(model, ids), **TIGHT)


def test_incremental_equals_full(model):
    """Chunked prefill then single tokens through the cache = one full forward."""
    ids = ids_of(LONG + 4, seed=1)
    runner = Runner(model)
    cache = runner.new_cache(64)
    rows = []
    for lo, hi in [
        (0, 5),
        (5, 8),
        (8, 9),
        (9, 10),
        (10, 15),
        *[(i, i + 1) for i in range(15, LONG + 4)],
    ]:
        rows.append(runner.forward(ids[lo:hi], cache=cache).logits)
        assert cache.length == hi
    torch.testing.assert_close(torch.cat(rows), hf_logits(model, ids), **shape_tol(model))


def test_early_exit_equals_hf_hidden_states_normed(model):
    runner = Runner(model)
    ids = ids_of(LONG, seed=2)
    hs = hf_hidden(model, ids)
    for b in range(1, runner.n_layers):
        h = runner.forward(ids, layers=(0, b)).hidden
        expect = runner.adapter.head(hs[b])  # final norm + head on HF's state after layer b-1
        torch.testing.assert_close(runner.head(h[0]), expect, **TIGHT)
    assert runner.forward(ids, layers=(0, 1)).logits is None  # an early exit computes no logits


def test_start_from_hidden_states_at_layer_a(model):
    runner = Runner(model)
    ids = ids_of(LONG, seed=3)
    full = runner.forward(ids).logits
    for a in range(runner.n_layers + 1):
        cache = runner.new_cache(32)
        h = runner.forward(ids, cache=cache, layers=(0, a)).hidden
        out = runner.forward(hidden=h, cache=cache, layers=(a, runner.n_layers))
        torch.testing.assert_close(out.logits, full, **TIGHT)
        assert cache.length == LONG  # both halves wrote their layers


def test_capture_equals_hf_hidden_states(model):
    runner = Runner(model)
    ids = ids_of(LONG, seed=4)
    hs = hf_hidden(model, ids)
    L = runner.n_layers
    out = runner.forward(ids, capture=range(L + 1))
    assert sorted(out.captured) == list(range(L + 1))
    for i in range(L):
        torch.testing.assert_close(out.captured[i], hs[i], **TIGHT)
    # HF's last hidden state is after the final norm; the runner captures it before
    torch.testing.assert_close(runner.adapter.final_norm(out.captured[L]), hs[L], **TIGHT)
    part = runner.forward(ids, capture=[1], logits=None)
    assert list(part.captured) == [1]


def test_skip_blocks_change_output_and_write_no_kv_for_skipped_attention(model):
    runner = Runner(model)
    ids = ids_of(LONG, seed=5)
    full = runner.forward(ids).logits
    cache = runner.new_cache(32)
    attn_skipped = runner.forward(ids, cache=cache, skip_attn={1}).logits
    assert not torch.allclose(attn_skipped, full)
    assert cache.lengths[1] == 0 and all(
        cache.lengths[i] == LONG for i in range(runner.n_layers) if i != 1
    )
    mlp_cache = runner.new_cache(32)
    mlp_skipped = runner.forward(ids, cache=mlp_cache, skip_mlp={0}).logits
    assert not torch.allclose(mlp_skipped, full)
    assert not torch.allclose(mlp_skipped, attn_skipped)
    assert mlp_cache.lengths == [LONG] * runner.n_layers  # attention still ran everywhere
    # skipping nothing is the full forward
    torch.testing.assert_close(runner.forward(ids, skip_attn=(), skip_mlp=()).logits, full, **TIGHT)


def test_read_only_forward_leaves_cache_unchanged(model):
    runner = Runner(model)
    ids = ids_of(LONG + 3, seed=6)
    cache = runner.new_cache(40)
    runner.forward(ids[:LONG], cache=cache)
    lengths = list(cache.lengths)
    keys = [k.clone() for k in cache.keys]
    values = [v.clone() for v in cache.values]
    pos = cache.pos.clone()
    # write something past the valid length too: read-only must not touch it either
    ro = runner.forward(ids[LONG:], cache=cache, write=False).logits
    assert cache.lengths == lengths
    for i in range(runner.n_layers):
        assert torch.equal(cache.keys[i], keys[i]) and torch.equal(cache.values[i], values[i])
    assert torch.equal(cache.pos, pos)
    rw = runner.forward(ids[LONG:], cache=cache).logits
    torch.testing.assert_close(ro, rw, **TIGHT)
    torch.testing.assert_close(rw, hf_logits(model, ids)[LONG:], **shape_tol(model))
    assert cache.length == LONG + 3


def random_tree(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.tensor(
        [int(torch.randint(-1, i, (1,), generator=g)) if i else -1 for i in range(n)]
    )


def test_tree_mask_logits_equal_each_path_as_a_chain(model):
    """Every node of a tree block gets the logits of its root-to-node path run as a chain."""
    runner = Runner(model)
    prompt = ids_of(LONG, seed=7)
    for seed in range(3):
        parents = random_tree(9, seed)
        nodes = ids_of(9, seed=10 + seed)
        cache = runner.new_cache(40)
        runner.forward(prompt[:-1], cache=cache)
        base = LONG - 1
        block = torch.cat([prompt[-1:], nodes])  # [pending, nodes...]
        out = runner.forward(
            block,
            cache=cache,
            start=base,
            positions=masks.tree_positions(parents, base),
            block_mask=masks.tree(parents),
        )
        plist = parents.tolist()
        for n in range(len(plist)):
            path, cur = [], n
            while cur >= 0:
                path.append(cur)
                cur = plist[cur]
            chain = torch.cat([prompt, nodes[path[::-1]]])
            torch.testing.assert_close(
                out.logits[n + 1], hf_logits(model, chain)[-1], **shape_tol(model)
            )
        torch.testing.assert_close(out.logits[0], hf_logits(model, prompt)[-1], **shape_tol(model))


def test_substitutes_change_output_only_when_passed(model):
    runner = Runner(model)
    ids = ids_of(LONG, seed=8)
    full = runner.forward(ids).logits
    sub = copy.deepcopy(runner.layers[1])
    with torch.no_grad():
        for p in sub.parameters():
            p.add_(0.05 * torch.randn_like(p))
    changed = runner.forward(ids, substitutes={1: sub}).logits
    assert not torch.allclose(changed, full)
    torch.testing.assert_close(runner.forward(ids).logits, full, **TIGHT)
    torch.testing.assert_close(runner.forward(ids, substitutes={}).logits, full, **TIGHT)
    # a substitute identical to the layer gives the same output (rotary tables are shared)
    same = runner.forward(ids, substitutes={1: copy.deepcopy(runner.layers[1])}).logits
    torch.testing.assert_close(same, full, **TIGHT)


def test_layer_range_and_input_errors(tiny_model_factory):
    runner = Runner(tiny_model_factory("llama"))
    with pytest.raises(ValueError, match="outside"):
        runner.forward(ids_of(3), layers=(0, runner.n_layers + 1))
    with pytest.raises(ValueError, match="hidden states"):
        runner.forward(ids_of(3), layers=(1, 2))
    with pytest.raises(ValueError, match="capacity"):
        runner.forward(ids_of(5), cache=KVCache(runner.n_layers, 4))


def test_unsupported_model_type_names_supported_archs():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=16, n_positions=16)
    )
    with pytest.raises(UnsupportedModelError) as err:
        Runner(model)
    msg = str(err.value)
    assert "gpt2" in msg
    for t in ("llama", "mistral", "qwen2", "qwen3", "gemma3_text"):
        assert t in msg and t in supported_model_types()
