"""Draft weights: compressed copies of a model's layers and LM head, and a draft vocabulary,
that only draft passes read (see :mod:`.shadow`, :mod:`.layers`, :mod:`.linears`, :mod:`.vocab`)."""

from selfspec._engine.drafting.draftweights.options import register_draft_options
from selfspec._engine.drafting.draftweights.shadow import (
    BACKENDS,
    DraftWeights,
    DraftWeightsError,
    built_nbytes,
    draft_weights,
    resolve_backend,
)
from selfspec._engine.drafting.draftweights.vocab import draft_vocab, vocab_ranking

__all__ = [
    "BACKENDS",
    "DraftWeights",
    "DraftWeightsError",
    "built_nbytes",
    "draft_vocab",
    "draft_weights",
    "register_draft_options",
    "resolve_backend",
    "vocab_ranking",
]
