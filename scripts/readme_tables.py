#!/usr/bin/env python3
"""Results tables in READMEs, generated from the bench's ``summary.json`` files.

A table lives between two markers; everything between them is this script's output::

    <!-- bench-table: lab/results/smollm2-135m-instruct/bench-zen4-avx512-2026-11-23/summary.json -->
    ...
    <!-- /bench-table -->

    <!-- bench-compare: AVX-512=lab/results/smollm2-135m-instruct/bench-zen4-avx512-2026-11-23/summary.json AVX2=lab/results/smollm2-135m-instruct/bench-zen3-avx2-2026-11-24/summary.json -->
    ...
    <!-- /bench-compare -->

    <!-- spec-bench-table: lab/results/qwen2.5-coder-1.5b/spec-bench-zen4-avx512-2026-11-25/summary.json -->
    ...
    <!-- /spec-bench-table -->

``spec-bench-table``: a ``bench --suite spec-bench`` run as Spec-Bench's leaderboard shows it: a
row per method, speedup over HF greedy per family (Spec-Bench's computation, the summary's
``spec_bench``), overall, the same against ``vanilla``, #Mean Accepted Tokens, and how many
outputs equalled HF greedy's (``rows=`` as below).
``bench-table``: one run, a row per method: speedup over HF greedy per task, over all samples,
the geometric mean over the geo-mean tasks, the same against ``vanilla``, τ, acceptance, and
how many outputs equalled HF greedy's. ``bench-compare``: several runs of the same methods
side by side (geo-mean against HF greedy and against ``vanilla``, τ), one column group per
``LABEL=PATH`` (with the item ``common``, only the methods every run measured). Paths are
relative to the repository root. An optional ``geo=a,b,c`` item in a marker picks the geo-mean
tasks (default: humaneval, gsm8k, mtbench, sharegpt where present); an optional ``rows=a,b``
item keeps the methods named ``a`` or ``a[...]`` (its variants), in the summary's order, so a
plugin's README shows its own rows of the full bench; an item with options, ``a[k=1]``, keeps
that one row (so a plugin's old-default row can be left out while its variants stay)::

    <!-- bench-table: lab/results/smollm2-135m-instruct/bench-zen4-avx512-2026-11-23/summary.json rows=hf,vanilla,selfsd -->

    python scripts/readme_tables.py            # rewrite every table in place
    python scripts/readme_tables.py --check    # exit 1, naming the file, if any is stale

``tests/test_readme_tables.py`` runs ``--check``: a table cannot disagree with its summary.
Nor can it show a plugin measured at other option values than today's: a bench records every
option value each plugin ran with (``resolved_options`` in the summary's ``config.methods``),
and a row whose values differ from what the installed plugin resolves the same options to
today (a default changed since) is refused, naming the option; re-run the bench, or leave the
row out with ``rows=``. Summaries written before the bench recorded them are not checked.
"""  # noqa: E501 (the markers above are quoted whole: one line each, as they stand in a README)

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GEO_TASKS = ("humaneval", "gsm8k", "mtbench", "sharegpt")
BLOCK = re.compile(
    r"(<!-- (bench-table|bench-compare|spec-bench-table): ([^>]*?) -->\n)(.*?)(<!-- /\2 -->)", re.S
)


class StaleRow(ValueError):
    """A row was measured with other option values than the plugin uses today."""


def _label(method: str, sampling: bool = False) -> str:
    if method == "hf":
        return "HF `generate` sampling" if sampling else "HF `generate` greedy"
    return f"`{method}`"


def _x(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}×"


def _geo(values: list[float | None]) -> float | None:
    if not values or any(v is None or v <= 0 for v in values):
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))  # type: ignore[arg-type]


class Run:
    """One bench run's ``summary.json``, indexed for table-making."""

    def __init__(
        self, path: Path, geo: tuple[str, ...] | None = None, keep: tuple[str, ...] | None = None
    ) -> None:
        self.path = path
        self.summary: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        rows = self.summary["rows"]
        self.by = {(r["task"], r["method"]): r for r in rows}
        self.tasks = [t for t in dict.fromkeys(r["task"] for r in rows) if t != "all"]
        methods = list(dict.fromkeys(r["method"] for r in rows))
        # rows=: a bare name keeps the method and its variants, a name with [...] that row only
        self.methods = (
            methods
            if keep is None
            else [m for m in methods if m in keep or m.split("[", 1)[0] in keep]
        )
        if not self.methods:
            raise ValueError(f"{path}: no method among {list(keep or ())}")
        self.configs = {m["name"]: m for m in self.summary.get("config", {}).get("methods", [])}
        self.geo_tasks = [t for t in (geo or GEO_TASKS) if t in self.tasks] or self.tasks

    def stale(self, method: str) -> list[str]:
        """How ``method``'s recorded option values differ from today's (empty: they agree, or
        nothing was recorded, or the plugin is not installed here)."""
        entry = self.configs.get(method) or {}
        recorded = entry.get("resolved_options")
        if recorded is None or not entry.get("plugin"):
            return []
        try:
            from selfspec._engine.contract.plugins import PluginError
            from selfspec.app._bench.harness import resolved_options
        except ImportError:
            return []
        try:
            today = resolved_options(entry["plugin"], dict(entry.get("options") or {}))
        except PluginError:  # not installed here
            return []
        except ValueError as exc:  # an option it ran with is gone or invalid now
            return [str(exc)]
        return [
            f"{k}={recorded[k]!r} (today {today[k]!r})"
            for k in recorded
            if k in today and recorded[k] != today[k]
        ]

    def speedup(self, task: str, method: str) -> float | None:
        row = self.by.get((task, method))
        return None if row is None else row.get("speedup")

    def geo(self, method: str) -> float | None:
        return _geo([self.speedup(t, method) for t in self.geo_tasks])

    def vs_vanilla(self, method: str) -> float | None:
        mine, base = self.geo(method), self.geo("vanilla")
        return None if mine is None or not base else mine / base

    @property
    def sampled(self) -> bool:
        """Whether the run sampled (``specdec bench --temperature``): HF is then HF sampling."""
        return bool((self.summary.get("config", {}).get("sampling") or {}).get("temperature"))

    def all_row(self, method: str) -> dict[str, Any]:
        return self.by[("all", method)]


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = [
        "| " + " | ".join(head) + " |",
        "| --- | " + " | ".join("---:" for _ in head[1:]) + " |",
    ]
    return "\n".join([*lines, *("| " + " | ".join(cells) + " |" for cells in rows)]) + "\n"


def _checked_all_row(run: Run, method: str) -> dict[str, Any]:
    """``method``'s row over all samples, refusing a row measured at other option values than
    today's."""
    if stale := run.stale(method):
        raise StaleRow(
            f"{run.path}: `{method}` was measured with other option values than today's: "
            f"{', '.join(stale)}; re-run the bench or leave the row out (rows=)"
        )
    return run.all_row(method)


def _lossless(a: dict[str, Any]) -> str:
    if a["lossless"] is None:
        return "–"
    return f"{a['lossless']}/{a['samples']}" + (
        f" (+{a['near_ties']} near-tie)" if a.get("near_ties") else ""
    )


def bench_table(run: Run) -> str:
    geo_head = f"geo-mean ({', '.join(run.geo_tasks)})"
    head = [
        "method",
        *run.tasks,
        "all",
        geo_head,
        "vs vanilla (geo-mean)",
        "τ",
        "acceptance",
        "lossless",
    ]
    rows = []
    for m in run.methods:
        a = _checked_all_row(run, m)
        acc = "–" if a.get("acceptance") is None else f"{a['acceptance']:.2f}"
        rows.append(
            [
                _label(m, run.sampled),
                *(_x(run.speedup(t, m)) for t in run.tasks),
                _x(a.get("speedup")),
                _x(run.geo(m)),
                _x(run.vs_vanilla(m)),
                f"{a['tau']:.2f}",
                acc,
                _lossless(a),
            ]
        )
    return _table(head, rows)


def spec_bench_table(run: Run) -> str:
    report = run.summary.get("spec_bench")
    if not report:
        raise ValueError(f"{run.path}: not a Spec-Bench run (no spec_bench report in the summary)")
    from selfspec.app._specbench import FAMILIES, LABELS  # the leaderboard's columns, in its order

    by = report["methods"]
    head = [
        "method",
        *(LABELS[f] for f in FAMILIES),
        "Overall",
        "vs vanilla (overall)",
        "#Mean Accepted Tokens",
        "lossless",
    ]
    base = (by.get("vanilla") or {}).get("overall", {}).get("speedup")
    rows = []
    for m in run.methods:
        a = _checked_all_row(run, m)
        fam = by.get(m, {})
        overall = fam.get("overall", {}).get("speedup")
        mat = fam.get("overall", {}).get("mean_accepted")
        rows.append(
            [
                _label(m),
                *(_x(fam.get(f, {}).get("speedup")) for f in FAMILIES),
                _x(overall),
                _x(overall / base if base and overall else None),
                "–" if mat is None else f"{mat:.2f}",
                _lossless(a),
            ]
        )
    return _table(head, rows)


def bench_compare(runs: list[tuple[str, Run]], common: bool = False) -> str:
    head = ["method"]
    for label, run in runs:
        hf = "HF sampling" if run.sampled else "HF greedy"
        head += [f"{label}: vs {hf}", f"{label}: vs vanilla", f"{label}: τ"]
    lines = [
        "| " + " | ".join(head) + " |",
        "| --- | " + " | ".join("---:" for _ in head[1:]) + " |",
    ]
    methods = list(dict.fromkeys(m for _, run in runs for m in run.methods))
    if common:  # only the methods every run measured
        methods = [m for m in methods if all(m in run.methods for _, run in runs)]
    for m in methods:
        cells = [
            "HF `generate`" if m == "hf" and any(run.sampled for _, run in runs) else _label(m)
        ]
        for _, run in runs:
            if m not in run.methods:
                cells += ["–", "–", "–"]
                continue
            cells += [_x(run.geo(m)), _x(run.vs_vanilla(m)), f"{run.all_row(m)['tau']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _parse_args(
    spec: str,
) -> tuple[list[tuple[str | None, Path]], tuple[str, ...] | None, tuple[str, ...] | None, bool]:
    sources: list[tuple[str | None, Path]] = []
    geo = keep = None
    common = False
    for item in spec.split():
        if item == "common":
            common = True
        elif item.startswith("geo="):
            geo = tuple(item[4:].split(","))
        elif item.startswith("rows="):
            # a comma inside [...] stays
            keep = tuple(re.findall(r"[^,\[]+(?:\[[^\]]*\])?", item[5:]))
        elif "=" in item:
            label, path = item.split("=", 1)
            sources.append((label, ROOT / path))
        else:
            sources.append((None, ROOT / item))
    return sources, geo, keep, common


def render_block(kind: str, spec: str) -> str:
    sources, geo, keep, common = _parse_args(spec)
    if kind == "bench-table":
        if len(sources) != 1:
            raise ValueError(f"bench-table takes one summary.json, not {spec!r}")
        return bench_table(Run(sources[0][1], geo, keep))
    if kind == "spec-bench-table":
        if len(sources) != 1:
            raise ValueError(f"spec-bench-table takes one summary.json, not {spec!r}")
        return spec_bench_table(Run(sources[0][1], geo, keep))
    return bench_compare(
        [(label or path.parent.name, Run(path, geo, keep)) for label, path in sources], common
    )


def render(text: str) -> str:
    """``text`` with every marked table regenerated."""
    return BLOCK.sub(lambda m: m.group(1) + render_block(m.group(2), m.group(3)) + m.group(5), text)


def documents() -> list[Path]:
    """Every markdown file of the repository that holds a marked table."""
    skip = {".venv", ".tox", "node_modules", ".git"}
    found = []
    for path in sorted(ROOT.rglob("*.md")):
        if skip & set(path.relative_to(ROOT).parts) or any(
            p.startswith(".venv") for p in path.parts
        ):
            continue
        if BLOCK.search(path.read_text(encoding="utf-8")):
            found.append(path)
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if a table is stale"
    )
    args = ap.parse_args(argv)
    stale = []
    for path in documents():
        text = path.read_text(encoding="utf-8")
        try:
            new = render(text)
        except StaleRow as exc:
            print(f"{path.relative_to(ROOT)}: {exc}", file=sys.stderr)
            return 1
        if new != text:
            stale.append(path.relative_to(ROOT))
            if not args.check:
                path.write_text(new, encoding="utf-8")
    if args.check and stale:
        print(
            "stale results tables (run python scripts/readme_tables.py): "
            + ", ".join(map(str, stale)),
            file=sys.stderr,
        )
        return 1
    for p in stale:
        print(f"rewrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
