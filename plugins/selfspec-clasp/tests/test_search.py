"""The layer search: sequence-parallel layer evaluation and the dynamic program vs brute force."""

import itertools
import random

import pytest
import torch
from selfspec_clasp.search import _cos, layer_search, run_layer

from selfspec import Runner
from selfspec.testing import ARCHS, tiny_model


def _deep(arch, n_layers, **kw):
    """A tiny model with ``n_layers`` layers (Gemma 3 alternates sliding and full layers)."""
    if arch == "gemma3":
        kw["layer_types"] = ["sliding_attention", "full_attention"] * (n_layers // 2) + [
            "sliding_attention"
        ] * (n_layers % 2)
    return tiny_model(arch, num_hidden_layers=n_layers, **kw)


def _prefilled(model, prompt):
    """A runner and a cache holding ``prompt[:-1]``, and the full-model states ``[L+1, H]``
    of the last prompt token at its slot (as the verifier captures them)."""
    runner = Runner(model)
    cache = runner.new_cache(len(prompt) + 4)
    ids = torch.tensor(prompt)
    runner.forward(ids[:-1], cache=cache, start=0, logits=None)
    slot = len(prompt) - 1
    L = runner.n_layers
    out = runner.forward(
        ids[-1:], cache=cache, start=slot, write=False, capture=range(L + 1), logits=None
    )
    states = torch.stack([out.captured[i][0] for i in range(L + 1)])
    return runner, cache, slot, states


def _skip_cosine(runner, cache, token, slot, skip, target):
    """Cosine with ``target`` of the token's last-layer state when ``skip`` is left out."""
    out = runner.forward(
        torch.tensor([token]),
        cache=cache,
        start=slot,
        skip_attn=skip,
        skip_mlp=skip,
        write=False,
        logits=None,
    )
    return float(_cos(out.hidden[0], target)[0])


@pytest.mark.parametrize("arch", ARCHS)
def test_sequence_parallel_equals_one_by_one(arch):
    # a) prompts longer than the sliding windows, so the windowed layers mask part of the prefix
    model = tiny_model(arch)
    runner, cache, slot, states = _prefilled(model, [4, 8, 15, 16, 23, 42, 7, 9, 11])
    lengths = list(cache.lengths)
    keys = [k.clone() for k in cache.keys]
    gen = torch.Generator().manual_seed(0)
    cands = torch.randn(5, states.shape[1], generator=gen, dtype=states.dtype) * states.std()
    for layer in range(runner.n_layers):
        together = run_layer(runner, cache, layer, cands, slot)  # [5, H]
        for j in range(cands.shape[0]):
            alone = run_layer(runner, cache, layer, cands[j : j + 1], slot)  # [1, H]
            torch.testing.assert_close(together[j], alone[0], rtol=1e-10, atol=1e-10)
    # b) read-only: nothing was written
    assert cache.lengths == lengths
    assert all(torch.equal(a, b) for a, b in zip(keys, cache.keys))


@pytest.mark.parametrize("arch", ARCHS)
def test_run_layer_on_the_true_state_gives_the_next_true_state(arch):
    # c) the token's own slot and position: layer i on x_i reproduces the full model's x_{i+1}
    runner, cache, slot, states = _prefilled(tiny_model(arch), [4, 8, 15, 16, 23, 42, 7])
    for i in range(runner.n_layers):
        torch.testing.assert_close(
            run_layer(runner, cache, i, states[i : i + 1], slot)[0], states[i + 1]
        )


@pytest.mark.parametrize("arch", ARCHS)
def test_search_cosine_is_the_chosen_sets_cosine(arch):
    # d) the program's D(L, M) is exactly the cosine of the draft model it returns: the
    # backtracked set, run as a skipping forward, reproduces g(L, M)
    prompt = [4, 8, 15, 16, 23, 42, 7]
    runner, cache, slot, states = _prefilled(_deep(arch, 6), prompt)
    for m in range(runner.n_layers + 1):
        found = layer_search(runner, cache, states, m, slot)
        assert len(found.skip) == m == len(set(found.skip))
        got = _skip_cosine(runner, cache, prompt[-1], slot, found.skip, states[-1])
        assert found.cosine == pytest.approx(got, abs=1e-9)


def test_search_is_close_to_brute_force_and_beats_random_sets():
    # e) the paper's Fig. 3b check on models small enough to try every set: 10 layers, skip 4
    # (210 sets). Averaged over 3 models x 3 positions; the random sets come from a seeded
    # generator, so the test is deterministic
    L, M = 10, 4
    rng = random.Random(0)
    dp, best, rand = [], [], []
    for seed in range(3):
        model = _deep("llama", L, seed=seed)
        for n in (5, 9, 13):
            prompt = [rng.randrange(128) for _ in range(n)]
            runner, cache, slot, states = _prefilled(model, prompt)
            found = layer_search(runner, cache, states, M, slot)
            every = {
                s: _skip_cosine(runner, cache, prompt[-1], slot, s, states[-1])
                for s in itertools.combinations(range(L), M)
            }
            dp.append(every[found.skip])
            best.append(max(every.values()))
            rand.append(sum(every[tuple(sorted(rng.sample(range(L), M)))] for _ in range(20)) / 20)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    print(f"mean cosine: dp {mean(dp):.4f}, brute force {mean(best):.4f}, random {mean(rand):.4f}")
    assert mean(dp) > mean(rand)
    assert mean(best) - mean(dp) < 0.25 * (mean(best) - mean(rand))
