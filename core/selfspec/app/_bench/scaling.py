"""The scaling picture: one bench ``summary.json`` per model size, side by side, plus a projection.

Measured, per method and model: the geometric mean of the per-task speedups over HF greedy
(:func:`results.geomean_speedups`, task ``all`` excluded), τ of the ``all`` row, the speedup over
``vanilla`` and the relative step cost ``r`` (below). Projected, per method, for a bigger model:
τ, ``r`` and the speedup over ``vanilla`` on this kind of CPU and on a GPU, from a cost model
that :func:`projection` states. A projection is arithmetic on measurements, never a measurement.

Pure functions on plain dicts; nothing here imports torch or matplotlib.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from selfspec._engine.tuning.machine import capability_note
from selfspec.app._bench.plot import format_params
from selfspec.app._bench.results import SUMMARY, geomean_speedups

SCALING_JSON = "scaling.json"
SCALING_TABLE = "scaling.md"
SCALING_PLOT = "scaling.png"

# Qwen2.5-7B: 7.6e9 parameters, 28 layers, hidden size 3584.
TARGET = {"name": "Qwen2.5-7B-sized", "params": 7.6e9, "layers": 28, "hidden": 3584}
TAU_HEADROOM = 1.5  # a projected τ stays below 1.5 × the largest τ the method reached
_EARLY_EXIT = re.compile(r"^hf-early-exit\[\d+\]$")
_MODEL_KEYS = ("model_params", "model_layers", "model_hidden")


class ScalingError(ValueError):
    """Summaries that cannot be put side by side (the command turns it into a one-line error)."""


# --------------------------------------------------------------------------- loading
def load_summary(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """A bench directory's ``summary.json``, checked to be a bench (not a sweep) of this version."""
    d = Path(directory)
    path = d / SUMMARY
    if not path.is_file():
        sweep = (
            " (it holds a sweep: sweep.json; scaling needs `specdec bench` directories)"
            if (d / "sweep.json").is_file()
            else ""
        )
        raise ScalingError(f"{d}: no {SUMMARY}{sweep}")
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ScalingError(f"{path}: cannot read it: {exc}") from exc
    if not isinstance(summary, dict) or "cells" in summary or "axes" in summary:
        raise ScalingError(
            f"{path} is a sweep's summary; scaling needs `specdec bench` directories"
        )
    if "rows" not in summary:
        raise ScalingError(f"{path} has no rows: not a `specdec bench` summary")
    missing = [k for k in _MODEL_KEYS if not isinstance(summary.get("config", {}).get(k), int)]
    if missing:
        raise ScalingError(
            f"{path}: config lacks {', '.join(missing)} (re-run the bench with this version)"
        )
    return summary


# --------------------------------------------------------------------------- measured
def method_label(name: str) -> str:
    """The name a method is lined up by across models: ``hf-early-exit[7]`` -> ``hf-early-exit``
    (each model exits at its own layer); every other name unchanged."""
    return "hf-early-exit" if _EARLY_EXIT.match(name) else name


def scaling_table(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Models sorted by parameter count and, per method, one entry per model that ran it.

    ``{"models": [{name, params, layers, hidden, dtype, cpu, max_new_tokens, tasks, ok, samples}],
    "methods": {label: [{model, params, name, speedup, speedup_vs_vanilla, tau, r, ok, samples,
    phase_s}]}}``: ``speedup`` is the geo-mean over tasks of the speedup over HF greedy;
    ``speedup_vs_vanilla`` is that divided by vanilla's; ``tau`` the ``all`` row's; ``r`` =
    τ / speedup_vs_vanilla, the cost of one of the method's steps in vanilla steps; ``ok`` =
    lossless + near-tie samples of the ``all`` row, out of ``samples``.
    """
    if not summaries:
        raise ScalingError("no summaries")
    for s in summaries:
        missing = [k for k in _MODEL_KEYS if not isinstance(s.get("config", {}).get(k), int)]
        if missing:
            raise ScalingError(
                f"summary of {s.get('config', {}).get('model', '?')}: config lacks "
                f"{', '.join(missing)} (re-run the bench with this version)"
            )
    ordered = sorted(summaries, key=lambda s: s["config"]["model_params"])
    names = [str(s["config"].get("model", "?")) for s in ordered]
    params = [s["config"]["model_params"] for s in ordered]
    for j, i in itertools.combinations(range(len(ordered)), 2):
        if names[i] == names[j] or params[i] == params[j]:
            raise ScalingError(
                f"two summaries of the same model or size ({names[j]}, {names[i]}: {params[i]} "
                "parameters); scaling needs one bench per model size"
            )
    models: list[dict[str, Any]] = []
    methods: dict[str, list[dict[str, Any]]] = {}
    for s, name in zip(ordered, names):
        cfg, mach = s["config"], s.get("machine", {})
        all_rows = {r["method"]: r for r in s["rows"] if r["task"] == "all"}
        geo = geomean_speedups(s)
        labels = {m: method_label(m) for m in [*geo, *all_rows]}
        if len(set(labels.values())) < len(
            labels
        ):  # two early-exit layers in one run: keep both names
            labels = {m: m for m in labels}
        models.append(
            {
                "name": name,
                "params": cfg["model_params"],
                "layers": cfg["model_layers"],
                "hidden": cfg["model_hidden"],
                "dtype": cfg.get("dtype"),
                "cpu": f"{mach.get('cpu', '?')}{capability_note(mach)}",
                "max_new_tokens": cfg.get("max_new_tokens"),
                "tasks": [t for t in dict.fromkeys(r["task"] for r in s["rows"]) if t != "all"],
                "ok": sum(r["lossless"] + r["near_ties"] for r in all_rows.values()),
                "samples": sum(r["samples"] for r in all_rows.values()),
            }
        )
        base = geo.get("vanilla")
        for m, label in labels.items():
            row = all_rows.get(m, {})
            speedup = geo.get(m)
            vs = speedup / base if speedup is not None and base else None
            tau = row.get("tau")
            methods.setdefault(label, []).append(
                {
                    "model": name,
                    "params": cfg["model_params"],
                    "name": m,
                    "speedup": speedup,
                    "speedup_vs_vanilla": vs,
                    "tau": tau,
                    "r": tau / vs if tau is not None and vs else None,
                    "ok": row.get("lossless", 0) + row.get("near_ties", 0) if row else None,
                    "samples": row.get("samples") if row else None,
                    "phase_s": row.get("phase_s") or {},
                }
            )
    return {"models": models, "methods": methods}


# --------------------------------------------------------------------------- projected
ASSUMPTIONS = (
    "τ (tokens per full-model forward) and r (the cost of one of the method's steps in vanilla "
    "steps, measured as r = τ / speedup over vanilla) are extrapolated linearly in "
    "log10(parameters) from the two largest models that ran the method (held constant when only "
    "one did)",
    f"τ is clamped to [1, {TAU_HEADROOM} × the largest τ the method reached]; r to r ≥ 1",
    "CPU: a step costs what it cost here, so speedup over vanilla = τ / r",
    "GPU: a decode step is memory-bound, so verifying a block costs about one single-token "
    "forward; only drafting keeps its relative cost. With p = propose / (propose + verify) "
    "seconds of the largest model's run (0 without phase timings: drafting then counts as free), "
    "drafting costs r·p vanilla steps, so r_gpu = 1 + min(r − 1, r·p) (= 1 + (r − 1)·d, d the "
    "share of r − 1 that is drafting) and speedup over vanilla = τ / r_gpu",
    "nothing else changes with size: the same prompts, dtype and max new tokens as measured",
)


def _extrapolate(points: list[tuple[float, float]], x: float) -> float:
    """Linear in log10(params) through the two largest points; constant with one."""
    if len(points) == 1:
        return points[0][1]
    (x1, y1), (x2, y2) = points[-2:]
    lx1, lx2 = math.log10(x1), math.log10(x2)
    return y2 + (y2 - y1) * (math.log10(x) - lx2) / (lx2 - lx1)


def projection(
    table: dict[str, Any],
    target_params: float = TARGET["params"],
    target_layers: int = TARGET["layers"],
    target_hidden: int = TARGET["hidden"],
) -> dict[str, Any]:
    """PROJECTION, per method, of τ, r and the speedup over vanilla for a model of
    ``target_params`` parameters, on this kind of CPU and on a GPU. A cost model, not a measurement:

    a) per model, ``r = τ / speedup_vs_vanilla`` is the cost of one of the method's steps in
       vanilla steps (vanilla: τ = 1, r = 1);
    b) τ and r are extrapolated linearly in log10(parameters) from the two largest models that ran
       the method (held constant when only one did); τ is clamped to
       ``[1, TAU_HEADROOM × max measured τ]``, r to ``r >= 1``;
    c) CPU: speedup over vanilla = τ / r;
    d) GPU: verification of a block costs about one single-token forward (memory-bound), drafting
       keeps its relative cost. With ``p = propose / (propose + verify)`` from the largest model's
       ``all`` row (0 without phase timings), drafting costs ``r·p`` vanilla steps, so
       ``r_gpu = 1 + min(r - 1, r·p)``, i.e. ``1 + (r - 1)·d`` with ``d`` the share of ``r - 1``
       that is drafting, and speedup over vanilla = τ / r_gpu.

    ``target_layers`` and ``target_hidden`` label the target; the cost model uses only the
    parameter count.
    """
    out: dict[str, Any] = {}
    for label, entries in table["methods"].items():
        pts = [e for e in entries if e["tau"] is not None and e["r"] is not None]
        if not pts:
            out[label] = {
                "tau": None,
                "r_cpu": None,
                "speedup_cpu": None,
                "p": None,
                "r_gpu": None,
                "speedup_gpu": None,
                "from": [],
                "note": "no τ or no speedup over vanilla measured",
            }
            continue
        tau = _extrapolate([(e["params"], e["tau"]) for e in pts], target_params)
        tau = min(max(tau, 1.0), TAU_HEADROOM * max(e["tau"] for e in pts))
        r = max(1.0, _extrapolate([(e["params"], e["r"]) for e in pts], target_params))
        phases = pts[-1]["phase_s"]
        prop, ver = phases.get("propose", 0.0), phases.get("verify", 0.0)
        p = prop / (prop + ver) if prop + ver > 0 else 0.0
        r_gpu = 1.0 + min(r - 1.0, r * p)
        notes = []
        if prop + ver <= 0 and r > 1.0:
            notes.append("no phase timings: drafting counted as free on the GPU")
        if len(pts) == 1:
            notes.append("one model: held constant")
        out[label] = {
            "tau": tau,
            "r_cpu": r,
            "speedup_cpu": tau / r,
            "p": p,
            "r_gpu": r_gpu,
            "speedup_gpu": tau / r_gpu,
            "from": [e["model"] for e in pts[-2:]],
            "note": "; ".join(notes),
        }
    return {
        "kind": "projection (a cost model, not a measurement)",
        "target": {
            "name": TARGET["name"]
            if target_params == TARGET["params"]
            else format_params(target_params),
            "params": target_params,
            "layers": target_layers,
            "hidden": target_hidden,
        },
        "assumptions": list(ASSUMPTIONS),
        "methods": out,
    }


# --------------------------------------------------------------------------- markdown
def _x(x: float | None, fmt: str = ".2f", suffix: str = "") -> str:
    return "–" if x is None else format(x, fmt) + suffix


def _differing(models: list[dict[str, Any]]) -> list[str]:
    keys = {"dtype": "dtype", "cpu": "CPU", "max_new_tokens": "max new tokens", "tasks": "tasks"}
    return [label for k, label in keys.items() if len({json.dumps(m[k]) for m in models}) > 1]


def scaling_markdown(table: dict[str, Any], proj: dict[str, Any] | None = None) -> str:
    """The measured tables (speedup over HF greedy, over vanilla, τ), then the labelled
    projection."""
    models = table["models"]
    big = models[-1]
    lines = [
        "Models: "
        + "; ".join(
            f"`{m['name']}` ({format_params(m['params'])} parameters, {m['layers']} layers, "
            f"hidden {m['hidden']}, {m['dtype']}, {m['ok']}/{m['samples']} outputs lossless)"
            for m in models
        )
        + ".",
        f"{big['cpu']}, max {big['max_new_tokens']} new tokens, tasks {', '.join(big['tasks'])}. "
        "Speedups are geometric means of the per-task speedups.",
        "",
    ]
    differ = _differing(models)
    if differ:
        lines += [f"**Not like for like**: the runs differ in {', '.join(differ)}.", ""]
    head = [f"{m['name']} ({format_params(m['params'])})" for m in models]
    tables = (
        ("Speedup over HF greedy (geo-mean over tasks)", "speedup", ".2f", "×"),
        ("Speedup over vanilla", "speedup_vs_vanilla", ".2f", "×"),
        ("τ (tokens per full-model forward)", "tau", ".2f", ""),
        ("r (step cost in vanilla steps = τ / speedup over vanilla)", "r", ".2f", ""),
    )
    for title, key, fmt, suffix in tables:
        lines += [
            f"**{title}**",
            "",
            "| method | " + " | ".join(head) + " |",
            "| --- | " + " | ".join("---:" for _ in head) + " |",
        ]
        for label, entries in table["methods"].items():
            by = {e["model"]: e for e in entries}
            lines.append(
                f"| {label} | "
                + " | ".join(
                    _x(by[m["name"]][key], fmt, suffix) if m["name"] in by else "–" for m in models
                )
                + " |"
            )
        lines.append("")
    if proj is not None:
        t = proj["target"]
        lines += [
            f"**PROJECTION for a {t['name']} model ({format_params(t['params'])} parameters, "
            f"{t['layers']} layers, hidden {t['hidden']}): a cost model, not a measurement.**",
            "",
            "Assumptions:",
            "",
            *(f"- {a}." for a in proj["assumptions"]),
            "",
            "| method | τ | r (CPU) | speedup over vanilla, CPU | p (drafting share) | r (GPU) "
            "| speedup over vanilla, GPU | from | note |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
        ]
        for label, e in proj["methods"].items():
            lines.append(
                f"| {label} | {_x(e['tau'])} | {_x(e['r_cpu'])} | "
                f"{_x(e['speedup_cpu'], '.2f', '×')} | "
                f"{_x(e['p'])} | {_x(e['r_gpu'])} | {_x(e['speedup_gpu'], '.2f', '×')} | "
                f"{', '.join(e['from']) or '–'} | {e['note']} |"
            )
    return "\n".join(lines) + "\n"


def render_scaling(
    out: str | os.PathLike[str], table: dict[str, Any], proj: dict[str, Any], plot: bool = True
) -> list[Path]:
    """Write ``scaling.json``, ``scaling.md`` and (optionally) ``scaling.png`` into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / SCALING_JSON).write_text(
        json.dumps({"measured": table, "projection": proj}, indent=2, ensure_ascii=False) + "\n",
        encoding="utf-8",
    )
    (out / SCALING_TABLE).write_text(scaling_markdown(table, proj), encoding="utf-8")
    written = [out / SCALING_JSON, out / SCALING_TABLE]
    if plot:
        from selfspec.app._bench.plot import scaling_plot

        scaling_plot(table, out / SCALING_PLOT)
        written.append(out / SCALING_PLOT)
    return written
