"""Adopting a weight layout in place: one copy of each weight, the model's forward still works."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from selfspec import Decoder
from selfspec._engine.runner import Runner
from selfspec._engine.runner.layout import PackedLinear, adopt_layout, choose_layout, is_transposed
from selfspec.testing import tiny_model

needs_packing = pytest.mark.skipif(
    choose_layout(
        "auto",
        "cpu",
        torch.float32,
        __import__("selfspec._engine.tuning.machine", fromlist=["x"]).cpu_capability(),
    )
    != "packed",
    reason="oneDNN cannot prepack float32 here",
)


def _linears(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


@needs_packing
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_packed_adoption_replaces_the_weights_and_keeps_the_forward(arch):
    model = tiny_model(arch, dtype=torch.float32, tie_word_embeddings=False)
    ids = torch.tensor([[3, 5, 7, 11, 13]])
    with torch.no_grad():
        before = model(ids).logits
    weight_ids = {id(m.weight) for m in _linears(model)}
    runner = Runner(model, weight_layout="packed", adopt=True)
    linears = _linears(model)
    assert linears and all(isinstance(m, PackedLinear) for m in linears)  # LM head included
    assert not any(id(p) in weight_ids for p in model.parameters())  # the originals are gone
    assert isinstance(model.get_output_embeddings(), PackedLinear)
    with torch.no_grad():
        after = model(ids).logits  # HF's own forward, through the packed weights
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)
    out = runner.forward(ids[0])
    torch.testing.assert_close(out.logits, before[0], rtol=1e-4, atol=1e-4)
    lin = linears[0]
    assert lin.weight.shape == (lin.out_features, lin.in_features)  # unpacked on demand


@needs_packing
def test_adoption_is_idempotent_and_a_second_runner_shares_it():
    model = tiny_model("llama", dtype=torch.float32, tie_word_embeddings=False)
    r1 = Runner(model, weight_layout="packed", adopt=True)
    packed = [m.packed for m in _linears(model)]
    r2 = Runner(model, weight_layout="packed", adopt=True)
    assert [m.packed for m in _linears(model)] == packed  # nothing packed twice
    r3 = Runner(model, weight_layout="packed")  # a copying runner over an adopted model
    ids = torch.tensor([1, 2, 3, 4])
    for r in (r2, r3):
        torch.testing.assert_close(r.forward(ids).logits, r1.forward(ids).logits, rtol=0, atol=0)


def test_transposed_adoption_keeps_parameters_and_values():
    model = tiny_model("llama", dtype=torch.float64)
    ids = torch.tensor([[2, 4, 6, 8]])
    with torch.no_grad():
        before = model(ids).logits
    Runner(model, weight_layout="transposed", adopt=True)
    layer_linears = [
        m for layer in model.model.layers for m in layer.modules() if isinstance(m, nn.Linear)
    ]
    assert layer_linears and all(is_transposed(m.weight) for m in layer_linears)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before, rtol=1e-12, atol=1e-12)


def test_model_layout_adopts_nothing():
    model = tiny_model("llama", dtype=torch.float64)
    head = model.get_output_embeddings()
    assert adopt_layout(model, list(model.model.layers), head, "model") is head
    assert not any(isinstance(m, PackedLinear) for m in model.modules())


@needs_packing
def test_an_adopting_decoder_decodes_like_a_copying_one():
    a = tiny_model("qwen2", dtype=torch.float32, seed=3)
    b = tiny_model("qwen2", dtype=torch.float32, seed=3)
    prompt = [5, 9, 2, 7, 7, 1]
    ref = Decoder(a, "lookup").generate(prompt, max_new_tokens=24, eos_token_ids=[])
    got = Decoder(b, "lookup", adopt_weights=True, weight_layout="packed").generate(
        prompt, max_new_tokens=24, eos_token_ids=[]
    )
    assert got.output_ids == ref.output_ids
    assert got.stats.weight_layout == "packed"


@pytest.mark.skipif(
    not __import__("sys").platform.startswith("linux"), reason="reads /proc/self/maps"
)
def test_adopting_copies_the_tensors_left_on_a_mapped_file_so_its_mapping_is_released(tmp_path):
    from selfspec._engine.runner.residency import _file_mappings

    model = tiny_model("qwen2", dtype=torch.float32, seed=3)
    emb = model.model.embed_tokens.weight
    path = tmp_path / "weights.bin"
    emb.detach().numpy().tofile(path)
    mapped = torch.from_file(str(path), shared=True, size=emb.numel(), dtype=torch.float32).view_as(
        emb
    )
    # a view of the file
    model.model.embed_tokens.weight = torch.nn.Parameter(mapped, requires_grad=False)
    want = mapped.clone()
    inside = lambda t: any(lo <= t.untyped_storage().data_ptr() < hi for lo, hi in _file_mappings())  # noqa: E731
    assert inside(model.model.embed_tokens.weight)
    Decoder(model, "vanilla", adopt_weights=True, weight_layout="transposed")
    owned = model.model.embed_tokens.weight
    # the values kept, in the process's own memory
    assert not inside(owned) and torch.equal(owned, want)


@pytest.mark.skipif(
    not __import__("sys").platform.startswith("linux"), reason="reads /proc/self/maps"
)
def test_a_weight_on_a_mapped_file_is_read_from_the_file_not_through_the_mapping(tmp_path):
    from selfspec._engine.runner.residency import _file_mappings, unmapped_copy

    w = torch.randn(48, 40)
    path = tmp_path / "w.bin"
    # at an offset inside the file
    torch.cat([torch.zeros(1024), w.reshape(-1)]).numpy().tofile(path)
    whole = torch.from_file(str(path), shared=True, size=1024 + w.numel(), dtype=torch.float32)
    view = whole[1024:].view(48, 40)
    inside = lambda t: any(lo <= t.data_ptr() < hi for lo, hi in _file_mappings())  # noqa: E731
    assert inside(view)
    read = unmapped_copy(view)
    assert not inside(read) and torch.equal(read, w)
    plain = torch.randn(3, 4)
    assert unmapped_copy(plain) is plain  # anything else is returned as it is
