"""Tiny, random, offline models for the models/CLI tests: an HF directory with a word-level
tokenizer, and a GGUF file written with the ``gguf`` package. Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

WORDS = (
    "the cat sat on a mat and the dog ran to the park while birds sang in tall green trees "
    "what is capital of france paris hello hi world one two three four five six seven"
).split()
SPECIALS = ["[UNK]", "<s>", "</s>"]
EOS_ID = 2


def word_tokenizer(chat_template: str | None = None):
    """A whitespace word-level fast tokenizer over :data:`WORDS`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + sorted(set(WORDS)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>", eos_token="</s>"
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    return fast


def save_tiny_llama(
    path: Path, *, seed: int = 0, chat_template: str | None = None, layers: int = 2
) -> Path:
    """A random 2-layer Llama and its tokenizer saved to ``path`` (float32 weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = word_tokenizer(chat_template)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=EOS_ID,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def save_tiny_gpt2(path: Path) -> Path:
    """A model of an architecture the runner does not drive."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = word_tokenizer()
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=len(tokenizer), n_embd=16, n_layer=1, n_head=2, n_positions=64)
    )
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def write_tiny_gguf(
    path: Path,
    *,
    layers: int = 2,
    hidden: int = 16,
    inter: int = 32,
    heads: int = 4,
    kv_heads: int = 2,
    seed: int = 0,
) -> Path:
    """A random float32 Llama GGUF file with a byte-level (gpt2-style) character vocabulary."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens = ["<unk>", "<s>", "</s>", "\u0120"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    V, hd = len(tokens), hidden // heads
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(V)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (V - 3))
    w.add_token_scores([0.0] * V)
    w.add_token_merges([])
    w.add_bos_token_id(1)
    w.add_eos_token_id(EOS_ID)
    w.add_unk_token_id(0)

    def rand(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.2).astype(np.float32))

    rand("token_embd.weight", V, hidden)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        rand(f"blk.{i}.attn_q.weight", heads * hd, hidden)
        rand(f"blk.{i}.attn_k.weight", kv_heads * hd, hidden)
        rand(f"blk.{i}.attn_v.weight", kv_heads * hd, hidden)
        rand(f"blk.{i}.attn_output.weight", hidden, heads * hd)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        rand(f"blk.{i}.ffn_gate.weight", inter, hidden)
        rand(f"blk.{i}.ffn_up.weight", inter, hidden)
        rand(f"blk.{i}.ffn_down.weight", hidden, inter)
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    rand("output.weight", V, hidden)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def chat_word_tokenizer(words):
    """A whitespace word-level fast tokenizer over ``words`` with ``<unk>``, ``<eos>`` and
    ``<|user|>``/``<|assistant|>`` turns and a minimal chat template (the bench tests' models)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = ["<unk>", "<eos>", "<|user|>", "<|assistant|>"]
    vocab = {t: i for i, t in enumerate(special + sorted(set(words)))}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        unk_token="<unk>",
        eos_token="<eos>",
        additional_special_tokens=["<|user|>", "<|assistant|>"],
    )
    tok.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    return tok
