"""``reference_generate`` with no EOS ids never stops early, even when the model's own
generation config names one (``specdec check``'s long example decodes without EOS)."""

from selfspec import reference_generate


def test_no_eos_ids_decode_to_the_budget_whatever_the_model_config_says(tiny_model_factory):
    prompt = [5, 17, 3, 99, 42]
    plain = reference_generate(tiny_model_factory("llama"), prompt, 24)
    eos = plain[3]  # a token the output holds early
    model = tiny_model_factory("llama", eos_token_id=eos)
    assert reference_generate(model, prompt, 24) == plain  # no EOS ids: all 24 tokens
    assert reference_generate(model, prompt, 24, [eos]) == plain[: plain.index(eos) + 1]
