"""The greedy oracle: what ``model.generate(do_sample=False)`` gives, and how to compare.

``greedy`` is the one argmax every verifier uses: like Hugging Face's ``generate`` it casts
logits to float32 before taking the argmax (first index wins a tie), so float64 decoding
agrees with ``generate`` token for token.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from selfspec._engine.contract.tiebound import tie_bound
from selfspec._engine.runner.placement import model_device

#: The fixed near-tie tolerances used before the bound became principled; superseded by
#: :func:`selfspec._engine.contract.tiebound.tie_bound` (which every check uses: float32 1e-3 and
#: float64 0 as here, bf16/float16 a few ulps at the logits' magnitude). Kept for code that
#: imports it.
NEAR_TIE_TOLERANCE: dict[torch.dtype, float] = {
    torch.float64: 0.0,
    torch.float32: 1e-3,
    torch.bfloat16: 0.1,
    torch.float16: 0.05,
}


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """``[..., V]`` -> ``[...]`` int64: argmax over float32 logits (generate's rule), the
    host's one definition of a greedy token."""
    return logits.to(torch.float32).argmax(-1)


@torch.inference_mode()
def reference_generate(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    eos_token_ids: Iterable[int] = (),
) -> list[int]:
    """New tokens of plain greedy decoding by ``model.generate(do_sample=False)``: Hugging
    Face's own greedy decoding, the reference every losslessness check compares with. The new
    tokens only (never the prompt, like ``Result.output_ids``), at most ``max_new_tokens``,
    ending with the first of ``eos_token_ids`` when one comes (EOS included; see
    [the question](docs/faq.md#what-does-reference_generate-return)).

    The model's own generation config (repetition penalties and the like) is replaced by a
    plain greedy one: selfspec decodes plain greedy, and that is what it is compared with.
    """
    from transformers import GenerationConfig  # here: importing selfspec must not load transformers

    eos = sorted(set(eos_token_ids))
    # no EOS ids: never stop early. ``None`` would let generate fill in the model's own EOS ids,
    # so it is given one id past the vocabulary, which no step produces
    never = [int(getattr(model.config, "vocab_size", 0) or 0) + 1]
    cfg = GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        eos_token_id=eos or never,
        pad_token_id=eos[0] if eos else 0,
        num_beams=1,
    )
    device = model_device(model)
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=cfg)
    new = out[0, ids.shape[1] :].tolist()
    if eos:  # generate pads after EOS when stopping early in batch; we have batch 1, trim anyway
        for i, t in enumerate(new):
            if t in eos:
                return new[: i + 1]
    return new


@dataclass(frozen=True)
class Comparison:
    """Outcome of comparing an output with the greedy reference."""

    equal: bool
    index: int | None = None  # first differing position in the new tokens
    margin: float | None = None  # reference top-1/top-2 logit margin there
    near_tie: bool = False
    bound: float | None = None  # the near-tie bound the margin was judged against

    @property
    def ok(self) -> bool:
        return self.equal or self.near_tie


@torch.inference_mode()
def next_logits(model: torch.nn.Module, ids: Sequence[int]) -> torch.Tensor:
    """The model's next-token logits after ``ids``: ``[V]`` float32."""
    device = model_device(model)
    return model(torch.tensor([list(ids)], device=device)).logits[0, -1].to(torch.float32)


def top2_margin(model: torch.nn.Module, ids: Sequence[int]) -> float:
    """Top-1/top-2 logit margin of the model's next-token prediction after ``ids``."""
    top = torch.topk(next_logits(model, ids), 2).values
    return float(top[0] - top[1])


def compare(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    output: Sequence[int],
    reference: Sequence[int],
    tolerance: float | None = None,
    sampling: Any = None,
) -> Comparison:
    """Compare ``output`` with ``reference`` under the near-tie rule.

    Equal sequences pass. Otherwise find the first difference ``i`` (a length difference
    counts: one stopped, the other did not) and the reference model's top-1/top-2 margin after
    ``prompt + reference[:i]``; a margin at or below ``tolerance`` (default: the model dtype's
    bound :func:`selfspec._engine.contract.tiebound.tie_bound` at those logits; zero in float64, so
    any difference fails there), with the output's token there within ``tolerance`` of the
    reference's top-1, is a near-tie. Never retried. With ``sampling`` (a
    :class:`selfspec._engine.contract.sampling.Sampling` that samples) the scores compared are the
    perturbed logits (:func:`selfspec._engine.contract.sampling.perturb` at that position) and the
    bound is divided by the temperature (the warping scales rounding differences by ``1 / T``).
    """
    output, reference = list(output), list(reference)
    if output == reference:
        return Comparison(True)
    i = next(
        (j for j, (a, b) in enumerate(zip(output, reference)) if a != b),
        min(len(output), len(reference)),
    )
    logits = next_logits(model, list(prompt_ids) + reference[:i])  # [V]
    if tolerance is None:
        tolerance = tie_bound(next(model.parameters()).dtype, logits)
    scores = logits
    if sampling is not None and not sampling.greedy:
        scores = sampling.scores(logits, len(prompt_ids) + i)  # [V] perturbed
        tolerance = tolerance / sampling.temperature
    top = torch.topk(scores, 2).values
    margin = float(top[0] - top[1])
    near = tolerance > 0 and margin <= tolerance
    if near and i < len(output):  # and the output's token is itself one of the near-tied ones
        near = float(scores[output[i]]) >= float(top[0]) - tolerance
    return Comparison(False, i, margin, near_tie=near, bound=tolerance)
