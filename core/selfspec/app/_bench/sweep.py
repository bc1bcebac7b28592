"""Grids over one or two plugin options, measured against ``vanilla`` on dev prompts.

``-o n=2,4,7 -o w=2,4,7`` gives a 3 × 3 grid; an option with one value (``-o adaptive=false``)
is fixed for every point. At most two options may vary.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from selfspec._engine.contract.options import Option, OptionError
from selfspec.app._bench.harness import Method
from selfspec.app._bench.results import summarize

SWEEP_RECORDS = "sweep.jsonl"
SWEEP_SUMMARY = "sweep.json"
SWEEP_TABLE = "sweep.md"
SWEEP_PLOT = "sweep.png"


def parse_grid(pairs: Iterable[str]) -> tuple[dict[str, str], list[tuple[str, list[str]]]]:
    """``["n=2,4,7", "w=3", "m=1,2"]`` ->
    ``({"w": "3"}, [("n", ["2","4","7"]), ("m", ["1","2"])])``."""
    fixed: dict[str, str] = {}
    axes: list[tuple[str, list[str]]] = []
    seen: set[str] = set()
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise OptionError(f"option {pair!r} is not of the form key=v1,v2,...")
        if key in seen:
            raise OptionError(f"option {key!r} is given twice")
        seen.add(key)
        values = [v.strip() for v in value.split(",")]
        if any(v == "" for v in values):
            raise OptionError(f"option {key!r}: empty value in {value!r}")
        if len(values) != len(set(values)):
            raise OptionError(f"option {key!r}: repeated value in {value!r}")
        if len(values) == 1:
            fixed[key] = values[0]
        else:
            axes.append((key, values))
    if len(axes) > 2:
        raise OptionError(f"at most two options may vary, got {', '.join(k for k, _ in axes)}")
    return fixed, axes


def typed_grid(
    declared: Mapping[str, Option],
    fixed: Mapping[str, str],
    axes: Sequence[tuple[str, Sequence[str]]],
    plugin: str,
) -> tuple[dict[str, Any], list[tuple[str, list[Any]]]]:
    """Validate and convert every value with the plugin's declared options."""
    for key in [*fixed, *(k for k, _ in axes)]:
        if key not in declared:
            known = ", ".join(sorted(declared)) or "none"
            raise OptionError(f"plugin {plugin!r} has no option {key!r} (its options: {known})")
    tf = {k: declared[k].convert(v) for k, v in fixed.items()}
    ta = [(k, [declared[k].convert(v) for v in vs]) for k, vs in axes]
    return tf, ta


def grid_methods(
    plugin: str,
    fixed: Mapping[str, Any],
    axes: Sequence[tuple[str, Sequence[Any]]],
    plugin_object: Any = None,
) -> list[tuple[tuple[Any, ...], Method]]:
    """One method per grid point (named ``plugin[k=v,...]`` by its varying options)."""
    names = [k for k, _ in axes]
    out = []
    for point in itertools.product(*(vs for _, vs in axes)):
        opts = {**fixed, **dict(zip(names, point))}
        label = plugin + (
            "[" + ",".join(f"{k}={v}" for k, v in zip(names, point)) + "]" if names else ""
        )
        out.append((tuple(point), Method(label, "plugin", plugin, opts, plugin_object)))
    return out


def summarize_sweep(
    records: Sequence[dict[str, Any]],
    plugin: str,
    fixed: Mapping[str, Any],
    axes: Sequence[tuple[str, Sequence[Any]]],
    points: Sequence[tuple[tuple[Any, ...], Method]],
    baseline: str = "vanilla",
) -> dict[str, Any]:
    rows = summarize(records, baseline)
    by = {(r["task"], r["method"]): r for r in rows}
    tasks = [t for t in dict.fromkeys(r["task"] for r in rows) if t != "all"]
    cells = []
    for point, m in points:
        r = by.get(("all", m.name))
        if r is None:
            continue
        cells.append(
            {
                "point": list(point),
                "method": m.name,
                "options": dict(m.options),
                "speedup": r["speedup"],
                "tau": r["tau"],
                "acceptance": r["acceptance"],
                "tokens_per_s": r["tokens_per_s"],
                "divergences": r["divergences"],
                "near_ties": r["near_ties"],
                "per_task": {t: by[(t, m.name)]["speedup"] for t in tasks if (t, m.name) in by},
            }
        )
    return {
        "plugin": plugin,
        "baseline": baseline,
        "fixed": dict(fixed),
        "axes": [[k, list(v)] for k, v in axes],
        "cells": cells,
        "rows": rows,
    }


def sweep_markdown(sweep: dict[str, Any]) -> str:
    """A speedup grid (rows: first option, columns: second) and one line per point."""
    from selfspec.app._bench.results import _f

    axes = sweep["axes"]
    cells = {tuple(c["point"]): c for c in sweep["cells"]}
    fixed = ", ".join(f"{k}={v}" for k, v in sweep["fixed"].items()) or "none"
    lines = [
        f"Sweep of `{sweep['plugin']}` against `{sweep['baseline']}` (fixed options: {fixed}); "
        f"speedup = time of {sweep['baseline']} / time of the point on the same dev prompts.",
        "",
    ]
    if len(axes) == 2:
        (n1, v1), (n2, v2) = axes
        lines += [
            f"| {n1} \\ {n2} | " + " | ".join(str(v) for v in v2) + " |",
            "| --- | " + " | ".join("---:" for _ in v2) + " |",
        ]
        for a in v1:
            row = []
            for b in v2:
                c = cells.get((a, b))
                row.append(
                    "–"
                    if c is None
                    else _f(c["speedup"])
                    + ("×" if c["speedup"] is not None else "")
                    + (" ✗" if c["divergences"] else "")
                )
            lines.append(f"| {a} | " + " | ".join(row) + " |")
        lines.append("")
    tasks = list(dict.fromkeys(t for c in sweep["cells"] for t in c["per_task"]))
    lines += [
        "| point | speedup | τ | acceptance | tok/s | " + " | ".join(tasks) + " | divergences |",
        "| --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in tasks) + " | ---: |",
    ]
    for c in sweep["cells"]:
        per = " | ".join(_f(c["per_task"].get(t)) for t in tasks)
        lines.append(
            f"| {c['method']} | {_f(c['speedup'])} | {_f(c['tau'])} | {_f(c['acceptance'])} | "
            f"{_f(c['tokens_per_s'], '.1f')} | {per} | {c['divergences']} |"
        )
    return "\n".join(lines) + "\n"
