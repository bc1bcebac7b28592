"""Spec-Bench's 480 questions (shipped in ``data/``), grouped into its six task families.

Spec-Bench (Xia et al., Findings of ACL 2024) is the benchmark speculative-decoding papers and
its public leaderboard report on. ``data/question.jsonl`` is its question file, unchanged, with
its licence (``data/LICENSE``, Apache-2.0) and where it comes from (``data/SOURCE.md``).

Families, as Spec-Bench's ``evaluation/speed.py`` groups the categories: ``mt_bench`` (the eight
MT-bench categories, two-turn conversations), ``translation``, ``summarization``, ``qa``,
``math_reasoning`` and ``rag`` (one category each).

:func:`load_suite` draws ``n`` questions per family, reproducibly: the questions of a family are
shuffled by ``random.Random("spec-bench:<family>:<seed>")``; in ``mt_bench`` each category is
shuffled so, and the categories are taken in turn (``n = 8`` holds one of each). Without ``n``
every question is returned in the file's order.

The suite is never a split of the project's own tasks: nothing tunes on it, and
:mod:`.leak` keeps its texts out of every corpus and development prompt.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from selfspec.app._data import DataError, Sample
from selfspec.app._specbench.questions import QUESTIONS, data_file, questions, texts

__all__ = [
    "FAMILIES",
    "LABELS",
    "MT_BENCH_CATEGORIES",
    "QUESTIONS",
    "SUITE",
    "data_file",
    "family_of",
    "load_suite",
    "questions",
    "texts",
    "to_sample",
]

SUITE = "spec-bench"
MT_BENCH_CATEGORIES = (
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
)
FAMILIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
#: The leaderboard's column titles.
LABELS = {
    "mt_bench": "Multi-turn Conversation",
    "translation": "Translation",
    "summarization": "Summarization",
    "qa": "Question Answering",
    "math_reasoning": "Mathematical Reasoning",
    "rag": "Retrieval-aug. Generation",
}


def family_of(category: str) -> str:
    """The family of a Spec-Bench category (``writing`` -> ``mt_bench``, ``rag`` -> ``rag``)."""
    if category in MT_BENCH_CATEGORIES:
        return "mt_bench"
    if category in FAMILIES:
        return category
    raise DataError(f"unknown Spec-Bench category {category!r}")


def to_sample(q: dict[str, Any]) -> Sample:
    """A question as a :class:`Sample`: task = its family, prompt = its first turn; every turn
    (``meta["conversation"]``: the bench runs them all), the category, the id and the reference
    (if any) in ``meta``."""
    qid = q["question_id"]
    return Sample(
        family_of(q["category"]),
        str(qid),
        q["turns"][0],
        f"{SUITE}:{qid}",
        meta={
            "suite": SUITE,
            "question_id": qid,
            "category": q["category"],
            "conversation": list(q["turns"]),
            "reference": q.get("reference"),
        },
    )


def load_suite(
    n: int | None = None, seed: int = 0, families: Sequence[str] = FAMILIES
) -> list[Sample]:
    """``n`` questions per family (all without ``n``), family by family in :data:`FAMILIES`
    order; see the module docstring for the draw."""
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise DataError(
            f"unknown Spec-Bench famil{'y' if len(unknown) == 1 else 'ies'} {unknown} "
            f"(known: {', '.join(FAMILIES)})"
        )
    by_category: dict[str, list[dict[str, Any]]] = {}
    for q in questions():
        by_category.setdefault(q["category"], []).append(q)
    out: list[Sample] = []
    for fam in FAMILIES:
        if fam not in families:
            continue
        cats = MT_BENCH_CATEGORIES if fam == "mt_bench" else (fam,)
        if n is None:
            out += [to_sample(q) for q in questions() if family_of(q["category"]) == fam]
            continue
        rng = random.Random(f"{SUITE}:{fam}:{seed}")
        pools = []
        for c in cats:
            pool = list(by_category.get(c, []))
            rng.shuffle(pool)
            pools.append(pool)
        drawn: list[dict[str, Any]] = []
        while len(drawn) < n and any(pools):
            for pool in pools:
                if pool and len(drawn) < n:
                    drawn.append(pool.pop(0))
        out += [to_sample(q) for q in drawn]
    return out
