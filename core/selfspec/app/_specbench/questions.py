"""The shipped Spec-Bench question file, read as is (a leaf: :mod:`.leak` and the dev split's
filter read it without the rest of the app)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from importlib import resources
from typing import Any

QUESTIONS = "question.jsonl"
PACKAGE = "selfspec.app._specbench"


def data_file(name: str = QUESTIONS) -> Any:
    """A file of the shipped data (``question.jsonl``, ``LICENSE``, ``SOURCE.md``)."""
    f = resources.files(PACKAGE).joinpath("data", name)
    if not f.is_file():
        raise FileNotFoundError(
            f"the Spec-Bench file {name} is missing from the selfspec package; reinstall selfspec"
        )
    return f


@cache
def questions() -> tuple[dict[str, Any], ...]:
    """Every question of ``question.jsonl``, as parsed, in the file's order."""
    lines = data_file().read_text(encoding="utf-8").splitlines()
    return tuple(json.loads(line) for line in lines if line.strip())


def texts() -> Iterator[str]:
    """Every text of the suite: each turn of each question and each reference string."""
    for q in questions():
        yield from q["turns"]
        yield from _strings(q.get("reference"))


def _strings(x: Any) -> Iterator[str]:
    if isinstance(x, str):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _strings(y)
