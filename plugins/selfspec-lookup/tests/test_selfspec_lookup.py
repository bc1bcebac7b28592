"""selfspec-lookup: installed, lossless under the kit, and its n-gram mechanics."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from selfspec_lookup import Lookup

from selfspec import NgramIndex
from selfspec import available_plugins as available
from selfspec.testing import ARCHS, assert_lossless, tiny_model
from selfspec.testing import strategies as sst


def test_plugin_is_installed():
    assert "lookup" in available()


@given(
    arch=st.sampled_from(ARCHS),
    max_ngram=st.integers(1, 4),
    num_draft=st.integers(1, 12),
    adaptive=st.booleans(),
    data=st.data(),
)
def test_lossless(arch, max_ngram, num_draft, adaptive, data):
    model = tiny_model(arch)
    # a) few distinct tokens make n-gram matches, and so real drafts, likely
    prompt = data.draw(sst.prompts(min(model.config.vocab_size, 12), min_len=4))
    options = {"max_ngram": max_ngram, "num_draft": num_draft, "adaptive": adaptive}
    assert_lossless(model, "lookup", prompt, data.draw(sst.lengths()), options)


def test_drafts_on_a_repeating_model_are_accepted():
    # b) a model whose greedy output repeats the prompt's pattern gives long accepted drafts;
    # run on every architecture and require that lookup actually drafted something
    for arch in ARCHS:
        model = tiny_model(arch)
        result = assert_lossless(model, "lookup", [3, 4, 5, 3, 4, 5, 3, 4], 24)
        assert result.stats.drafted > 0


def _lookup(history, **opts):
    plugin = Lookup()
    plugin.index = NgramIndex(opts.get("max_ngram", 3), opts.get("min_ngram", 1))
    plugin.index.extend(history)
    return list(plugin.index.continuation(opts.get("k", 4)))


def test_latest_occurrence_of_the_longest_ngram_wins():
    # "1 2" occurs twice before the suffix; the later occurrence (followed by 9) wins
    assert _lookup([1, 2, 7, 1, 2, 9, 8, 1, 2], k=2) == [9, 8]
    # the trigram "5 1 2" beats the bigram "1 2"
    assert _lookup([5, 1, 2, 6, 1, 2, 9, 5, 1, 2], k=1) == [6]


def test_no_match_gives_an_empty_draft():
    assert _lookup([1, 2, 3, 4]) == []
    assert _lookup([1, 2, 3, 4], min_ngram=2) == []


def test_suffix_itself_is_not_a_match():
    # the only "3" is the pending token itself: nothing to copy
    assert _lookup([1, 2, 3], max_ngram=1) == []


@pytest.mark.parametrize("opts", [{"min_ngram": 4, "max_ngram": 2}])
def test_bad_options_are_refused(opts):
    from selfspec import Decoder, PluginError

    with pytest.raises(PluginError, match="min_ngram"):
        Decoder(tiny_model("llama"), "lookup", opts)
