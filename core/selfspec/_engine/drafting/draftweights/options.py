"""The two options every drafter that reads draft weights declares, declared once."""

from __future__ import annotations

from collections.abc import Callable

from selfspec._engine.contract.options import Option
from selfspec._engine.drafting.draftweights.shadow import BACKENDS

#: The host's default draft weights for every drafter that declares them: ``auto`` (the fastest
#: registered draft format measured on a CPU, bitsandbytes on CUDA where installed). A draft token
#: on the shared int8 copy costs a fraction of one on the model's own float32 weights while keeping
#: the same acceptance (docs/performance.md, "Draft weights"); ``none`` is the papers' setting.
DEFAULT_DRAFT_WEIGHTS = "auto"
#: The host's default draft vocabulary: the whole vocabulary (a smaller one saved nothing
#: measurable on the models measured; docs/performance.md).
DEFAULT_DRAFT_VOCAB = 0


def register_draft_options(
    register: Callable[[Option], None],
    *,
    weights: str = DEFAULT_DRAFT_WEIGHTS,
    vocab: int = DEFAULT_DRAFT_VOCAB,
) -> None:
    """Declare ``draft_weights`` (default ``weights``, the host's ``auto`` unless a plugin
    measured otherwise: which of the host's draft weights the draft model reads,
    :func:`selfspec.draft_weights`) and ``draft_vocab`` (default ``vocab``, 0: the size of the
    draft vocabulary, :func:`selfspec.draft_vocab`; 0 = all). Read them back as
    ``selfspec.draft_weights(runner, options["draft_weights"], selfspec.draft_vocab(runner,
    options["draft_vocab"], tokenizer))``. Used by selfsd and clasp.

    The defaults are the host's, so every drafter gets the same: ``auto``, because a draft
    token on the shared int8 copy costs a fraction of one on the float32 weights at the same
    acceptance, and the whole vocabulary, because a smaller one saved nothing measurable
    ([performance.md](docs/performance.md)); ``-o draft_weights=none`` is the papers' setting.
    A plugin passes other defaults only where it measured them better."""
    register(
        Option(
            "draft_weights",
            str,
            weights,
            "weights the draft model reads (the host's shared compressed copy): none (the model's "
            "own), a registered draft format (`specdec plugins` lists them and where each runs: "
            "int8, int8-intmm, int8-weights, int4, fp16-weights, bf16, bnb-int8, bnb-nf4, ...), or "
            "auto (the fastest measured here; a 4-bit copy only if its agreement with the model "
            "is worth its speed)",
            choices=BACKENDS,
        )
    )
    register(
        Option(
            "draft_vocab",
            int,
            vocab,
            "draft vocabulary: the draft head scores only the N most frequent corpus tokens "
            "(0: all)",
            min=0,
        )
    )
