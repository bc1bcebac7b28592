"""Models accelerate dispatched over CPU memory and disk: the runner follows the placement, the
host's draft weights are built from offloaded layers and stay in memory, the audit's weight
guard reads offloaded weights through their hooks. (Every plugin's losslessness on such a
model is the kit's ``test_lossless_offloaded``, in each plugin's suite.)"""

from __future__ import annotations

import pytest
import torch
from accelerate.utils.offload import OffloadedWeightsLoader

import selfspec
from selfspec import Decoder, Runner
from selfspec._engine.contract.audit import WeightGuard
from selfspec._engine.drafting.draftweights.shadow import draft_weights
from selfspec._engine.runner import placement
from selfspec.testing import assert_lossless, offloaded_tiny_model, split_device_map, tiny_model

PROMPT = [3, 4, 5, 6, 3, 4, 5, 6, 7]


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """The kit's CPU/disk split of a float64 tiny Llama of 4 layers: the embedding, layers 1
    and 3 and the LM head on disk, layers 0 and 2 in memory."""
    return offloaded_tiny_model("llama", tmp_path_factory.mktemp("off"), num_hidden_layers=4)


@pytest.fixture()
def disk_reads(monkeypatch):
    """Counts every weight accelerate reads from its offload store (the one place an offloaded
    weight comes from, whichever the file format)."""
    calls: list[str] = []
    original = OffloadedWeightsLoader.__getitem__

    def counting(self, key):
        calls.append(key)
        return original(self, key)

    monkeypatch.setattr(OffloadedWeightsLoader, "__getitem__", counting)
    return calls


def test_the_split_places_odd_layers_and_both_ends_on_disk(split):
    runner = Runner(split)
    assert [placement.is_offloaded(layer) for layer in runner.layers] == [False, True, False, True]
    assert placement.is_offloaded(runner.embedding) and placement.is_offloaded(runner.lm_head)
    assert runner.device == torch.device("cpu")  # the offloaded embedding's execution device
    place = runner.placement
    assert place["layers"] == "0 cpu, 1 disk, 2 cpu, 3 disk"
    assert place["devices"] == {"cpu": 2, "disk": 2} and place["offloaded_layers"] == 2
    assert place["other"]["lm_head"] == "disk"
    assert placement.summary(split).startswith("placement: layers 0 cpu, 1 disk, 2 cpu, 3 disk;")
    assert Runner(tiny_model("llama")).placement is None  # a model accelerate did not dispatch


def test_a_full_forward_equals_the_models_own_on_the_same_placement(split):
    runner = Runner(split)
    ids = torch.tensor(PROMPT)
    with torch.inference_mode():
        want = split(ids[None]).logits[0]
    got = runner.forward(ids).logits
    assert torch.equal(got, want)


def test_draft_weights_of_offloaded_layers_hold_no_meta_tensor_and_read_no_disk(split, disk_reads):
    runner = Runner(split)
    with torch.inference_mode():  # a forward first: accelerate leaves inference meta tensors behind
        runner.forward(torch.tensor(PROMPT))
    disk_reads.clear()
    dw = draft_weights(runner, "int8")
    built = len(disk_reads)
    assert built > 0  # the offloaded layers and head were read, once, to build the shadow
    assert sorted(dw.layers) == [0, 1, 2, 3] and dw.head_module is not None
    for i, layer in dw.layers.items():
        tensors = [*layer.parameters(), *layer.buffers()]
        assert tensors and not any(t.device.type == "meta" for t in tensors), f"layer {i}"
        assert not any("_hf_hook" in m.__dict__ for m in layer.modules()), f"layer {i} keeps a hook"
    # the model stays offloaded
    assert all(placement.is_offloaded(runner.layers[i]) for i in (1, 3))

    ids = torch.tensor(PROMPT)
    cache = runner.new_cache(32)
    # a draft-only forward: every layer from the shadow, the head from the shadow
    runner.forward(ids[:1].clone(), cache=cache, weights=dw, logits="last", write=False)
    runner.forward(
        hidden=runner.embed(ids[:3], weights=dw), cache=cache, weights=dw, logits="all", write=False
    )
    assert disk_reads[built:] == []
    # control: a verification forward (the model's own weights) reads the offloaded layers
    runner.forward(ids, cache=cache)
    assert any(k.startswith("model.layers.1.") for k in disk_reads[built:])


def test_an_offloaded_embedding_gets_an_in_memory_copy_a_resident_one_does_not(split, tmp_path):
    runner = Runner(split)
    dw = draft_weights(runner, "int8")
    assert dw.embedding is not None and dw.embedding_bytes == split.model.embed_tokens.weight.nbytes
    ids = torch.tensor(PROMPT)
    with torch.inference_mode():
        assert torch.equal(runner.embed(ids, weights=dw), runner.embed(ids))
    assert draft_weights(runner, "none").embedding is None  # drafts run the model's own weights
    resident = offloaded_tiny_model(
        "llama",
        tmp_path,
        device_map={**split_device_map(tiny_model("llama")), "model.embed_tokens": "cpu"},
    )
    assert draft_weights(Runner(resident), "int8").embedding is None


def test_auto_layout_packs_resident_layers_only(tmp_path):
    model = offloaded_tiny_model("llama", tmp_path, dtype=torch.float32, num_hidden_layers=4)
    runner = Runner(model)  # float32 on x86: "auto" is "packed"
    if runner.weight_layout != "packed":
        pytest.skip(f"this CPU cannot pack float32 ({runner.weight_layout})")
    assert runner.layer_layouts == ["packed", "model", "packed", "model"]
    assert runner.placement["layouts"] == "0 packed, 1 model, 2 packed, 3 model"
    ids = torch.tensor(PROMPT)
    with torch.inference_mode():
        want = model(ids[None]).logits[0]
    torch.testing.assert_close(runner.forward(ids).logits, want, rtol=1e-4, atol=1e-4)
    adopted = Runner(model, adopt=True)  # in place: the resident layers' linears are packed
    assert type(adopted.layers[0].mlp.up_proj).__name__ == "PackedLinear"
    assert type(adopted.layers[1].mlp.up_proj).__name__ == "Linear"  # offloaded: left to its hooks
    assert placement.is_offloaded(adopted.layers[1]) and placement.is_offloaded(model.lm_head)
    torch.testing.assert_close(adopted.forward(ids).logits, want, rtol=1e-4, atol=1e-4)


def test_a_plugin_that_fills_an_offloaded_weight_is_caught(split):
    guard = WeightGuard(split, exact=True)
    assert guard.changed() is None
    with torch.inference_mode():
        split(torch.tensor([PROMPT]))  # accelerate swaps the meta tensors: not a change
    assert guard.changed() is None
    up = split.model.layers[1].mlp.up_proj
    meta = up._parameters["weight"]
    up._parameters["weight"] = torch.nn.Parameter(
        torch.zeros(meta.shape, dtype=meta.dtype), requires_grad=False
    )
    try:
        assert guard.changed() == (
            "replaced the offloaded parameter model.layers.1.mlp.up_proj.weight",
            False,
        )
    finally:
        up._parameters["weight"] = meta


def test_the_guard_compares_offloaded_values_with_the_offload_store(tmp_path):
    model = offloaded_tiny_model("llama", tmp_path, num_hidden_layers=2)
    guard = WeightGuard(model, exact=True)
    store = model.model.layers[1].mlp.up_proj._hf_hook.weights_map
    key = "weight"
    with torch.inference_mode(False), torch.no_grad():
        original = store[key].clone()
        store.dataset.state_dict[store.prefix + key] = original + 1  # the store now says otherwise
    try:
        what, late = guard.changed()
        assert what.startswith("wrote model.layers.1.mlp.up_proj.weight") and late
    finally:
        del store.dataset.state_dict[store.prefix + key]
    assert guard.changed() is None


@pytest.mark.parametrize("plugin", ["vanilla", "selfsd"])
def test_whole_model_on_disk(tmp_path, plugin):
    # every module on disk: the embedding, every layer and the head loaded per forward
    model = offloaded_tiny_model("qwen3", tmp_path, device_map={"model": "disk", "lm_head": "disk"})
    decoder = Decoder(model, plugin, audit=True)
    assert decoder.runner.placement["offloaded_layers"] == 3
    assert_lossless(model, decoder, PROMPT, 12)


def test_a_placement_without_hooks_is_a_clear_error():
    model = tiny_model("llama")
    with torch.device("meta"):
        meta = type(model)(model.config)
    with pytest.raises(
        placement.PlacementError, match="meta device with no accelerate offload hook"
    ):
        with placement.loaded(meta.model.layers[0]):
            pass


def test_the_split_map_covers_every_module():
    model = tiny_model("gemma3")
    dm = split_device_map(model)
    assert (
        dm["model.layers.3"] == "disk" and dm["model.layers.0"] == "cpu" and dm["lm_head"] == "disk"
    )
    assert selfspec.testing.split_device_map is split_device_map
