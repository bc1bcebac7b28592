"""``bench --resume``: go on with an interrupted run in the same output folder.

A bench writes every sample's records to ``results.jsonl`` together, after every method has
run on that sample (:func:`selfspec.app._bench.harness.run_bench`), and the command it runs to
``run.json`` before the first sample. A resumed run checks that it is the same command
(:data:`SAME`), keeps the samples every method has a record of, drops a sample's partial
records, and runs the remaining samples only; the summary is built from both. Every sample's
methods still run interleaved in one process, so each speedup is a ratio measured at one time;
``run.json`` lists when each part ran and how loaded the machine was then.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: What must be equal between the interrupted run and its resumption.
SAME = (
    "model",
    "dtype",
    "device",
    "suite",
    "tasks",
    "samples",
    "max_new_tokens",
    "seed",
    "split",
    "sampling",
    "method_names",
    "threads",
    "placement",
    "weight_layout",
)
#: The value of a key a ``run.json`` written without it stands for.
DEFAULTS = {"weight_layout": "auto"}
RUN = "run.json"


class ResumeError(ValueError):
    """The folder holds no run to resume, or another command's run."""


def start(outdir: Path, config: dict[str, Any], machine: dict[str, Any]) -> None:
    """Record a fresh run's command and machine in ``outdir/run.json``."""
    run = {"config": _key(config), "parts": [_part(machine, 0)]}
    (outdir / RUN).write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")


def resume(
    outdir: Path,
    config: dict[str, Any],
    machine: dict[str, Any],
    samples: Sequence[Any],
    methods: Sequence[str],
) -> tuple[list[dict[str, Any]], list[Any]]:
    """``(kept records, samples still to run)`` for a resumed run in ``outdir``; rewrites
    ``results.jsonl`` to the kept records and adds this part to ``run.json``."""
    from selfspec.app._bench.results import RECORDS, read_jsonl

    check_folder(outdir)
    path = outdir / RUN
    run = json.loads(path.read_text(encoding="utf-8"))
    now = _key(config)
    then = {**DEFAULTS, **run["config"]}
    differ = [k for k in SAME if then.get(k) != now.get(k)]
    if differ:
        was = ", ".join(f"{k}: {then.get(k)!r} then, {now.get(k)!r} now" for k in differ)
        raise ResumeError(f"--resume needs the interrupted run's command; these differ: {was}")
    records = read_jsonl(outdir / RECORDS)
    done = complete_samples(records, methods)
    kept = [r for r in records if (r["task"], r["question_id"]) in done]
    with open(outdir / RECORDS, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in kept)
    left = [s for s in samples if (s.task, s.id) not in done]
    run["parts"].append(_part(machine, len(done)))
    path.write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")
    return kept, left


def check_folder(outdir: Path) -> None:
    """:class:`ResumeError` unless ``outdir`` holds a run that started (cheap: before a model
    loads)."""
    from selfspec.app._bench.results import RECORDS

    if not (outdir / RUN).exists() or not (outdir / RECORDS).exists():
        raise ResumeError(
            f"{outdir} holds no bench run to resume ({RUN} and {RECORDS} are written when a run "
            "starts); run without --resume"
        )


def complete_samples(
    records: Sequence[dict[str, Any]], methods: Sequence[str]
) -> set[tuple[str, str]]:
    """The ``(task, question_id)`` of every sample each of ``methods`` has a record of."""
    seen: dict[tuple[str, str], set[str]] = {}
    for r in records:
        seen.setdefault((r["task"], r["question_id"]), set()).add(r["method"])
    return {k for k, ms in seen.items() if set(methods) <= ms}


def parts(outdir: Path) -> list[dict[str, Any]]:
    """When each part of the run in ``outdir`` started (empty when there is no ``run.json``)."""
    path = outdir / RUN
    return json.loads(path.read_text(encoding="utf-8"))["parts"] if path.exists() else []


def _key(config: dict[str, Any]) -> dict[str, Any]:
    key = {k: config.get(k) for k in SAME if k != "method_names"}
    key["method_names"] = [m["name"] for m in config.get("methods", [])]
    return json.loads(json.dumps(key, default=str))


def _part(machine: dict[str, Any], samples_kept: int) -> dict[str, Any]:
    return {
        "date": machine.get("date"),
        "load_avg": machine.get("load_avg"),
        "cpu": machine.get("cpu"),
        "samples_kept": samples_kept,
    }
