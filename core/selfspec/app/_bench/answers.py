"""Spec-Bench's answer files and speed report, from a bench's records.

``specdec bench --suite spec-bench`` writes, next to its own records,
``model_answer/<model_id>.jsonl`` per method: one line per question, in the format Spec-Bench's
evaluation writes (its ``evaluation/speed.py`` and ``evaluation/equal.py`` read them unchanged)::

    {"question_id": int, "category": str, "answer_id": str, "model_id": str,
     "choices": [{"index": 0, "turns": [answer text per turn], "decoding_steps": [per turn],
                  "new_tokens": [per turn], "wall_time": [seconds per turn],
                  "accept_lengths": [tokens committed per verification step, over all turns]}],
     "tstamp": float}

``model_id`` is ``<model>-<method>`` (characters other than letters, digits, ``.``, ``_`` and
``-`` as ``_``). ``decoding_steps`` is the number of verification steps of the turn: a
plugin's steps, HF generate's full-model forwards. ``accept_lengths`` is what each step
committed: a plugin's own count; for HF generate and its peers, derived from the positions of
the full-model forwards (one token a forward for greedy); ``[]`` where unknown. A turn that
failed (``error`` in the record) reads ``"ERROR"`` with the tokens and time it took (as Spec-Bench
writes a failed question); the conversation's later turns are absent.

:func:`speed_report` is Spec-Bench's computation: per family (``mt_bench``: the eight MT-bench
categories; each other category alone) and ``overall``, the mean over questions of (sum of new
tokens / sum of wall time over the question's turns), divided by the same mean for the baseline
(``hf``: HF generate greedy, Spec-Bench's vanilla); "#Mean Accepted Tokens" is the mean of every
accept length of the family's questions.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

MODEL_ANSWERS = "model_answer"
OVERALL = "overall"


def model_id(model: str, method: str) -> str:
    """``<model>-<method>``, safe as a file name (Spec-Bench names the file after it)."""
    base = Path(str(model)).name or str(model)
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{base}-{method}")


def answer_line(records: Sequence[dict[str, Any]], mid: str) -> dict[str, Any]:
    """The answer line of one method on one question, from its records (one per turn run)."""
    recs = sorted(records, key=lambda r: r.get("turn", 1))
    first = recs[0]
    lengths = [x for r in recs for x in (r.get("accept_lengths") or [])]
    return {
        "question_id": _qid(first["question_id"]),
        "category": first.get("category") or first["task"],
        "answer_id": uuid.uuid4().hex,
        "model_id": mid,
        "choices": [
            {
                "index": 0,
                "turns": [
                    "ERROR" if r.get("error") else (r.get("output") or "").strip() for r in recs
                ],
                "decoding_steps": [_steps(r) for r in recs],
                "new_tokens": [int(r["new_tokens"]) for r in recs],
                "wall_time": [float(r["wall_time"]) for r in recs],
                "accept_lengths": [int(x) for x in lengths],
            }
        ],
        "tstamp": time.time(),
    }


def _qid(q: Any) -> Any:
    return int(q) if isinstance(q, str) and q.isdigit() else q


def _steps(r: dict[str, Any]) -> int:
    if r.get("accept_lengths"):
        return len(r["accept_lengths"])
    return int(r.get("forwards") or 0)


def lines_by_method(
    records: Iterable[dict[str, Any]], model: str
) -> dict[str, list[dict[str, Any]]]:
    """Every method's answer lines, questions in the records' order."""
    grouped: dict[str, dict[Any, list[dict[str, Any]]]] = {}
    for r in records:
        grouped.setdefault(r["method"], {}).setdefault((r["task"], r["question_id"]), []).append(r)
    return {
        m: [answer_line(rs, model_id(model, m)) for rs in qs.values()] for m, qs in grouped.items()
    }


class AnswerWriter:
    """Appends each question's answer lines to ``<out>/model_answer/<model_id>.jsonl`` as the
    bench finishes it (a long run keeps what it measured); the files start empty."""

    def __init__(self, out: str | os.PathLike[str], model: str, methods: Sequence[str]) -> None:
        self.dir = Path(out) / MODEL_ANSWERS
        self.dir.mkdir(parents=True, exist_ok=True)
        self.model = model
        self.paths = {m: self.dir / f"{model_id(model, m)}.jsonl" for m in methods}
        for p in self.paths.values():
            p.write_text("", encoding="utf-8")

    def __call__(self, _sample: Any, records: Sequence[dict[str, Any]]) -> None:
        for m, lines in lines_by_method(records, self.model).items():
            with open(self.paths[m], "a", encoding="utf-8") as f:
                for line in lines:
                    f.write(json.dumps(line, ensure_ascii=False) + "\n")


# --------------------------------------------------------------------------- speed report
def family(category: str) -> str:
    from selfspec.app._specbench import family_of

    return family_of(category)


def _stats(lines: Sequence[dict[str, Any]]) -> tuple[float | None, float | None, int]:
    """Mean over questions of tokens/s, mean accept length, and the number of questions."""
    speeds, lengths = [], []
    for line in lines:
        c = line["choices"][0]
        wall = sum(c["wall_time"])
        speeds.append(sum(c["new_tokens"]) / wall if wall > 0 else 0.0)
        lengths.extend(c["accept_lengths"])
    mean = sum(speeds) / len(speeds) if speeds else None
    return mean, (sum(lengths) / len(lengths) if lengths else None), len(lines)


def speed_report(lines: dict[str, Sequence[dict[str, Any]]], baseline: str) -> dict[str, Any]:
    """Spec-Bench's speed report of every method's answer lines (see the module docstring):
    ``{"baseline", "families": [...], "methods": {method: {family: {"tokens_per_s",
    "speedup", "mean_accepted", "questions", "errors"}}}}``, ``overall`` among the families."""
    from selfspec.app._specbench import FAMILIES

    fams = [
        f for f in FAMILIES if any(family(x["category"]) == f for ls in lines.values() for x in ls)
    ]
    groups = [*fams, OVERALL]

    def pick(ls: Sequence[dict[str, Any]], g: str) -> list[dict[str, Any]]:
        return [x for x in ls if g == OVERALL or family(x["category"]) == g]

    base = {g: _stats(pick(lines.get(baseline, []), g))[0] for g in groups}
    out: dict[str, Any] = {}
    for m, ls in lines.items():
        out[m] = {}
        for g in groups:
            got = pick(ls, g)
            tps, acc, n = _stats(got)
            b = base[g]
            out[m][g] = {
                "tokens_per_s": tps,
                "speedup": tps / b if tps is not None and b else None,
                "mean_accepted": acc,
                "questions": n,
                "errors": sum("ERROR" in x["choices"][0]["turns"] for x in got),
            }
    return {"baseline": baseline, "families": groups, "methods": out}


def leaderboard_markdown(report: dict[str, Any]) -> list[str]:
    """The leaderboard-style table: one row per method, the speedup per family and overall,
    and #Mean Accepted Tokens (over every question)."""
    from selfspec.app._specbench import LABELS

    groups = report["families"]
    head = [LABELS.get(g, g) for g in groups if g != OVERALL] + ["Overall", "#Mean Accepted Tokens"]
    lines = [
        "| method | " + " | ".join(head) + " |",
        "| --- | " + " | ".join("---:" for _ in head) + " |",
    ]
    for m, by in report["methods"].items():
        cells = ["–" if by[g]["speedup"] is None else f"{by[g]['speedup']:.2f}×" for g in groups]
        acc = by[OVERALL]["mean_accepted"]
        errors = by[OVERALL]["errors"]
        name = m + (f" ({errors} question{'s' if errors != 1 else ''} failed)" if errors else "")
        lines.append(
            f"| {name} | " + " | ".join(cells) + f" | {'–' if acc is None else f'{acc:.2f}'} |"
        )
    return lines
