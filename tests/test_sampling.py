"""Lossless sampling: the generator, the warping, the sampler's exactness, and
temperature 0 leaving greedy decoding untouched.

The distribution tests are goodness-of-fit chi-square tests against the exact filtered softmax
at a fixed false-alarm rate ALPHA = 1e-4 per test: a correct sampler fails one of them with
probability 1e-4 for a random set of seeds. The seeds are fixed (0..N-1), so every run draws
the same tokens and the outcome is reproducible, never flaky; with the 10 tests below, a
correct sampler had at most a 1e-3 chance of a seed set that fails. Each test also shows its
power: the same statistic on the same seeds rejects a wrong sampler (a wrong temperature, no
top-p, uniform instead of Gumbel noise).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from selfspec import Decoder, Sampling, reference_generate
from selfspec._engine.contract.sampling import gumbel_noise, perturb, philox4x32, process_logits
from selfspec.provisional import reference_sample, sample_tokens
from selfspec.testing._models import tiny_model

ALPHA = 1e-4
PROMPT = [5, 17, 3, 99, 42, 7, 64]
SETTINGS = [
    Sampling(1.0, 0, 1.0),
    Sampling(0.7, 10, 1.0),
    Sampling(1.3, 0, 0.9),
    Sampling(1.5, 20, 0.8),
]


@pytest.fixture(scope="module")
def model():
    return tiny_model("qwen3")  # float64; its next-token logits spread over ~30 tokens at T = 1


def first_logits(model) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([PROMPT])).logits[0, -1:]  # [1, V]


def expected_probs(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """The filtered softmax, computed by Hugging Face's own warpers (float64 softmax)."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    scores = logits.to(torch.float32)
    scores = TemperatureLogitsWarper(s.temperature)(None, scores)
    if s.top_k:
        scores = TopKLogitsWarper(s.top_k)(None, scores)
    if s.top_p < 1.0:
        scores = TopPLogitsWarper(s.top_p)(None, scores)
    return scores.to(torch.float64).softmax(-1)[0]


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of Pearson's goodness-of-fit test; bins expecting fewer than 5 are merged.
    Tokens of probability 0 must never be drawn (checked by the callers)."""
    n = float(counts.sum())
    order = torch.argsort(probs, descending=True)
    exp, obs = probs[order] * n, counts[order].to(torch.float64)
    big = exp >= 5
    e = torch.cat([exp[big], exp[~big].sum().reshape(1)])
    o = torch.cat([obs[big], obs[~big].sum().reshape(1)])
    keep = e > 0
    e, o = e[keep], o[keep]
    stat = float(((o - e) ** 2 / e).sum())
    dof = max(1, int(e.numel()) - 1)
    return float(
        torch.special.gammaincc(
            torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
        )
    )


# ------------------------------------------------------------------------------ the generator
def test_philox_known_answers():
    """Random123's known-answer vectors of Philox4x32-10."""
    cases = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ]
    for counter, key, want in cases:
        words = philox4x32(*(torch.tensor([c]) for c in counter), *key)
        assert tuple(int(w) for w in words) == want


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**64 - 1),
    positions=st.lists(st.integers(0, 2**40), min_size=1, max_size=6),
    vocab=st.integers(1, 300),
)
def test_noise_depends_only_on_seed_and_position(seed, positions, vocab):
    """A row is the same whatever else is drawn with it, in what order, and for how many
    tokens (a vocabulary prefix); another seed gives other noise."""
    rows = gumbel_noise(seed, positions, vocab)
    assert rows.shape == (len(positions), vocab) and rows.dtype == torch.float32
    for i, p in enumerate(positions):
        assert torch.equal(rows[i], gumbel_noise(seed, [p], vocab)[0])
        assert (
            torch.equal(rows[i, : vocab // 2], gumbel_noise(seed, [p], vocab // 2)[0])
            if vocab > 1
            else True
        )
    other = gumbel_noise((seed + 1) % 2**64, positions[:1], max(vocab, 8))
    assert not torch.equal(other, gumbel_noise(seed, positions[:1], max(vocab, 8)))


def test_noise_is_standard_gumbel():
    """Mean (Euler's gamma) and variance (pi^2 / 6) of 2^20 draws, within 6 standard errors."""
    g = gumbel_noise(3, range(64), 16384).to(torch.float64).reshape(-1)
    n = g.numel()
    assert abs(float(g.mean()) - 0.5772156649) < 6 * (1.6449 / n) ** 0.5
    assert abs(float(g.var()) - 1.6449340668) < 6 * (2.4 * 1.6449**2 / n) ** 0.5
    assert bool(torch.isfinite(g).all())


@settings(max_examples=30, deadline=None)
@given(
    data=st.data(),
    vocab=st.integers(2, 60),
    temperature=st.floats(0.05, 3.0),
    top_k=st.integers(0, 70),
    top_p=st.floats(0.05, 1.0),
)
def test_warping_equals_hugging_face(data, vocab, temperature, top_k, top_p):
    """process_logits is HF's Temperature -> TopK -> TopP warping, entry for entry."""
    values = data.draw(
        st.lists(st.floats(-20, 20, allow_nan=False), min_size=vocab, max_size=vocab)
    )
    logits = torch.tensor([values], dtype=torch.float32)
    s = Sampling(temperature, top_k, top_p)
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    want = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        want = TopKLogitsWarper(top_k)(None, want)
    if top_p < 1.0:
        want = TopPLogitsWarper(top_p)(None, want)
    assert torch.equal(process_logits(logits, s), want)


def test_sampling_values_are_checked():
    for bad in (
        dict(temperature=-1.0),
        dict(top_k=-1),
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(seed=-1),
    ):
        with pytest.raises(ValueError):
            Sampling(**bad)


def test_vocab_subset_picks_vocabulary_ids():
    """Picking among a subset of columns uses those tokens' own noise and returns their ids."""
    s = Sampling(0.9, 0, 1.0, 5)
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    vocab = torch.tensor([3, 17, 22, 39])
    got = sample_tokens(logits[:, vocab], [10, 11, 12], s, vocab)
    full = perturb(logits, [10, 11, 12], s)  # the subset's entries of the full perturbed rows ...
    masked = torch.full_like(full, float("-inf"))
    masked[:, vocab] = perturb(logits[:, vocab], [10, 11, 12], s, vocab)
    assert torch.equal(got, masked.argmax(-1))  # ... and the argmax among them, as vocabulary ids
    assert set(got.tolist()) <= set(vocab.tolist())
    assert full.shape == masked.shape


# ------------------------------------------------------------------------------ exactness
@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: f"T{s.temperature}-k{s.top_k}-p{s.top_p}")
def test_vanilla_first_token_is_the_filtered_softmax(model, s):
    """vanilla's first sampled token over 1200 seeds fits the filtered softmax (chi-square at
    ALPHA); filtered tokens never appear; and the same test rejects a wrong temperature."""
    n = 1200
    decoder = Decoder(model, "vanilla")
    probs = expected_probs(first_logits(model), s)
    counts = torch.zeros_like(probs)
    for seed in range(n):
        s_i = Sampling(s.temperature, s.top_k, s.top_p, seed)
        tok = decoder.generate(PROMPT, 1, (), sampling=s_i).output_ids[0]
        counts[tok] += 1
    assert float(counts[probs == 0].sum()) == 0
    assert chi_square_p(counts, probs) > ALPHA
    wrong = expected_probs(first_logits(model), Sampling(s.temperature * 1.6, s.top_k, s.top_p))
    assert chi_square_p(counts, wrong) <= ALPHA  # the test can fail


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: f"T{s.temperature}-k{s.top_k}-p{s.top_p}")
def test_sample_tokens_is_exact_over_many_positions(model, s):
    """20000 draws (one seed, 20000 positions: the noise of each position is independent) fit
    the filtered softmax; uniform noise in place of Gumbel noise is rejected on the same draws."""
    n = 20000
    logits = first_logits(model).expand(n, -1)
    probs = expected_probs(first_logits(model), s)
    ids = sample_tokens(logits, range(n), s)
    counts = torch.bincount(ids, minlength=probs.numel()).to(torch.float64)
    assert float(counts[probs == 0].sum()) == 0
    assert chi_square_p(counts, probs) > ALPHA
    u = torch.rand(n, probs.numel(), generator=torch.Generator().manual_seed(0))
    bad = (process_logits(logits, s) + u).argmax(-1)
    assert (
        chi_square_p(torch.bincount(bad, minlength=probs.numel()).to(torch.float64), probs) <= ALPHA
    )


def test_hugging_face_sampling_has_the_same_distribution(model):
    """HF ``generate(do_sample=True, temperature, top_k, top_p)``'s first token over 600 of its
    own seeds and vanilla's over 600 seeds: both fit the same filtered softmax (HF's RNG makes
    the tokens differ one by one; the distributions must not)."""
    s = Sampling(1.2, 30, 0.9)
    probs = expected_probs(first_logits(model), s)
    n = 600
    hf, ours = torch.zeros_like(probs), torch.zeros_like(probs)
    ids = torch.tensor([PROMPT])
    decoder = Decoder(model, "vanilla")
    for seed in range(n):
        torch.manual_seed(seed)
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=s.temperature,
            top_k=s.top_k,
            top_p=s.top_p,
            max_new_tokens=1,
            pad_token_id=0,
        )
        hf[int(out[0, -1])] += 1
        ours[
            decoder.generate(PROMPT, 1, (), sampling=Sampling(1.2, 30, 0.9, seed)).output_ids[0]
        ] += 1
    for counts in (hf, ours):
        assert float(counts[probs == 0].sum()) == 0
        assert chi_square_p(counts, probs) > ALPHA
    no_top_p = expected_probs(first_logits(model), Sampling(1.2, 30, 1.0))
    assert chi_square_p(hf, no_top_p) <= ALPHA  # the test sees top-p


# ------------------------------------------------------------------------------ the decode
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_vanilla_sampling_equals_the_reference(arch):
    """The host's vanilla loop and the oracle (HF forward, one token at a time) agree token for
    token for several seeds; different seeds give different outputs."""
    m = tiny_model(arch)
    outs = []
    for seed in range(4):
        s = Sampling(0.9, 40, 0.95, seed)
        got = Decoder(m, "vanilla", sampling=s).generate(PROMPT, 24, ()).output_ids
        assert got == reference_sample(m, PROMPT, 24, (), s)
        outs.append(tuple(got))
    assert len(set(outs)) > 1


def test_temperature_zero_is_greedy_bit_for_bit(model):
    """Temperature 0 (whatever top-k, top-p and seed say) gives today's greedy output, runs
    no sampler, and equals HF greedy generate."""
    seen = []

    class Spy:
        from selfspec import hookimpl

        @hookimpl
        def selfspec_start(self, state):
            seen.append(state.sampler)

    greedy = Decoder(model, "vanilla").generate(PROMPT, 20, ()).output_ids
    for s in (Sampling(), Sampling(0.0, 5, 0.5, 9)):
        assert (
            Decoder(model, "spy", plugin_object=Spy, sampling=s).generate(PROMPT, 20, ()).output_ids
            == greedy
        )
    assert seen == [None, None]
    assert greedy == reference_generate(model, PROMPT, 20, ())
    assert (
        Decoder(model, "vanilla")
        .generate(PROMPT, 20, (), sampling=Sampling(0.8, seed=1))
        .output_ids
        != greedy
    )
