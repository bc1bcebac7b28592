"""Tiny random models of every architecture the runner supports, built in-process.

No downloads: each model is built from a config with a small vocabulary, a few layers,
grouped-query attention (fewer key/value heads than query heads) and, where the architecture
has them, sliding windows of a few tokens, so short test prompts already cross a window.
Weights are drawn with a large ``initializer_range`` so that greedy decoding of a random model
does not collapse into one token repeated forever (a degenerate model would make every
losslessness test trivially pass).
"""

from __future__ import annotations

from typing import Any

import torch

from selfspec.testing._archs import ARCHS, POSITIONS

#: Sliding window (in tokens) of the tiny models that have one.
WINDOW = 4

_COMMON: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 48,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 12,
    "max_position_embeddings": POSITIONS,  # room for the kit's long prompts and outputs
    "initializer_range": 0.3,
    "tie_word_embeddings": False,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}


def tiny_config(arch: str, **overrides: Any) -> Any:
    """The ``transformers`` config of :func:`tiny_model` (``overrides`` replace any field)."""
    import transformers

    if arch not in ARCHS:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {', '.join(ARCHS)}")
    kw = dict(_COMMON)
    if arch == "llama":
        cls = transformers.LlamaConfig
    elif arch == "mistral":
        cls = transformers.MistralConfig
        kw["sliding_window"] = WINDOW
    elif arch == "qwen2":
        cls = transformers.Qwen2Config
        # layers >= max_window_layers slide: a mix of full and sliding layers
        kw.update(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
    elif arch == "qwen3":
        cls = transformers.Qwen3Config
    else:
        cls = transformers.Gemma3TextConfig
        kw.update(
            num_hidden_layers=4,
            layer_types=[
                "sliding_attention",
                "full_attention",
                "sliding_attention",
                "full_attention",
            ],
            sliding_window=WINDOW - 1,
            final_logit_softcapping=30.0,
            query_pre_attn_scalar=16,
        )
    kw.update(overrides)
    return cls(**kw)


def tiny_model(
    arch: str,
    *,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    attn_implementation: str = "sdpa",
    device: torch.device | str = "cpu",
    near_ties: bool = False,
    **overrides: Any,
) -> Any:
    """A randomly initialised causal LM of ``arch`` (one of :data:`ARCHS`), in eval mode.

    Deterministic in ``seed``. ``eos_token_id`` defaults to None so decoding runs to the
    budget; pass ``eos_token_id=...`` (and any other config field) as an override.
    ``near_ties=True``: the near-tie variant (:func:`near_tie_head`: the same greedy output,
    top-1/top-2 logit margins below 1e-3 at most positions).
    """
    import transformers

    config = tiny_config(arch, **overrides)
    config._attn_implementation = attn_implementation
    with _fork_rng(seed):
        model = transformers.AutoModelForCausalLM.from_config(
            config, dtype=torch.float32, attn_implementation=attn_implementation
        )
    if near_ties:
        near_tie_head(model)
    model = model.to(device=device, dtype=dtype).eval()
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = (
        config.eos_token_id if config.eos_token_id is not None else 0
    )
    return model


#: The near-tie variant's LM-head scale (:func:`near_tie_head`): the tiny models' top-1/top-2
#: logit margins (mostly 0.05-2) shrink to a few 1e-4.
NEAR_TIE_SCALE = 1e-3


@torch.no_grad()
def near_tie_head(model: Any, scale: float = NEAR_TIE_SCALE) -> None:
    """Scale the model's LM head by ``scale``, in place: the same tokens win (greedy decoding
    is unchanged), by margins ``scale`` times smaller, below 1e-3 at most positions. A verifier
    that accepts a draft token within some tolerance of the top-1 then commits tokens that are
    not the model's, which float64 decoding never allows, while a correct plugin stays exact
    (the margins are still far above float64's and float32's rounding at these logits)."""
    head = model.get_output_embeddings()
    head.weight.mul_(scale)
    if getattr(head, "bias", None) is not None:
        head.bias.mul_(scale)


class _fork_rng:
    """Seed torch's CPU generator for a block and restore it after, so building a model
    leaves the caller's random stream (e.g. Hypothesis-driven tests) untouched."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __enter__(self) -> None:
        self.state = torch.random.get_rng_state()
        torch.manual_seed(self.seed)

    def __exit__(self, *exc: object) -> None:
        torch.random.set_rng_state(self.state)


def split_device_map(model: Any) -> dict[str, str]:
    """The kit's CPU/disk placement of a tiny model (an accelerate ``device_map``).

    The embedding and the LM head on disk, the decoder layers alternately in memory and on
    disk (layer 0 in memory), the rotary tables and the final norm in memory: every kind of
    crossing a decode makes (resident to offloaded and back, offloaded input and output
    projections) happens in every forward.
    """
    n = int(model.config.num_hidden_layers)
    device_map = {"model.embed_tokens": "disk", "model.rotary_emb": "cpu"}
    device_map.update({f"model.layers.{i}": "disk" if i % 2 else "cpu" for i in range(n)})
    device_map.update({"model.norm": "cpu", "lm_head": "disk"})
    return device_map


def offloaded_tiny_model(
    arch: str, offload_dir: Any, *, device_map: dict[str, str] | None = None, **kwargs: Any
) -> Any:
    """:func:`tiny_model` dispatched by accelerate over CPU memory and disk.

    ``device_map`` (default :func:`split_device_map`) names ``"cpu"`` or ``"disk"`` per module;
    the disk modules' weights are written to ``offload_dir`` and loaded from it by
    accelerate's hooks on every forward, as ``from_pretrained(device_map=...,
    offload_folder=...)`` does for a model bigger than memory. ``kwargs`` go to
    :func:`tiny_model` (dtype, seed, config overrides).
    """
    from accelerate import dispatch_model

    model = tiny_model(arch, **kwargs)
    return dispatch_model(
        model, device_map or split_device_map(model), offload_dir=str(offload_dir)
    )
