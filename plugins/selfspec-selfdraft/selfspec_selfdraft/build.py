"""Building corpus caches from text: the default one (benchmark dev texts) and from files."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from selfspec import ArtefactStore

from .corpus import CorpusCache, tokenizer_key

STORE = ArtefactStore("selfdraft")

#: Tokens of dev-split text the default corpus cache is built from (about a minute here).
DEFAULT_TOKENS = 3_000_000
BATCH = 256


def default_path(tokenizer: Any, max_tokens: int) -> Path:
    """Where the default corpus cache of this tokenizer lives (in the plugin's artefact store).
    ``heldout`` in the name: the dev split without any text overlapping Spec-Bench (a cache of
    a corpus that held such texts is never read)."""
    return STORE.path(f"corpus-dev-heldout-{tokenizer_key(tokenizer)}-{max_tokens}.npz")


def default_corpus(
    tokenizer: Any, max_tokens: int = DEFAULT_TOKENS, progress: bool = True
) -> CorpusCache:
    """The default corpus cache: built on first use from :func:`selfspec.app.corpus_texts` (the dev
    split of ShareGPT, HumanEval and GSM8K; never a test prompt nor a Spec-Bench text), then loaded
    from disk."""
    path = default_path(tokenizer, max_tokens)
    if path.is_file():
        return CorpusCache.load(path)
    from selfspec.app import corpus_texts

    # the small code and math dev sets first, so that the token cap only ever trims ShareGPT
    texts = corpus_texts(("humaneval", "gsm8k", "sharegpt"))
    cache = build_from_texts(
        texts,
        tokenizer,
        max_tokens=max_tokens,
        progress=progress,
        meta={"source": "selfspec.corpus_texts (dev split)"},
    )
    cache.save(path)
    return cache


def build_from_texts(
    texts: Iterable[str],
    tokenizer: Any,
    *,
    max_tokens: int | None = None,
    progress: bool = True,
    meta: dict[str, Any] | None = None,
    **kwargs: Any,
) -> CorpusCache:
    """Tokenize ``texts`` with the model's tokenizer (up to ``max_tokens`` tokens) and count."""
    from tqdm.auto import tqdm

    seqs: list[list[int]] = []
    total = 0
    bar = tqdm(
        total=max_tokens, unit="tok", unit_scale=True, desc="selfdraft corpus", disable=not progress
    )
    for batch in _batches(texts, BATCH):
        for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]:
            if max_tokens is not None and total + len(ids) > max_tokens:
                ids = ids[: max_tokens - total]
            seqs.append(ids)
            total += len(ids)
            bar.update(len(ids))
            if max_tokens is not None and total >= max_tokens:
                break
        if max_tokens is not None and total >= max_tokens:
            break
    bar.close()
    vocab = max(len(tokenizer), 1)
    info = {"tokenizer": tokenizer_key(tokenizer), **(meta or {})}
    return CorpusCache.from_sequences(seqs, vocab, meta=info, **kwargs)


def _batches(texts: Iterable[str], n: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for t in texts:
        batch.append(t)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch
