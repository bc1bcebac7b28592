"""The slot-indexed KV cache: crop, keep (crop or gather), read-only views, errors."""

from __future__ import annotations

import pytest
import torch

from selfspec._engine.runner import CacheError, KVCache, Runner

HEADS, DIM = 2, 3


def filled(n_layers: int = 3, length: int = 6, capacity: int = 10) -> KVCache:
    """A cache whose key at (layer i, slot j) is ``100*i + j`` (values: negated), positions =
    slots."""
    cache = KVCache(n_layers, capacity)
    for i in range(n_layers):
        k = (
            (100.0 * i + torch.arange(length, dtype=torch.float64))
            .reshape(1, 1, length, 1)
            .expand(1, HEADS, length, DIM)
        )
        cache.view(i, 0).update(k.clone(), -k.clone(), i)
    cache.pos[:length] = torch.arange(length)
    return cache


def key_ids(cache: KVCache, layer: int) -> list[int]:
    n = cache.lengths[layer]
    return [int(x) for x in cache.keys[layer][0, 0, :n, 0].tolist()]


def test_update_appends_and_reports_length():
    cache = filled()
    assert cache.lengths == [6, 6, 6] and cache.length == 6
    assert key_ids(cache, 1) == [100, 101, 102, 103, 104, 105]
    assert torch.equal(cache.values[2][0, 0, :6, 0], -cache.keys[2][0, 0, :6, 0])


def test_crop_all_and_per_layer_range():
    cache = filled()
    cache.crop(4)
    assert cache.lengths == [4, 4, 4]
    cache.crop(2, layers=range(1, 3))
    assert cache.lengths == [4, 2, 2]
    with pytest.raises(CacheError, match="different lengths"):
        _ = cache.length
    cache.crop(5)  # crop never grows a layer
    assert cache.lengths == [4, 2, 2]
    with pytest.raises(ValueError):
        cache.crop(-1)


def test_keep_chain_prefix_is_a_crop():
    cache = filled()
    keys_before = [k.clone() for k in cache.keys]
    cache.keep(3, [0, 1])  # pending at slot 3 and one accepted token
    assert cache.lengths == [5, 5, 5]
    assert all(torch.equal(k, kb) for k, kb in zip(cache.keys, keys_before))


def test_keep_tree_path_gathers_keys_values_positions():
    cache = filled(length=8)
    cache.pos[:8] = torch.tensor([0, 1, 2, 3, 4, 4, 5, 5])  # a tree block from slot 3 on
    cache.keep(3, [0, 2, 4])  # pending (slot 3), then slots 5 and 7
    assert cache.lengths == [6, 6, 6]
    for i in range(3):
        assert key_ids(cache, i) == [100 * i + j for j in (0, 1, 2, 3, 5, 7)]
        assert cache.values[i][0, 1, :6, 2].tolist() == [
            -(100.0 * i + j) for j in (0, 1, 2, 3, 5, 7)
        ]
    assert cache.pos[:6].tolist() == [0, 1, 2, 3, 4, 5]


def test_keep_on_a_layer_range_only():
    cache = filled(length=8)
    cache.keep(2, [0, 3], layers=[1])
    assert cache.lengths == [8, 4, 8]
    assert key_ids(cache, 1) == [100, 101, 102, 105]
    assert key_ids(cache, 0)[:4] == [0, 1, 2, 3]  # untouched


def test_keep_rejects_bad_slots():
    cache = filled()
    with pytest.raises(ValueError, match="increasing"):
        cache.keep(2, [0, 2, 1])
    with pytest.raises(ValueError, match=">= 0"):
        cache.keep(2, [-1, 0])
    with pytest.raises(CacheError):
        cache.keep(4, [0, 5])  # slot 9 was never written
    with pytest.raises(CacheError):
        cache.keep(5, [0, 1, 2])  # a chain past the valid length


def test_reading_unwritten_slots_raises():
    cache = filled()
    cache.crop(2, layers=[1])
    with pytest.raises(CacheError, match="never written"):
        cache.view(1, 4)
    cache.view(0, 4)  # fine: layer 0 holds 6


def test_capacity_overflow_raises():
    cache = filled(capacity=8)
    k = torch.zeros(1, HEADS, 3, DIM, dtype=torch.float64)
    with pytest.raises(CacheError, match="capacity"):
        cache.view(0, 6).update(k, k, 0)
    assert cache.lengths[0] == 6
    with pytest.raises(ValueError):
        KVCache(2, 0)


def test_read_only_view_does_not_write():
    cache = filled()
    before = cache.keys[0].clone()
    k = torch.full((1, HEADS, 2, DIM), 7.0, dtype=torch.float64)
    keys, values = cache.view(0, 6, write=False).update(k, -k, 0)
    assert keys.shape[2] == 8 and keys[0, 0, 6:, 0].tolist() == [7.0, 7.0]
    assert cache.lengths[0] == 6 and torch.equal(cache.keys[0], before)


def test_runner_cache_after_tree_keep_equals_chain_cache(tiny_model_factory):
    """A kept tree path leaves the same keys/values as running the path as a chain.

    Also a regression test: ``keep`` called outside inference mode (here, outside the decode
    loop) used to fail on the inference-tensor buffers ``Runner.forward`` allocates."""
    from selfspec._engine.runner import masks

    runner = Runner(tiny_model_factory("gemma3"))
    prompt = torch.arange(3, 15)
    parents = torch.tensor([-1, -1, 0, 1, 3, 2])
    nodes = torch.tensor([20, 21, 22, 23, 24, 25])
    tree_cache = runner.new_cache(32)
    runner.forward(prompt[:-1], cache=tree_cache)
    base = len(prompt) - 1
    runner.forward(
        torch.cat([prompt[-1:], nodes]),
        cache=tree_cache,
        start=base,
        positions=masks.tree_positions(parents, base),
        block_mask=masks.tree(parents),
    )
    tree_cache.keep(base, [0, 2, 4, 5])  # pending -> node 1 -> node 3 -> node 4
    chain_cache = runner.new_cache(32)
    runner.forward(torch.cat([prompt, nodes[[1, 3, 4]]]), cache=chain_cache)
    assert tree_cache.lengths == chain_cache.lengths
    n = chain_cache.length
    for i in range(runner.n_layers):
        torch.testing.assert_close(
            tree_cache.keys[i][:, :, :n], chain_cache.keys[i][:, :, :n], rtol=1e-10, atol=1e-10
        )
        torch.testing.assert_close(
            tree_cache.values[i][:, :, :n], chain_cache.values[i][:, :, :n], rtol=1e-10, atol=1e-10
        )
    assert tree_cache.pos[:n].tolist() == list(range(n))
