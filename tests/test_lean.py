"""Lean blocks (``runner/lean.py``): draft weights' layers run without their modules' calls.

Set-up, and why:
a) the rule: a draft pass with lean blocks gives the logits and hidden states of the same pass
   through the layers' own modules, on every architecture the blocks recognise, whatever the
   width, block mask (a tree's), cache mode (read-only or writing) and sliding window; and it
   writes the same keys and values. Checked bitwise (the same tensor operations in the same
   order) through the runner on int8 draft weights of float32 and bfloat16 models (fused q/k/v
   and gate/up products; the norms' float32 statistics), and block by block on the model's own
   float64 layers (one product per linear).
b) the blocks are used only where they compute what the modules do: Gemma 3's sandwich norms,
   eager attention, another activation and any layer missing a part run the adapter's blocks.
c) verification never uses them: a forward without draft weights runs the model's modules.
"""

from __future__ import annotations

import pytest
import torch

from selfspec import Runner, draft_weights
from selfspec._engine.runner import masks
from selfspec._engine.runner.lean import LeanBlocks, lean_blocks
from selfspec.testing import tiny_model

LEAN_ARCHS = ("llama", "mistral", "qwen2", "qwen3")


def _pass(runner: Runner, weights, width: int, *, lean: bool, write: bool, tree: bool):
    """A prompt of 9 tokens, then a draft pass of ``width`` tokens (a chain, or a small tree)."""
    runner.lean_drafts = lean
    torch.manual_seed(1)
    prompt = torch.randint(0, runner.vocab_size, (9,))
    block = torch.randint(0, runner.vocab_size, (width,))
    cache = runner.new_cache(9 + width)
    with torch.inference_mode():
        runner.forward(prompt, cache=cache, start=0, logits=None)
        kw = {}
        if tree and width > 2:
            parents = torch.tensor([-1] + [max(i - 2, -1) for i in range(1, width - 1)])
            kw = {"block_mask": masks.tree(parents), "positions": masks.tree_positions(parents, 9)}
        out = runner.forward(
            block, cache=cache, start=9, logits="all", weights=weights, write=write, **kw
        )
    keys = [k.clone() for k in cache.keys if k is not None]
    return out, keys


@pytest.mark.parametrize("arch", LEAN_ARCHS)
@pytest.mark.parametrize(
    ("backend", "dtype"),
    [
        ("int8", torch.float32),
        ("int8-weights", torch.float32),
        ("int8-intmm", torch.float32),
        ("int8", torch.bfloat16),
    ],
)
def test_a_draft_pass_on_lean_blocks_equals_the_modules_pass(arch, backend, dtype):  # a)
    model = tiny_model(arch, dtype=dtype)
    runner = Runner(model, weight_layout="model")
    weights = draft_weights(runner, backend)
    assert len(weights.layers) == runner.n_layers
    assert all(runner.adapter.lean(layer) is not None for layer in weights.layers.values())
    for width, write, tree in [
        (1, False, False),
        (1, True, False),
        (3, False, False),
        (6, True, True),
        (6, False, True),
    ]:
        lean, lean_keys = _pass(runner, weights, width, lean=True, write=write, tree=tree)
        mods, mod_keys = _pass(runner, weights, width, lean=False, write=write, tree=tree)
        assert torch.equal(lean.logits, mods.logits), (arch, backend, width, write, tree)
        assert torch.equal(lean.hidden, mods.hidden)
        assert all(torch.equal(a, b) for a, b in zip(lean_keys, mod_keys))


def _attn_on_a_filled_cache(runner: Runner, i: int, attn, q: int, write: bool):
    """``attn(kv)`` over layer ``i``'s cache holding 7 seeded slots; its output and the keys
    after."""
    cfg = runner.config
    cache = runner.new_cache(7 + q)
    g = torch.Generator().manual_seed(i)
    cache.keys[i] = torch.randn(
        1, cfg.num_key_value_heads, 7 + q, cfg.head_dim, dtype=torch.float64, generator=g
    )
    cache.values[i] = cache.keys[i].flip(2).clone()
    cache.lengths[i] = 7
    with torch.inference_mode():
        return attn(cache.view(i, 7, write)), cache.keys[i].clone()


@pytest.mark.parametrize("arch", LEAN_ARCHS)
def test_lean_blocks_equal_the_adapters_blocks_on_the_models_own_float64_layers(arch):  # a)
    model = tiny_model(arch, dtype=torch.float64)
    runner = Runner(model, weight_layout="model")
    adapter = runner.adapter
    torch.manual_seed(2)
    for i, layer in enumerate(runner.layers):
        blocks = adapter.lean(layer)
        assert blocks is not None
        for q, write in [(1, False), (5, True)]:
            h = torch.randn(1, q, model.config.hidden_size, dtype=torch.float64)
            pos = torch.arange(7, 7 + q)
            rope = adapter.rope(h, pos[None], None)
            mask = masks.for_attention(
                masks.build(torch.arange(7), pos, None, runner.windows[i]), "sdpa", h.dtype
            )
            lean = _attn_on_a_filled_cache(
                runner, i, lambda kv, b=blocks, h=h, r=rope, m=mask: b.attn(h, r, m, kv), q, write
            )
            mods = _attn_on_a_filled_cache(
                runner,
                i,
                lambda kv, lay=layer, h=h, r=rope, m=mask: adapter.attn_block(lay, h, r, m, kv),
                q,
                write,
            )
            assert torch.equal(lean[0], mods[0]) and torch.equal(lean[1], mods[1]), (arch, i, q)
            with torch.inference_mode():
                assert torch.equal(blocks.mlp(h), adapter.mlp_block(layer, h))


def test_gemma_eager_attention_and_other_activations_keep_the_adapters_blocks():  # b)
    gemma = Runner(tiny_model("gemma3"), weight_layout="model")
    assert all(gemma.adapter.lean(layer) is None for layer in gemma.layers)
    eager = Runner(tiny_model("llama", attn_implementation="eager"), weight_layout="model")
    assert all(eager.adapter.lean(layer) is None for layer in eager.layers)
    gelu = tiny_model("llama", hidden_act="gelu")
    assert lean_blocks(gelu.model.layers[0], gelu.config) is None
    llama = tiny_model("llama")
    assert isinstance(lean_blocks(llama.model.layers[0], llama.config), LeanBlocks)
    assert lean_blocks(torch.nn.Linear(2, 2), llama.config) is None


def test_a_layer_whose_norm_is_not_an_rms_norm_keeps_the_adapters_blocks():  # b)
    import copy

    model = tiny_model("qwen2")
    layer = copy.deepcopy(model.model.layers[0])
    layer.post_attention_layernorm = torch.nn.LayerNorm(model.config.hidden_size)
    assert lean_blocks(layer, model.config) is None


def test_verification_passes_never_use_lean_blocks(monkeypatch):  # c)
    model = tiny_model("qwen2", dtype=torch.float64)
    runner = Runner(model, weight_layout="model")
    weights = draft_weights(runner, "none")
    used = []
    monkeypatch.setattr(LeanBlocks, "mlp", lambda self, h: used.append(1) or h)
    with torch.inference_mode():
        runner.forward(torch.tensor([1, 2, 3]), logits="all")
        assert used == []
        runner.forward(torch.tensor([1, 2, 3]), logits="all", weights=weights)
    assert len(used) == len(weights.layers)
