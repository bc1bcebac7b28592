"""``assert_lossless``: a plugin's output against plain greedy decoding (or plain sampling with
the same seed) of the same model."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from ..audit import AuditError, Auditor
from ..loop import Decoder
from ..reference import compare
from ..sampling import Sampling, reference_sample
from ..tiebound import explain
from ..types import Result


class NearTieWarning(UserWarning):
    """A float32/bf16 output left the reference at a near-tied logit (allowed, reported)."""


class LosslessError(AssertionError):
    """The plugin's output differs from greedy decoding of the same model."""


def assert_lossless(
    model: torch.nn.Module,
    plugin: str | Decoder,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    options: Mapping[str, Any] | None = None,
    *,
    plugin_object: Any = None,
    eos_token_ids: Iterable[int] = (),
    tolerance: float | None = None,
    record: Callable[[Result, Auditor], None] | None = None,
    sampling: Sampling | None = None,
) -> Result:
    """Decode ``prompt_ids`` with ``plugin`` and check it equals ``model.generate(do_sample=False)``.

    ``plugin`` is an installed plugin's name (with ``options`` and, for an unpackaged plugin,
    ``plugin_object``), or a ready :class:`~selfspec.Decoder` over ``model``.

    float64: any difference raises :class:`LosslessError` naming the first differing index,
    both continuations from there, and the reference's top-1/top-2 logit margin at it.
    float32/bf16/float16: a first difference is allowed only where that margin is at most
    ``tolerance`` (default :func:`selfspec.tiebound.tie_bound` of the model's dtype at the
    reference's logits there: 1e-3 in float32, 4 ulps of the logits' magnitude in bf16/float16);
    it is then a *near-tie*: the returned result has ``near_ties == 1`` and a
    :class:`NearTieWarning` gives the margin. Nothing is ever retried.

    The decode always runs in audit mode (:mod:`selfspec.audit`): a wrong token, a wrong KV
    slot or a touched committed token raises :class:`LosslessError` at the step where it
    happens, naming the hook at fault, before any comparison of whole outputs. ``record`` is
    called with the result and the decode's :class:`~selfspec.audit.Auditor` (its per-step
    log): the kit's coverage counters use it.

    ``sampling`` (a :class:`selfspec.sampling.Sampling` with temperature > 0): decode with it
    and compare with plain sampling under the same seed (:func:`selfspec.sampling.reference_sample`,
    the model's own forward one token at a time); the near-tie margin is then that of the
    perturbed logits, against the tolerance divided by the temperature.
    """
    if isinstance(plugin, Decoder):
        if plugin.model is not model:
            raise ValueError("the Decoder passed to assert_lossless drives another model")
        decoder = plugin
    else:
        decoder = Decoder(model, plugin, options, plugin_object=plugin_object)
    eos = tuple(eos_token_ids)
    prompt = [int(t) for t in prompt_ids]
    dtype = next(model.parameters()).dtype
    audit, decoder.audit, decoder.audit_tolerance = decoder.audit, True, tolerance
    try:
        result = decoder.generate(prompt, max_new_tokens=max_new_tokens, eos_token_ids=eos, sampling=sampling)
    except AuditError as exc:
        raise LosslessError(f"{exc}\n  (prompt of {len(prompt)} tokens, max_new_tokens={max_new_tokens}, "
                            f"{dtype}, options {decoder.options})") from exc
    finally:
        decoder.audit, decoder.audit_tolerance = audit, None
    auditor = decoder.auditor
    assert auditor is not None
    if record is not None:
        record(result, auditor)
    sampling = decoder.sampling if sampling is None else sampling
    reference = reference_sample(model, prompt, max_new_tokens, eos, sampling)
    if dtype == torch.float64:
        tolerance = 0.0  # exact in float64, whatever was asked
    cmp = compare(model, prompt, result.output_ids, reference, tolerance=tolerance, sampling=sampling)
    if cmp.equal:
        return result
    name = decoder.plugin_name
    i = cmp.index
    assert i is not None and cmp.margin is not None and cmp.bound is not None
    where = (
        f"plugin {name!r} diverges from {'greedy decoding' if sampling.greedy else sampling} at new token {i} "
        f"(prompt of {len(prompt)} tokens, max_new_tokens={max_new_tokens}, {dtype}):\n"
        f"  plugin:    {result.output_ids[:i]} | {result.output_ids[i:i + 12]}\n"
        f"  reference: {reference[:i]} | {reference[i:i + 12]}\n"
        f"  reference top-1/top-2 logit margin there: {cmp.margin:.3g} ({explain(dtype, cmp.margin, cmp.bound)})"
    )
    if not cmp.near_tie:
        raise LosslessError(where)
    warnings.warn(f"near-tie: {where}", NearTieWarning, stacklevel=2)
    result.near_ties += 1
    return result
