"""Lossless sampling: temperature, top-k, top-p and a seed, by position-keyed Gumbel noise.

The token at absolute position ``t`` (its index in prompt + output) is

    argmax_v( process(logits_t)[v] + g(seed, t, v) )

where ``process`` is Hugging Face's warping (``logits / T`` in float32, then top-k, then top-p;
filtered entries ``-inf``) and ``g(seed, t, ·)`` is standard Gumbel noise from a counter-based
generator (Philox4x32-10) keyed only by ``(seed, t)``. By the Gumbel-max theorem the token is
an exact sample of the filtered softmax, and because the noise of a position depends on nothing
else (not on how many tokens were drafted, tried or rejected before), a decode that verifies
drafts greedily against these *perturbed* logits commits exactly the tokens plain sampling
(``vanilla``) commits with the same seed. Temperature 0 is plain greedy decoding: no noise
code runs (``docs/losslessness.md``).

The generator runs on integer tensor ops only (no global RNG, nothing that depends on the
number of earlier draws), so the 32-bit stream is identical on every device; its uniform ->
Gumbel transform is one float64 ``log`` pair, rounded to float32.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from selfspec._engine.contract.reference import greedy, reference_generate
from selfspec._engine.runner.cache import cache_argument, output_cache
from selfspec._engine.runner.placement import model_device

_MASK32 = 0xFFFFFFFF
_PHILOX_M = (0xD2511F53, 0xCD9E8D57)
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)
_ROUNDS = 10
_DOMAIN = 0x53504543  # the fourth counter word: "SPEC", so this stream is no other use's


@dataclass(frozen=True)
class Sampling:
    """How a decode picks its tokens: lossless sampling for every plugin (why it is lossless:
    [losslessness.md](docs/losslessness.md#sampling)).

    ``temperature`` 0 is greedy (the default) and runs no sampling code; above 0 it samples
    from ``softmax(logits / temperature)`` restricted to the ``top_k`` most likely tokens
    (0 = all) and to the smallest set whose probability reaches ``top_p`` (1.0 = all), with
    noise keyed by ``seed`` and the position. Hugging Face's order: temperature, top-k, top-p.
    Precisely, the token at absolute position ``t`` is ``argmax(process(logits) + g(seed,
    t))``: ``process`` is Hugging Face's warping in float32 (``/ temperature``, then top-k,
    then top-p; filtered entries ``-inf``) and ``g(seed, t, ·)`` standard Gumbel noise from
    Philox4x32-10 keyed only by ``(seed, t)``. A ``ValueError`` for a value out of range."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: no top-k filter), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        if not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must lie in [0, 2**64), got {self.seed}")

    @property
    def greedy(self) -> bool:
        """Temperature 0: plain greedy decoding, top-k/top-p/seed ignored."""
        return self.temperature == 0.0

    def as_dict(self) -> dict[str, float | int]:
        """The JSON form: ``temperature``, ``top_k``, ``top_p``, ``seed``."""
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "seed": self.seed,
        }

    def scores(self, logits: torch.Tensor, position: int) -> torch.Tensor:
        """``[V]`` logits predicting absolute ``position`` -> ``[V]`` float32 perturbed scores
        (:func:`perturb`): the sampled token is their argmax."""
        return perturb(logits[None], [position], self)[0]

    def margin(self, model: torch.nn.Module, ids: Sequence[int]) -> float:
        """:func:`perturbed_margin` of the token after ``ids`` (the near-tie measure)."""
        return perturbed_margin(model, ids, self)


GREEDY = Sampling()


def sample_tokens(
    logits: torch.Tensor,
    positions: torch.Tensor | Sequence[int],
    sampling: Sampling,
    vocab: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[n, V]`` logits -> ``[n]`` int64 token ids: row ``i`` picks the token at absolute
    position ``positions[i]``: what ``state.pick`` does without the decode's cache of noise
    rows. Greedy (:func:`selfspec.greedy`) when ``sampling`` is greedy.
    ``vocab`` ``[V']``: the logits' columns are these token ids (a vocabulary subset); the
    ids returned are then vocabulary ids, not column indices."""
    if sampling.greedy:
        ids = greedy(logits)
    else:
        ids = perturb(logits, positions, sampling, vocab).argmax(-1)
    return ids if vocab is None else vocab.index_select(0, ids.reshape(-1)).reshape(ids.shape)


def perturb(
    logits: torch.Tensor,
    positions: torch.Tensor | Sequence[int],
    sampling: Sampling,
    vocab: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[n, V]`` -> ``[n, V]`` float32: :func:`process_logits` plus the Gumbel noise of each
    row's position (``noise`` ``[n, V_full]``, when the caller has it already); the sampled
    token is the argmax. ``vocab`` as in :func:`sample_tokens`."""
    if noise is None:
        noise = gumbel_noise(sampling.seed, positions, _full_vocab(logits, vocab), logits.device)
    if vocab is not None:
        noise = noise.index_select(1, vocab)
    return process_logits(logits, sampling) + noise


def process_logits(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Hugging Face's warping of ``[..., V]`` logits, in float32: ``/ temperature``, then
    top-k (ties with the k-th value kept), then top-p (drop the least likely tokens whose
    cumulative probability is at most ``1 - top_p``; the most likely always stays)."""
    scores = logits.to(torch.float32) / sampling.temperature
    vocab = scores.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = torch.topk(scores, sampling.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        ordered, order = torch.sort(scores, descending=False, dim=-1)
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1 - sampling.top_p)
        drop[..., -1:] = False
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return scores


def gumbel_noise(
    seed: int,
    positions: torch.Tensor | Sequence[int] | Iterable[int],
    vocab_size: int,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """``[n, vocab_size]`` float32 standard Gumbel noise: row ``i`` is a function of ``(seed,
    positions[i])`` only. Philox4x32-10 with key ``seed`` and counter ``(j, t_lo, t_hi,
    "SPEC")`` gives the 32-bit words ``4j..4j+3`` of position ``t``; ``u = (x + 0.5) / 2**32``,
    ``g = -log(-log(u))`` (in float64)."""
    pos = torch.as_tensor(
        list(positions) if not isinstance(positions, torch.Tensor) else positions,
        dtype=torch.int64,
        device=device,
    ).reshape(-1, 1)  # [n, 1]
    if int(pos.numel()) and int(pos.min()) < 0:
        raise ValueError("positions must be >= 0")
    blocks = (vocab_size + 3) // 4
    j = torch.arange(blocks, dtype=torch.int64, device=pos.device).reshape(1, -1)  # [1, B]
    c0 = j.expand(pos.shape[0], blocks)
    c1 = (pos & _MASK32).expand_as(c0)
    c2 = (pos >> 32).expand_as(c0)
    c3 = torch.full_like(c0, _DOMAIN)
    words = philox4x32(c0, c1, c2, c3, seed & _MASK32, (seed >> 32) & _MASK32)  # 4 x [n, B]
    x = torch.stack(words, dim=-1).reshape(pos.shape[0], 4 * blocks)[:, :vocab_size]
    u = (x.to(torch.float64) + 0.5) * 2.0**-32
    return (-torch.log(-torch.log(u))).to(torch.float32)


def philox4x32(
    c0: torch.Tensor,
    c1: torch.Tensor,
    c2: torch.Tensor,
    c3: torch.Tensor,
    k0: int,
    k1: int,
    rounds: int = _ROUNDS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32 (Salmon et al. 2011) on int64 tensors holding 32-bit words; exact on any
    device (every product is split so that nothing exceeds 2**49)."""
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + _PHILOX_W[0]) & _MASK32, (k1 + _PHILOX_W[1]) & _MASK32
        hi0, lo0 = _mulhilo(_PHILOX_M[0], c0)
        hi1, lo1 = _mulhilo(_PHILOX_M[1], c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of ``a * b`` (``a`` a 32-bit constant, ``b`` 32-bit words)."""
    p_lo = (b & 0xFFFF) * a  # < 2**48
    p_hi = (b >> 16) * a  # < 2**48
    hi = (p_hi + (p_lo >> 16)) >> 16
    lo = (((p_hi & 0xFFFF) << 16) + p_lo) & _MASK32
    return hi, lo


def _full_vocab(logits: torch.Tensor, vocab: torch.Tensor | None) -> int:
    return int(logits.shape[-1]) if vocab is None else int(vocab.max()) + 1


class Sampler:
    """The sampling of one decode (``state.sampler``): :class:`Sampling` plus a per-position
    cache of the noise rows, so each position's noise is computed once however often it is
    drafted and verified. :meth:`forget_before` drops the rows of committed positions."""

    def __init__(
        self, sampling: Sampling, vocab_size: int, device: torch.device | str = "cpu"
    ) -> None:
        self.sampling = sampling
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self._rows: dict[int, torch.Tensor] = {}

    @property
    def greedy(self) -> bool:
        return self.sampling.greedy

    def noise(self, positions: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """``[n, V]`` Gumbel noise of the positions (cached per position)."""
        ps = [
            int(p)
            for p in (positions.tolist() if isinstance(positions, torch.Tensor) else positions)
        ]
        missing = sorted(set(ps) - self._rows.keys())
        if missing:
            rows = gumbel_noise(self.sampling.seed, missing, self.vocab_size, self.device)
            self._rows.update(zip(missing, rows))
        if not ps:
            return torch.empty(0, self.vocab_size, dtype=torch.float32, device=self.device)
        return torch.stack([self._rows[p] for p in ps])

    def perturb(
        self,
        logits: torch.Tensor,
        positions: torch.Tensor | Sequence[int],
        vocab: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[n, V]`` perturbed logits (:func:`perturb`) of rows picking ``positions``."""
        return perturb(logits, positions, self.sampling, vocab, noise=self.noise(positions))

    def pick(
        self,
        logits: torch.Tensor,
        positions: torch.Tensor | Sequence[int],
        vocab: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """:func:`sample_tokens` with the cached noise; plain :func:`selfspec.greedy` at T = 0."""
        if self.greedy:
            ids = greedy(logits)
            return (
                ids if vocab is None else vocab.index_select(0, ids.reshape(-1)).reshape(ids.shape)
            )
        squeeze = logits.dim() == 1
        rows = logits[None] if squeeze else logits
        ids = self.perturb(rows, positions, vocab).argmax(-1)
        if vocab is not None:
            ids = vocab.index_select(0, ids)
        return ids[0] if squeeze else ids

    def forget_before(self, position: int) -> None:
        """Drop the cached noise of positions below ``position`` (already committed)."""
        for p in [p for p in self._rows if p < position]:
            del self._rows[p]


# ------------------------------------------------------------------------------ the oracle
@torch.inference_mode()
def reference_sample(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    eos_token_ids: Iterable[int] = (),
    sampling: Sampling = GREEDY,
) -> list[int]:
    """Plain sampling with ``sampling``: one token at a time through the model's own Hugging
    Face forward (its own KV cache), each picked by :func:`sample_tokens` at its position. The
    reference every sampling losslessness check compares with (greedy: ``reference_generate``)."""
    if sampling.greedy:
        return reference_generate(model, prompt_ids, max_new_tokens, eos_token_ids)
    eos = set(eos_token_ids)
    device = model_device(model)
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
    out: list[int] = []
    past = None
    position = ids.shape[1]
    step_ids = ids
    while len(out) < max_new_tokens:
        res = model(step_ids, use_cache=True, **{cache_argument(model.forward): past})
        past = output_cache(res)
        tok = int(sample_tokens(res.logits[0, -1:], [position], sampling)[0])
        out.append(tok)
        if tok in eos:
            break
        position += 1
        step_ids = torch.tensor([[tok]], dtype=torch.long, device=device)
    return out


@torch.inference_mode()
def perturbed_margin(model: torch.nn.Module, ids: Sequence[int], sampling: Sampling) -> float:
    """Top-1/top-2 margin of the perturbed logits (:func:`perturb`) of the token after ``ids``
    (at position ``len(ids)``): the near-tie measure of a sampling decode."""
    device = model_device(model)
    logits = model(torch.tensor([list(ids)], device=device)).logits[0, -1:]
    top = torch.topk(perturb(logits, [len(ids)], sampling)[0], 2).values
    return float(top[0] - top[1])
