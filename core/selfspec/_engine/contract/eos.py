"""The host's one end-of-sequence rule, shared by the decoder, the CLI and the benchmarks."""

from __future__ import annotations

from typing import Any


def eos_token_ids(model: Any, tokenizer: Any = None) -> frozenset[int]:
    """Every id that ends a generation: the generation config's, the model config's and the
    tokenizer's EOS (for SmolLM2-Instruct ``<|im_end|>``)."""
    found: set[int] = set()
    for source in (
        getattr(model, "generation_config", None),
        getattr(model, "config", None),
        tokenizer,
    ):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if eos is None:
            continue
        found.update(int(e) for e in (eos if isinstance(eos, (list, tuple, set)) else [eos]))
    return frozenset(found)
