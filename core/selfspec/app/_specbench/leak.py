"""Whether a text overlaps Spec-Bench: the check that keeps the suite out of every corpus.

Everything that tunes or builds from data (development prompts, Self-Draft's corpus, the draft
vocabulary, calibration) reads :mod:`selfspec.app._data`'s dev split and
:func:`~selfspec.app._data.build_corpus_texts`; both drop whatever :func:`overlaps` flags, so
no Spec-Bench question or reference reaches them (GSM8K and MT-bench questions also live in
the project's own tasks).

The rule, on words (``\\w+`` runs, lower-cased; punctuation, case and spacing ignored): a text
overlaps when it shares a run of :data:`NGRAM` consecutive words with a Spec-Bench text (every
turn and every reference string), or, for a Spec-Bench text shorter than that, contains its
whole word sequence. Spec-Bench texts of fewer than :data:`MIN_WORDS` words ("No.", "1000",
"purifying water") are not probes: such phrases occur in any text and carry no question.
Runs of 13 words are the usual contamination test (GPT-3's); a false hit only drops a corpus
text, never a Spec-Bench question.
"""

from __future__ import annotations

import re
from functools import cache

NGRAM = 13
MIN_WORDS = 5
_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    """The words the rule compares: ``\\w+`` runs, lower-cased."""
    return _WORD.findall(text.lower())


@cache
def _probes() -> tuple[frozenset[str], dict[str, tuple[tuple[str, ...], ...]]]:
    """The 13-word runs of long Spec-Bench texts (joined by spaces) and, keyed by their first
    word, the whole word sequences of shorter ones."""
    from selfspec.app._specbench.questions import texts

    grams: set[str] = set()
    short: dict[str, set[tuple[str, ...]]] = {}
    for text in texts():
        w = words(text)
        if len(w) >= NGRAM:
            grams.update(" ".join(w[i : i + NGRAM]) for i in range(len(w) - NGRAM + 1))
        elif len(w) >= MIN_WORDS:
            short.setdefault(w[0], set()).add(tuple(w))
    return frozenset(grams), {k: tuple(v) for k, v in short.items()}


def overlaps(text: str) -> bool:
    """True when ``text`` shares a probe with Spec-Bench (see the module docstring)."""
    grams, short = _probes()
    w = words(text)
    n = len(w)
    for i in range(n):
        if i + NGRAM <= n and " ".join(w[i : i + NGRAM]) in grams:
            return True
        for seq in short.get(w[i], ()):
            if tuple(w[i : i + len(seq)]) == seq:
                return True
    return False


def any_overlaps(texts: list[str] | tuple[str, ...]) -> bool:
    """True when any of ``texts`` overlaps Spec-Bench."""
    return any(overlaps(t) for t in texts if t)
