"""The two options every drafter that reads draft weights declares, declared once."""

from __future__ import annotations

from collections.abc import Callable

from selfspec._engine.draftweights.shadow import BACKENDS
from selfspec._engine.options import Option


def register_draft_options(register: Callable[[Option], None], *, weights: str = "none", vocab: int = 0) -> None:
    """Declare ``draft_weights`` (default ``weights``: which of the host's draft weights the
    draft model reads, :func:`selfspec.draft_weights`) and ``draft_vocab`` (default ``vocab``:
    the size of the draft vocabulary, :func:`selfspec.draft_vocab`; 0 = all). Read them back as
    ``selfspec.draft_weights(runner, options["draft_weights"], selfspec.draft_vocab(runner,
    options["draft_vocab"], tokenizer))``."""
    register(Option("draft_weights", str, weights,
                    "weights the draft model reads (the host's shared compressed copy): none (the model's "
                    "own), int8, int8wo, bf16, bnb (CUDA), auto (the host's choice for the device)",
                    choices=BACKENDS))
    register(Option("draft_vocab", int, vocab,
                    "draft vocabulary: the draft head scores only the N most frequent corpus tokens (0: all)",
                    min=0))
