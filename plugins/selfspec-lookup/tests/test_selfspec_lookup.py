"""selfspec-lookup: installed, lossless under the kit, and its n-gram mechanics."""

import pytest
from hypothesis import strategies as st
from selfspec_lookup import Lookup

from selfspec import NgramIndex
from selfspec.testing import PluginSuite, tiny_model


class TestLookup(PluginSuite):
    """The kit's standard suite: installed, valid options, lossless (with coverage)."""

    plugin = "lookup"
    option_strategies = {
        "max_ngram": st.integers(1, 4),
        "min_ngram": st.integers(1, 2),
        "num_draft": st.integers(1, 12),
    }
    reach_options = {"num_draft": 12}  # the deepest drafts the property draws

    def options_strategy(self, model, declared):
        # a) min_ngram above max_ngram is refused (test_bad_options_are_refused)
        return (
            super()
            .options_strategy(model, declared)
            .filter(lambda o: o.get("min_ngram", 1) <= o.get("max_ngram", 3))
        )


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
