"""The Hugging Face door:
``model.generate(..., custom_generate=selfspec.app.custom_generate(...))``.

``transformers`` (5.x) lets ``generate`` hand its decoding loop to a callable after its own
input preparation; :func:`custom_generate` builds that callable for any selfspec plugin, so a
script, a pipeline or an evaluation harness that already calls ``generate`` gets the plugin's
speed with the same output: greedy equals ``generate``'s greedy token for token, and
``do_sample=True`` equals the host's ``vanilla`` sampling under the same seed (position-keyed
noise; ``docs/losslessness.md``). Anything the host cannot do exactly is a ``ValueError``
naming the argument, never a silent fallback.

The :class:`selfspec.Decoder` (the runner's weight layout, the plugin's draft weights and
artefacts) is built on the first call and kept on the model object itself, so later calls with
the same plugin and options reuse it and it is released with the model.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

#: Generation-config fields the host reproduces exactly, with the value that means "off".
_OFF: dict[str, Any] = {
    "num_beams": 1,
    "num_beam_groups": 1,
    "num_return_sequences": 1,
    "penalty_alpha": None,
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "force_words_ids": None,
    "min_new_tokens": None,
    "min_length": 0,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "sequence_bias": None,
    "guidance_scale": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "min_p": None,
    "top_h": None,
    "exponential_decay_length_penalty": None,
    "watermarking_config": None,
    "renormalize_logits": False,
    "output_scores": False,
    "output_logits": False,
    "output_attentions": False,
    "output_hidden_states": False,
    "stop_strings": None,
    "max_time": None,
    "constraints": None,
    "diversity_penalty": 0.0,
    "length_penalty": 1.0,
    "prompt_lookup_num_tokens": None,
    "assistant_early_exit": None,
}
#: Logits processors and stopping criteria the host reproduces (by class name).
_PROCESSORS = {"TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"}
_CRITERIA = {"MaxLengthCriteria", "EosTokenCriteria"}
_CACHE_ATTR = "_selfspec_decoders"


def custom_generate(
    plugin: str = "vanilla",
    options: Mapping[str, Any] | None = None,
    *,
    seed: int = 0,
    tokenizer: Any = None,
    weight_layout: str = "auto",
) -> Callable[..., Any]:
    """A ``custom_generate`` callable that decodes with ``plugin`` (and its ``options``), for
    ``model.generate(..., custom_generate=...)`` (transformers 5;
    [hf-generate.md](docs/hf-generate.md)).

    ``model.generate(input_ids, max_new_tokens=64, custom_generate=custom_generate("selfsd"))``
    returns what the same call without ``custom_generate`` returns when greedy. With
    ``do_sample=True`` (``temperature``, ``top_k``, ``top_p`` from the generation config) it
    samples with the host's seeded, position-keyed noise: ``seed`` here, or ``selfspec_seed=N``
    in the ``generate`` call, which wins. ``tokenizer`` goes to the plugin's ``selfspec_setup``
    (a plugin that builds a corpus from text uses it). ``weight_layout`` is the runner's
    (``docs/performance.md``); the model's own weights are never changed. The decoder is built
    on the first call and kept on the model for later calls with the same plugin and options;
    batch size > 1, beams, ``num_return_sequences`` > 1, padding and any logits processor or
    stopping criterion the host cannot reproduce are a ``ValueError`` naming the argument.
    """
    from selfspec._engine.contract.options import OptionError
    from selfspec._engine.contract.plugins import available

    if plugin not in available():
        raise ValueError(
            f"custom_generate: no installed plugin {plugin!r} (installed: {', '.join(available())})"
        )
    opts = dict(options or {})

    def generate(
        model: Any,
        input_ids: torch.LongTensor,
        logits_processor: Any = None,
        stopping_criteria: Any = None,
        generation_config: Any = None,
        selfspec_seed: int | None = None,
        **model_kwargs: Any,
    ) -> Any:
        streamer = _callers_streamer()
        config = generation_config if generation_config is not None else model.generation_config
        _refuse_the_unsupported(
            input_ids, config, logits_processor, stopping_criteria, model_kwargs
        )
        from selfspec._engine.contract.sampling import Sampling

        prompt_len = int(input_ids.shape[1])
        max_new = _max_new_tokens(config, prompt_len)
        sampling = Sampling()
        if config.do_sample:
            sampling = Sampling(
                temperature=float(config.temperature if config.temperature is not None else 1.0),
                top_k=int(config.top_k or 0),
                top_p=float(config.top_p if config.top_p is not None else 1.0),
                seed=int(seed if selfspec_seed is None else selfspec_seed),
            )
        eos = config.eos_token_id
        eos_ids = (
            ()
            if eos is None
            else tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))
        )
        try:
            decoder = _decoder(model, plugin, opts, tokenizer, weight_layout)
        except OptionError as exc:
            raise ValueError(f"custom_generate: {exc}") from exc

        def stream(new: list[int]) -> None:
            if streamer is not None:
                streamer.put(torch.tensor(new, dtype=torch.long))

        result = decoder.generate(
            input_ids[0], max_new, eos_token_ids=eos_ids, stream=stream, sampling=sampling
        )
        if streamer is not None:
            streamer.end()
        new = torch.tensor(result.output_ids, dtype=torch.long, device=input_ids.device).reshape(
            1, -1
        )
        sequences = torch.cat([input_ids, new], dim=1)
        if config.return_dict_in_generate:
            from transformers.generation.utils import GenerateDecoderOnlyOutput

            return GenerateDecoderOnlyOutput(sequences=sequences)
        return sequences

    generate.__name__ = f"selfspec_{plugin}_generate"
    return generate


# ------------------------------------------------------------------------------------------ helpers
def _decoder(model: Any, plugin: str, options: dict[str, Any], tokenizer: Any, layout: str) -> Any:
    """The model's decoder for this plugin and options, built once and kept on the model."""
    from selfspec._engine.contract.loop import Decoder

    cache = model.__dict__.setdefault(_CACHE_ATTR, {})
    key = (plugin, repr(sorted(options.items())), layout, id(tokenizer))
    if key not in cache:
        cache[key] = Decoder(model, plugin, options, tokenizer=tokenizer, weight_layout=layout)
    return cache[key]


def _callers_streamer() -> Any:
    """The ``streamer`` given to ``model.generate``. transformers passes a callable
    ``custom_generate`` only the keyword arguments its own loop does not take, so the streamer
    (which ``generate`` has already fed the prompt) is read from ``generate``'s frame."""
    frame = inspect.currentframe()
    try:
        caller = frame.f_back.f_back if frame and frame.f_back else None
        while caller is not None and caller.f_code.co_name != "generate":
            caller = caller.f_back
        return caller.f_locals.get("streamer") if caller is not None else None
    finally:
        del frame


def _max_new_tokens(config: Any, prompt_len: int) -> int:
    if config.max_new_tokens is not None:
        return int(config.max_new_tokens)
    return max(0, int(config.max_length) - prompt_len)


def _refuse_the_unsupported(
    input_ids: torch.Tensor,
    config: Any,
    processors: Any,
    criteria: Any,
    model_kwargs: dict[str, Any],
) -> None:
    """A ``ValueError`` naming the first argument the host cannot reproduce exactly."""
    for name, off in _OFF.items():  # first: beams and return sequences expand the batch
        value = getattr(config, name, off)
        if value is None or value == off or (not value and off in (None, 0, False)):  # unset or off
            continue
        raise ValueError(
            f"custom_generate cannot reproduce {name}={value!r} exactly (the host supports "
            "greedy and temperature/top-k/top-p sampling, batch size 1)"
        )
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(
            f"custom_generate decodes one sequence at a time: input_ids has batch size "
            f"{input_ids.shape[0]} (batch size 1 only)"
        )
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool(torch.all(mask == 1)):
        raise ValueError(
            "custom_generate: attention_mask must be all ones (no padding: batch size 1)"
        )
    for proc in processors or []:
        if type(proc).__name__ not in _PROCESSORS:
            raise ValueError(
                f"custom_generate cannot apply the logits processor {type(proc).__name__}"
            )
    for crit in criteria or []:
        if type(crit).__name__ not in _CRITERIA:
            raise ValueError(
                f"custom_generate cannot apply the stopping criterion {type(crit).__name__}"
            )
