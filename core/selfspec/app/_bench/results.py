"""Results: JSONL per sample, a summary per task and method, a markdown table, machine info.

Aggregates are ratios of sums over the samples of one run, never means of ratios:
``tokens_per_s`` = sum(new tokens) / sum(wall time); ``speedup`` = sum(baseline wall time) /
sum(method wall time) over the samples both ran; ``tau`` = sum(new tokens) / sum(full-model
forwards); ``acceptance`` = sum(accepted) / sum(drafted). The ``all`` task pools every sample.
The table adds, with two tasks or more, the geometric mean of the per-task speedups (every task
weighs the same, however long its outputs: the figure speed targets are usually stated in).
Samples pair by task, question and turn (a multi-turn question gives one record per turn); a
run that failed (``error``) is counted in ``errors`` and left out of every other figure, its
baseline's time included. A Spec-Bench run (``config["suite"] == "spec-bench"``) also gets
``spec_bench``: Spec-Bench's own speed report (:func:`.answers.speed_report`) and its
leaderboard-style table.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from selfspec._engine.tuning.machine import capability_note, plural

RECORDS = "results.jsonl"
SUMMARY = "summary.json"
TABLE = "results.md"
PLOT = "speedup.png"
SPEC_BENCH = "spec-bench"

REQUIRED_FIELDS = (
    "question_id",
    "task",
    "method",
    "new_tokens",
    "wall_time",
    "accept_lengths",
    "tokens_per_s",
    "tau",
    "lossless",
    "near_tie",
    "margin",
)


# --------------------------------------------------------------------------- files
def write_jsonl(path: str | os.PathLike[str], records: Iterable[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def append_jsonl(path: str | os.PathLike[str], record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def machine_info() -> dict[str, Any]:
    """:func:`selfspec._engine.tuning.machine.machine_info` (CPU model and capability, threads,
    versions, the date) plus the load average: other processes on the machine skew every
    timing."""
    from selfspec._engine.tuning.machine import machine_info as info

    return {**info(), "load_avg": load_avg()}


def load_avg() -> list[float] | None:
    """1/5/15-minute load averages: other processes on the machine skew every timing."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


# --------------------------------------------------------------------------- summary
def summarize(records: Sequence[dict[str, Any]], baseline: str = "hf") -> list[dict[str, Any]]:
    """One row per (task, method), then one per method over all tasks (``task == "all"``)."""
    methods = list(dict.fromkeys(r["method"] for r in records))
    tasks = list(dict.fromkeys(r["task"] for r in records))
    base_time = {
        _pair(r): r["wall_time"] for r in records if r["method"] == baseline and not r.get("error")
    }
    rows = []
    for task in [*tasks, "all"]:
        for m in methods:
            rs = [r for r in records if r["method"] == m and (task == "all" or r["task"] == task)]
            if rs:
                rows.append(_row(task, m, rs, base_time))
    return rows


def _pair(r: dict[str, Any]) -> tuple[str, str, int]:
    return r["task"], r["question_id"], r.get("turn", 1)


def _row(
    task: str,
    method: str,
    every: list[dict[str, Any]],
    base_time: dict[tuple[str, str, int], float],
) -> dict[str, Any]:
    rs = [r for r in every if not r.get("error")]
    tokens = sum(r["new_tokens"] for r in rs)
    wall = sum(r["wall_time"] for r in rs)
    paired = [r for r in rs if _pair(r) in base_time]
    t_base = sum(base_time[_pair(r)] for r in paired)
    t_meth = sum(r["wall_time"] for r in paired)
    forwards = sum(r.get("forwards") or 0 for r in rs)
    drafted = [r.get("drafted") for r in rs]
    accepted = [r.get("accepted") for r in rs]
    phases: dict[str, float] = {}
    extra: dict[str, float] = {}  # the plugin's own counters (Stats.extra), summed
    for r in rs:
        for k, v in (r.get("phase_s") or {}).items():
            phases[k] = phases.get(k, 0.0) + v
        for k, v in (r.get("extra") or {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                extra[k] = extra.get(k, 0) + v
    members: dict[
        str, dict[str, int]
    ] = {}  # a composition's members' counters (Stats.members), summed
    for r in rs:
        for name, counts in (r.get("members") or {}).items():
            into = members.setdefault(name, {})
            for k, v in counts.items():
                into[k] = into.get(k, 0) + v
    has_draft = all(d is not None for d in drafted) and sum(drafted) > 0  # type: ignore[arg-type]
    return {
        "task": task,
        "method": method,
        "samples": len(every),
        "errors": len(every) - len(rs),
        "new_tokens": tokens,
        "wall_time": wall,
        "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "speedup": t_base / t_meth if paired and t_meth > 0 else None,
        "tau": tokens / forwards if forwards else None,
        "acceptance": sum(accepted) / sum(drafted) if has_draft else None,  # type: ignore[arg-type]
        "phase_s": phases,
        "extra": extra,
        **({"members": members} if members else {}),
        "lossless": sum(1 for r in rs if r["lossless"])
        if any(r["lossless"] is not None for r in rs)
        else None,
        "near_ties": sum(1 for r in rs if r["near_tie"]),
        "divergences": sum(1 for r in rs if r["lossless"] is False and not r["near_tie"]),
    }


def build_summary(
    records: Sequence[dict[str, Any]],
    *,
    baseline: str,
    config: dict[str, Any],
    machine: dict[str, Any] | None = None,
) -> dict[str, Any]:
    summary = {
        "baseline": baseline,
        "config": config,
        "machine": machine if machine is not None else machine_info(),
        "rows": summarize(records, baseline),
    }
    if config.get("suite") == SPEC_BENCH:
        from selfspec.app._bench.answers import lines_by_method, speed_report

        summary["spec_bench"] = speed_report(
            lines_by_method(records, str(config.get("model"))), baseline
        )
    return summary


# --------------------------------------------------------------------------- markdown
def _f(x: Any, fmt: str = ".2f", none: str = "–") -> str:
    return none if x is None else format(x, fmt)


def _phases(p: dict[str, float]) -> str:
    total = sum(p.values())
    if not total:
        return "–"
    order = ["propose", "verify", "cache", "update"]
    keys = [k for k in order if k in p] + [k for k in p if k not in order]

    def pct(v: float) -> str:
        x = 100 * v / total
        return "<1%" if 0 < x < 0.5 else f"{x:.0f}%"

    return " / ".join(f"{k} {pct(p[k])}" for k in keys)


def _load(mach: dict[str, Any]) -> str:
    a, b = mach.get("load_avg"), mach.get("load_avg_end")
    if not a:
        return ""
    return f", 1-min load average {a[0]:.1f}" + (
        f" at the start, {b[0]:.1f} at the end" if b else ""
    )


def geomean_speedups(summary: dict[str, Any]) -> dict[str, float | None]:
    """Per method, the geometric mean of its per-task speedups (``all`` excluded); ``None``
    when a task lacks a speedup for it."""
    rows = [r for r in summary["rows"] if r["task"] != "all"]
    out: dict[str, float | None] = {}
    for m in dict.fromkeys(r["method"] for r in rows):
        xs = [r["speedup"] for r in rows if r["method"] == m]
        ok = xs and all(x is not None and x > 0 for x in xs)
        out[m] = math.exp(sum(math.log(x) for x in xs) / len(xs)) if ok else None
    return out


def markdown(summary: dict[str, Any]) -> str:
    """The results table: speedup per task and method, then every figure per row."""
    rows = summary["rows"]
    cfg, mach = summary.get("config", {}), summary.get("machine", {})
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    by = {(r["task"], r["method"]): r for r in rows}
    lines = [
        f"Model `{cfg.get('model', '?')}` ({cfg.get('dtype', '?')}, {cfg.get('device', '?')}), "
        f"{cfg.get('samples', '?')} "
        f"{'questions per family' if cfg.get('suite') == SPEC_BENCH else 'samples per task'}, "
        f"max {cfg.get('max_new_tokens', '?')} new tokens, "
        f"seed {cfg.get('seed', '?')}, {plural(mach.get('torch_threads', '?'), 'thread')}; "
        f"{mach.get('cpu', '?')}{capability_note(mach)} "
        f"({plural(mach.get('cores', '?'), 'core')}), "
        f"torch {mach.get('torch', '?')}, "
        f"transformers {mach.get('transformers', '?')}, {mach.get('date', '?')}{_load(mach)}. "
        f"Speedup = time of `{summary.get('baseline', 'hf')}` / time of the method on the same "
        "prompts.",
        "",
    ]
    if summary.get("spec_bench"):
        from selfspec.app._bench.answers import leaderboard_markdown

        sb = summary["spec_bench"]
        lines += [
            "**Spec-Bench** (speedup over `"
            + sb["baseline"]
            + "` as Spec-Bench's `evaluation/speed.py` computes it: "
            "per family, the mean over questions of tokens/s, turns summed, over the same mean of "
            "the baseline; #Mean Accepted Tokens: the mean tokens committed per verification step)",
            "",
            *leaderboard_markdown(sb),
            "",
        ]
    lines += ["**Speedup**", ""]
    geo = geomean_speedups(summary) if sum(t != "all" for t in tasks) >= 2 else None
    head = [*tasks, "geo-mean over tasks"] if geo is not None else tasks
    lines += [
        "| method | " + " | ".join(head) + " |",
        "| --- | " + " | ".join("---:" for _ in head) + " |",
    ]
    for m in methods:
        cells = [
            _f(by[(t, m)]["speedup"], ".2f") + "×"
            if (t, m) in by and by[(t, m)]["speedup"] is not None
            else "–"
            for t in tasks
        ]
        if geo is not None:
            cells.append("–" if geo.get(m) is None else f"{geo[m]:.2f}×")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "**Details**",
        "",
        "| task | method | n | tokens | tok/s | speedup | τ | acceptance | lossless | phases |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for r in rows:
        ok = "– (HF's RNG)" if r["lossless"] is None else f"{r['lossless']}/{r['samples']}"
        if r["near_ties"]:
            ok += f" (+{r['near_ties']} near-tie)"
        if r["divergences"]:
            ok += f" **{r['divergences']} DIVERGED**"
        if r.get("errors"):
            ok += f" **{r['errors']} FAILED**"
        lines.append(
            f"| {r['task']} | {r['method']} | {r['samples']} | {r['new_tokens']} | "
            f"{_f(r['tokens_per_s'], '.1f')} | {_f(r['speedup'])} | {_f(r['tau'])} | "
            f"{_f(r['acceptance'])} | {ok} | {_phases(r['phase_s'])} |"
        )
    from selfspec.app._bench.roofline import markdown as roofline_markdown

    lines += roofline_markdown(summary)
    lines += members_markdown(summary)
    lines += choices_markdown(summary)
    lines += memory_markdown(summary)
    return "\n".join(lines) + "\n"


def members_markdown(summary: dict[str, Any]) -> list[str]:
    """Each composition's members, per task: how often each proposed or was skipped, what it
    drafted and what of its own draft was accepted (no lines without a composition)."""
    rows = [r for r in summary["rows"] if r.get("members")]
    if not rows:
        return []
    lines = [
        "",
        "**Composition members** (summed over the samples: steps a member proposed in, steps the "
        "cheap-first rule skipped it, nodes it drafted into the verified tree, tokens its own "
        "draft had accepted, steps its accepted path was the longest)",
        "",
        "| task | method | member | proposed | skipped | drafted | accepted | longest "
        "| accepted per step proposed |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        for name, c in r["members"].items():
            per = c.get("accepted", 0) / c["proposed"] if c.get("proposed") else None
            lines.append(
                f"| {r['task']} | {r['method']} | {name} | {c.get('proposed', 0)} | "
                f"{c.get('skipped', 0)} | {c.get('drafted', 0)} | {c.get('accepted', 0)} | "
                f"{c.get('longest', 0)} | {_f(per)} |"
            )
    return lines


def choices_markdown(summary: dict[str, Any]) -> list[str]:
    """What each ``auto`` resolved to in this run and the measured times that chose it."""
    choices = summary.get("choices")
    if not choices:
        return []
    from selfspec._engine.tuning.calibration import Choice

    return [
        "",
        "**Measured choices**",
        "",
        *(f"- {Choice.from_dict(c).note()}" for c in choices.values()),
    ]


def memory_markdown(summary: dict[str, Any]) -> list[str]:
    """The "Memory and load time" table of ``specdec bench --memory`` (no lines without it)."""
    mem = summary.get("memory")
    if not mem:
        return []
    lines = [
        "",
        "**Memory and load time** (each method alone in a fresh process, as `specdec` runs it; "
        "peak RSS includes the Python runtime and libraries)",
        "",
        "| method | peak RSS GB | × weights | draft weights GB | model load s | method setup s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, m in mem.items():
        if "error" in m:
            lines.append(f"| {name} | – | – | – | – | – ({m['error']}) |")
            continue
        gb = m["peak_rss_bytes"] / 1e9
        dw = m.get("draft_weights_bytes")  # absent in records from before it was measured
        dw_gb = "–" if dw is None else f"{dw / 1e9:.2f}"
        lines.append(
            f"| {name} | {gb:.2f} | {m['peak_rss_bytes'] / m['weights_bytes']:.2f} | {dw_gb} | "
            f"{m['load_s']:.1f} | {m['setup_s']:.1f} |"
        )
    return lines


def render(out: str | os.PathLike[str], summary: dict[str, Any], plot: bool = True) -> list[Path]:
    """Write ``summary.json``, ``results.md`` and (optionally) ``speedup.png`` into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / SUMMARY, out / TABLE]
    (out / SUMMARY).write_text(
        json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    (out / TABLE).write_text(markdown(summary), encoding="utf-8")
    if plot:
        from selfspec.app._bench.plot import speedup_bars

        speedup_bars(summary, out / PLOT)
        written.append(out / PLOT)
    return written
