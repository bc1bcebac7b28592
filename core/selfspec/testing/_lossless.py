"""``assert_lossless``: a plugin's output against plain greedy decoding (or plain sampling with
the same seed) of the same model."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from selfspec._engine.contract.audit import AuditError, Auditor, LosslessError, WeightGuard
from selfspec._engine.contract.loop import Decoder
from selfspec._engine.contract.reference import compare, reference_generate
from selfspec._engine.contract.sampling import Sampling, reference_sample
from selfspec._engine.contract.tiebound import explain
from selfspec._engine.contract.types import Result
from selfspec.testing._report import around


class NearTieWarning(UserWarning):
    """A float32/bf16 output left the reference at a near-tied logit (allowed, reported)."""


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
    exact: bool | None = None,
) -> Result:
    """Decode ``prompt_ids`` with ``plugin`` and check it equals
    ``model.generate(do_sample=False)``.

    ``plugin`` is an installed plugin's name (with ``options`` and, for an unpackaged plugin,
    ``plugin_object``), or a ready :class:`~selfspec.Decoder` over ``model``.

    float64: any difference raises :class:`LosslessError` naming the first differing index,
    both continuations from there, and the reference's top-1/top-2 logit margin at it.
    float32/bf16/float16: a first difference is allowed only where that margin is at most
    ``tolerance`` (default :func:`selfspec._engine.contract.tiebound.tie_bound` of the model's dtype
    at the reference's logits there: 1e-3 in float32, 4 ulps of the logits' magnitude in
    bf16/float16); it is then a *near-tie*: the returned result has ``near_ties == 1`` and a
    :class:`NearTieWarning` gives the margin. Nothing is ever retried.

    The decode always runs in audit mode (:mod:`selfspec._engine.contract.audit`): a wrong token, a
    wrong KV slot, a touched committed token or a changed weight of the model raises
    :class:`~selfspec._engine.contract.audit.AuditError` (a subclass of :class:`LosslessError`) at
    the step where it happens, naming the hook at fault and the step, before any comparison of whole
    outputs; a difference found only by that comparison raises :class:`LosslessError` itself. The
    model's weights are fingerprinted before ``selfspec_setup`` (when ``plugin`` is a name; a ready
    ``Decoder`` has run its setup already) and checked after every hook, so the reference is greedy
    decoding of the untouched model. ``record`` is called with the result and the decode's
    :class:`~selfspec._engine.contract.audit.Auditor` (its per-step log): the kit's coverage
    counters use it.

    ``sampling`` (a :class:`selfspec._engine.contract.sampling.Sampling` with temperature > 0):
    decode with it and compare with plain sampling under the same seed
    (:func:`selfspec._engine.contract.sampling.reference_sample`, the model's own forward one token
    at a time); the near-tie margin is then that of the perturbed logits, against the tolerance
    divided by the temperature.

    ``exact`` (default: the ready decoder's mode, else ``False``): exact mode
    (``Decoder(exact=True)``, docs/losslessness.md). The reference is then ``vanilla`` in exact
    mode with the same weight layout and sampling, the tolerance is 0 in every dtype (no
    near-tie rule, in the audit's step checks too): any difference raises.
    """
    if isinstance(plugin, Decoder):
        if plugin.model is not model:
            raise ValueError("the Decoder passed to assert_lossless drives another model")
        decoder = plugin
    eos = tuple(eos_token_ids)
    prompt = [int(t) for t in prompt_ids]
    dtype = next(model.parameters()).dtype
    example = f"prompt of {len(prompt)} tokens, max_new_tokens={max_new_tokens}, {dtype}"
    if isinstance(plugin, Decoder) and exact is not None and exact != plugin.runner.exact:
        raise ValueError(f"exact={exact} for a Decoder built with exact={plugin.runner.exact}")
    if not isinstance(plugin, Decoder):
        try:  # in audit mode: the weights are fingerprinted before selfspec_setup
            decoder = Decoder(
                model, plugin, options, plugin_object=plugin_object, audit=True, exact=bool(exact)
            )
        except AuditError as exc:
            exc.args = (f"{exc}\n  ({example}, options {dict(options or {})})",)
            raise
    exact = decoder.runner.exact
    if exact:
        tolerance = 0.0  # bit for bit against vanilla in exact mode: no near-tie rule
        example += ", exact mode"
    audit, decoder.audit, decoder.audit_tolerance = decoder.audit, True, tolerance
    try:
        result = decoder.generate(
            prompt, max_new_tokens=max_new_tokens, eos_token_ids=eos, sampling=sampling
        )
    except AuditError as exc:  # a LosslessError too: the example is added to its message
        exc.args = (f"{exc}\n  ({example}, options {decoder.options})",)
        raise
    finally:
        decoder.audit, decoder.audit_tolerance = audit, None
    auditor = decoder.auditor
    assert auditor is not None
    if record is not None:
        record(result, auditor)
    sampling = decoder.sampling if sampling is None else sampling
    if exact:
        reference = (
            Decoder(model, "vanilla", weight_layout=decoder.runner.weight_layout, exact=True)
            .generate(prompt, max_new_tokens=max_new_tokens, eos_token_ids=eos, sampling=sampling)
            .output_ids
        )
    elif sampling.greedy:
        reference = greedy_reference(model, prompt, max_new_tokens, eos)
    else:
        reference = reference_sample(model, prompt, max_new_tokens, eos, sampling)
    if dtype == torch.float64 or exact:
        tolerance = 0.0  # exact in float64 (and in exact mode), whatever was asked
    cmp = compare(
        model, prompt, result.output_ids, reference, tolerance=tolerance, sampling=sampling
    )
    if cmp.equal:
        return result
    name = decoder.plugin_name
    i = cmp.index
    assert i is not None and cmp.margin is not None and cmp.bound is not None
    what = (
        "vanilla in exact mode"
        if exact
        else "greedy decoding"
        if sampling.greedy
        else str(sampling)
    )
    where = (
        f"plugin {name!r} diverges from {what} at new token {i} "
        f"(prompt of {len(prompt)} tokens, max_new_tokens={max_new_tokens}, {dtype}):\n"
        f"  plugin:    {around(result.output_ids, i)}\n"
        f"  reference: {around(reference, i)}\n"
        f"  reference top-1/top-2 logit margin there: {cmp.margin:.3g} "
        f"({explain(dtype, cmp.margin, cmp.bound)})"
    )
    if not cmp.near_tie:
        raise LosslessError(where)
    warnings.warn(f"near-tie: {where}", NearTieWarning, stacklevel=2)
    result.near_ties += 1
    return result


#: Greedy references already computed, per model: ``{prompt: longest output}``, valid while
#: the model's weights are the ones fingerprinted with them (see :func:`greedy_reference`).
_REFERENCES: weakref.WeakKeyDictionary[
    torch.nn.Module, tuple[WeightGuard, dict[tuple[int, ...], list[int]]]
] = weakref.WeakKeyDictionary()


def greedy_reference(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    eos_token_ids: Iterable[int] = (),
) -> list[int]:
    """:func:`selfspec._engine.contract.reference.reference_generate`, computed once per model and
    prompt.

    Greedy decoding does not depend on the budget or on EOS but for where it stops, so the
    reference of a shorter budget or with an EOS token is a prefix of the longest one known
    for the prompt (the reach examples are the same for every suite of a session: their
    references are decoded once). Kept only while the model's weights are value for value the ones
    they were computed with (models of up to :data:`selfspec._engine.contract.audit.EXACT_WEIGHTS`
    parameters; larger ones are decoded every time)."""
    prompt = tuple(int(t) for t in prompt_ids)
    entry = _REFERENCES.get(model)
    if entry is None or entry[0].changed() is not None:
        guard = WeightGuard(model)
        if not guard.exact:  # a real model: no copy of its weights, no cache
            return reference_generate(model, prompt, max_new_tokens, eos_token_ids)
        entry = _REFERENCES[model] = (guard, {})
    known = entry[1].get(prompt)
    if known is None or len(known) < max_new_tokens:
        known = entry[1][prompt] = reference_generate(model, prompt, max_new_tokens)
    ref = known[:max_new_tokens]
    eos = set(eos_token_ids)
    cut = next((i for i, t in enumerate(ref) if t in eos), None)
    return ref if cut is None else ref[: cut + 1]
