"""README results tables are generated from the bench's summary.json files, and stay so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import readme_tables  # noqa: E402


def test_every_marked_table_equals_its_summary():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "readme_tables.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


def test_the_root_readme_table_is_generated():
    assert "README.md" in [p.name for p in readme_tables.documents() if p.parent == ROOT]


def _summary(tmp_path: Path, speedups: dict[str, dict[str, float]]) -> Path:
    rows = []
    for method, per_task in speedups.items():
        for task, x in per_task.items():
            rows.append(
                {
                    "task": task,
                    "method": method,
                    "samples": 2,
                    "speedup": x,
                    "tau": 1.5,
                    "acceptance": None,
                    "lossless": 2,
                    "near_ties": 0,
                }
            )
        rows.append(
            {
                "task": "all",
                "method": method,
                "samples": 4,
                "speedup": 1.0,
                "tau": 1.5,
                "acceptance": 0.5,
                "lossless": 4,
                "near_ties": 1,
            }
        )
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"rows": rows}))
    return path


def test_tables_are_rendered_from_the_summary(tmp_path, monkeypatch):
    _summary(
        tmp_path,
        {"hf": {"a": 1.0, "b": 1.0}, "vanilla": {"a": 2.0, "b": 8.0}, "x": {"a": 8.0, "b": 8.0}},
    )
    monkeypatch.setattr(readme_tables, "ROOT", tmp_path)
    doc = "intro\n<!-- bench-table: summary.json -->\nold\n<!-- /bench-table -->\nend\n"
    new = readme_tables.render(doc)
    assert "old" not in new and new.startswith("intro\n") and new.endswith("end\n")
    x = next(line for line in new.splitlines() if line.startswith("| `x`"))
    # geo-mean over a, b: 8.00x; against vanilla's geo-mean of 4.00x: 2.00x
    assert "| 8.00× | 2.00× | 1.50 | 0.50 | 4/4 (+1 near-tie) |" in x
    assert readme_tables.render(new) == new  # generated text is a fixed point
    compare = readme_tables.render(
        "<!-- bench-compare: A=summary.json B=summary.json -->\n<!-- /bench-compare -->"
    )
    assert "| `x` | 8.00× | 2.00× | 1.50 | 8.00× | 2.00× | 1.50 |" in compare
    assert "`x`" in readme_tables.render(
        "<!-- bench-compare: A=summary.json B=summary.json common -->\n<!-- /bench-compare -->"
    )


def test_rows_keep_a_plugin_and_its_variants(tmp_path, monkeypatch):
    _summary(
        tmp_path,
        {
            "hf": {"a": 1.0},
            "vanilla": {"a": 2.0},
            "x": {"a": 4.0},
            "x[k=1]": {"a": 3.0},
            "xy": {"a": 5.0},
        },
    )
    monkeypatch.setattr(readme_tables, "ROOT", tmp_path)
    doc = "<!-- bench-table: summary.json rows=hf,x -->\n<!-- /bench-table -->"
    methods = [
        line.split(" | ")[0]
        for line in readme_tables.render(doc).splitlines()
        if line.startswith("| `")
    ]
    assert methods == ["| `x`", "| `x[k=1]`"]  # not vanilla, not xy; hf is labelled in words
    assert "HF `generate` greedy" in readme_tables.render(doc)
    x = next(line for line in readme_tables.render(doc).splitlines() if line.startswith("| `x` "))
    assert "| 2.00× |" in x  # against vanilla, though vanilla's row is not shown
    with pytest.raises(ValueError, match="no method"):
        readme_tables.render(
            "<!-- bench-table: summary.json rows=nothing -->\n<!-- /bench-table -->"
        )
    # an item with options keeps that row only: here x's variant without x itself
    one = readme_tables.render(doc.replace("rows=hf,x", "rows=hf,x[k=1]"))
    assert [line.split(" | ")[0] for line in one.splitlines() if line.startswith("| `")] == [
        "| `x[k=1]`"
    ]


def test_a_row_measured_at_other_defaults_is_refused(tmp_path, monkeypatch):
    # a) the bench records every option value a plugin ran with; b) today's values come from
    # the installed plugin, replaced here by a stand-in whose default k is 6
    from selfspec.app._bench import harness

    path = _summary(tmp_path, {"hf": {"a": 1.0}, "vanilla": {"a": 2.0}, "x": {"a": 4.0}})
    summary = json.loads(path.read_text())
    summary["config"] = {
        "methods": [{"name": "x", "plugin": "x", "options": {}, "resolved_options": {"k": 10}}]
    }
    path.write_text(json.dumps(summary))
    monkeypatch.setattr(readme_tables, "ROOT", tmp_path)
    # see b)
    monkeypatch.setattr(harness, "resolved_options", lambda plugin, options: {"k": 6, "new": 1})
    doc = "<!-- bench-table: summary.json -->\n<!-- /bench-table -->"
    with pytest.raises(readme_tables.StaleRow, match=r"`x` was measured .*k=10 \(today 6\)"):
        readme_tables.render(doc)
    assert "`x`" not in readme_tables.render(
        doc.replace("summary.json", "summary.json rows=hf,vanilla")
    )
    monkeypatch.setattr(harness, "resolved_options", lambda plugin, options: {"k": 10})
    assert "| `x` |" in readme_tables.render(doc)  # see a): the values agree again


def test_a_spec_bench_table_shows_the_families_overall_and_mean_accepted_tokens(
    tmp_path, monkeypatch
):
    """``spec-bench-table`` renders the summary's Spec-Bench report: one column per family in the
    leaderboard's order and words, overall, overall against vanilla's, #Mean Accepted Tokens, and
    the lossless count of the method's records; a run without the report is refused."""
    path = _summary(
        tmp_path, {"hf": {"writing": 1.0}, "vanilla": {"writing": 2.0}, "x": {"writing": 6.0}}
    )
    summary = json.loads(path.read_text())
    families = (
        "mt_bench",
        "translation",
        "summarization",
        "qa",
        "math_reasoning",
        "rag",
        "overall",
    )
    report = {
        m: {
            f: {"speedup": x * (i + 1) if f != "overall" else x, "mean_accepted": 1.0 + x / 4}
            for i, f in enumerate(families)
        }
        for m, x in (("hf", 1.0), ("vanilla", 2.0), ("x", 6.0))
    }
    path.write_text(json.dumps({**summary, "spec_bench": {"baseline": "hf", "methods": report}}))
    monkeypatch.setattr(readme_tables, "ROOT", tmp_path)
    new = readme_tables.render(
        "<!-- spec-bench-table: summary.json rows=hf,x -->\n<!-- /spec-bench-table -->"
    )
    head = next(line for line in new.splitlines() if line.startswith("| method"))
    assert head.split(" | ")[1:8] == [
        "Multi-turn Conversation",
        "Translation",
        "Summarization",
        "Question Answering",
        "Mathematical Reasoning",
        "Retrieval-aug. Generation",
        "Overall",
    ]
    x = next(line for line in new.splitlines() if line.startswith("| `x`"))
    # families 6x..36x, overall 6x, against vanilla's overall 2x: 3x; MAT 1 + 6/4
    assert x == (
        "| `x` | 6.00× | 12.00× | 18.00× | 24.00× | 30.00× | 36.00× | 6.00× | 3.00× | 2.50 | "
        "4/4 (+1 near-tie) |"
    )
    assert "| `vanilla`" not in new and readme_tables.render(new) == new
    path.write_text(json.dumps(summary))
    with pytest.raises(ValueError, match="not a Spec-Bench run"):
        readme_tables.render("<!-- spec-bench-table: summary.json -->\n<!-- /spec-bench-table -->")
