"""`specdec report --scaling`: the measured table, the projection's arithmetic, the files, the
errors.

The summaries are written by hand with round numbers so every figure can be checked on paper:
a) the small model has 1e8 parameters, the big one 1e9, the default target here 1e10, so a
   linear extrapolation in log10(params) adds the big-minus-small difference once;
b) per-task speedups are chosen so their geometric mean is exact (0.5 and 2.0 -> 1.0), and the
   ``all`` row carries a speedup of 99 that must never enter the geo-mean.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from selfspec.app._bench import scaling as sc
from selfspec.app._cli import cli

HAS_MPL = importlib.util.find_spec("matplotlib") is not None
TASKS = ("humaneval", "gsm8k")


def _row(
    task: str,
    method: str,
    speedup: float,
    tau: float | None = None,
    phase_s: dict[str, float] | None = None,
    samples: int = 2,
    lossless: int = 2,
    near_ties: int = 0,
) -> dict[str, Any]:
    return {
        "task": task,
        "method": method,
        "samples": samples,
        "new_tokens": 100 * samples,
        "wall_time": 10.0,
        "tokens_per_s": 10.0 * samples,
        "speedup": speedup,
        "tau": tau,
        "acceptance": None,
        "phase_s": phase_s or {},
        "lossless": lossless,
        "near_ties": near_ties,
        "divergences": samples - lossless - near_ties,
    }


def summary(
    model: str,
    params: int,
    methods: dict[str, tuple[float, float, float | None]],
    phases: dict[str, dict[str, float]] | None = None,
    layers: int = 30,
    hidden: int = 576,
    cpu: str = "AMD EPYC",
    near_ties: dict[str, int] | None = None,
) -> dict[str, Any]:
    """``methods``: name -> (speedup on humaneval, speedup on gsm8k, τ of the ``all`` row)."""
    phases, near_ties = phases or {}, near_ties or {}
    rows = [_row(t, m, v[i]) for i, t in enumerate(TASKS) for m, v in methods.items()]
    rows += [
        _row(
            "all",
            m,
            99.0,
            v[2],
            phases.get(m),
            samples=4,
            lossless=4 - near_ties.get(m, 0),
            near_ties=near_ties.get(m, 0),
        )
        for m, v in methods.items()
    ]
    return {
        "baseline": "hf",
        "config": {
            "model": model,
            "chat": True,
            "device": "cpu",
            "dtype": "float32",
            "threads": 2,
            "tasks": list(TASKS),
            "samples": 2,
            "max_new_tokens": 64,
            "seed": 0,
            "split": "test",
            "warmup": 1,
            "methods": [{"name": m, "kind": "plugin", "plugin": m, "options": {}} for m in methods],
            "model_params": params,
            "model_layers": layers,
            "model_hidden": hidden,
        },
        "machine": {"cpu": cpu, "cores": 2, "torch_threads": 2, "cpu_capability": "AVX2"},
        "rows": rows,
    }


def small() -> dict[str, Any]:
    return summary(
        "tiny-100m",
        100_000_000,
        {
            "hf": (1.0, 1.0, 1.0),
            "vanilla": (0.5, 2.0, 1.0),  # geo 1.0
            "selfsd": (1.0, 4.0, 2.0),  # geo 2.0, 2.0× vanilla, r = 2.0 / 2.0 = 1.0
            "lookup": (0.5, 2.0, 1.5),  # geo 1.0, 1.0× vanilla, r = 1.5
            "clasp": (1.0, 4.0, 2.0),  # r = 1.0
            "hf-early-exit[7]": (0.25, 1.0, 1.0),  # geo 0.5
        },
        phases={"selfsd": {"propose": 1.0, "verify": 1.0}},
        layers=12,
        hidden=512,
        near_ties={"selfsd": 1},
    )


def big() -> dict[str, Any]:
    return summary(
        "mid-1b",
        1_000_000_000,
        {
            "hf": (1.0, 1.0, 1.0),  # 1/0.9 × vanilla, r = 0.9
            "vanilla": (0.9, 0.9, 1.0),  # geo 0.9
            "selfsd": (1.8, 1.8, 3.0),  # 2.0× vanilla, r = 1.5
            "lookup": (3.0, 3.0, 4.0),  # 10/3 × vanilla, r = 1.2
            "clasp": (0.9, 0.9, 1.2),  # 1.0× vanilla, r = 1.2
            "hf-early-exit[6]": (0.45, 1.8, 1.0),  # geo 0.9
            "hispec": (1.35, 1.35, 2.0),  # only here: 1.5× vanilla, r = 4/3
        },
        phases={"selfsd": {"propose": 1.0, "verify": 3.0, "cache": 5.0}},
        layers=24,
        hidden=2048,
        cpu="Intel Xeon",
    )


def entry(table: dict[str, Any], method: str, model: str) -> dict[str, Any]:
    return next(e for e in table["methods"][method] if e["model"] == model)


# --------------------------------------------------------------------------- measured
def test_geomean_excludes_all_and_models_sort_by_size():
    table = sc.scaling_table([big(), small()])  # given largest first
    assert [m["name"] for m in table["models"]] == ["tiny-100m", "mid-1b"]
    assert entry(table, "selfsd", "tiny-100m")["speedup"] == pytest.approx(2.0)  # see b)
    assert entry(table, "vanilla", "mid-1b")["speedup"] == pytest.approx(0.9)
    assert entry(table, "hf-early-exit", "tiny-100m")["speedup"] == pytest.approx(0.5)
    m = table["models"][1]
    assert (m["params"], m["layers"], m["hidden"], m["dtype"], m["max_new_tokens"]) == (
        1e9,
        24,
        2048,
        "float32",
        64,
    )
    assert m["cpu"] == "Intel Xeon [AVX2]" and m["tasks"] == list(TASKS)


def test_early_exit_labels_line_up_across_models():
    table = sc.scaling_table([small(), big()])
    assert "hf-early-exit[7]" not in table["methods"] and "hf-early-exit[6]" not in table["methods"]
    assert [e["name"] for e in table["methods"]["hf-early-exit"]] == [
        "hf-early-exit[7]",
        "hf-early-exit[6]",
    ]
    assert sc.method_label("hf-early-exit[12]") == "hf-early-exit"
    assert sc.method_label("selfdraft[history=false]") == "selfdraft[history=false]"
    assert sc.method_label("hf-early-exit") == "hf-early-exit"


def test_speedup_vs_vanilla_tau_and_step_cost():
    table = sc.scaling_table([small(), big()])
    e = entry(table, "selfsd", "mid-1b")
    assert e["speedup_vs_vanilla"] == pytest.approx(2.0)  # 1.8 / 0.9
    assert e["tau"] == 3.0 and e["r"] == pytest.approx(1.5)  # 3.0 / 2.0
    assert entry(table, "hf", "mid-1b")["r"] == pytest.approx(0.9)  # τ 1 / (1 / 0.9)
    assert entry(table, "vanilla", "tiny-100m")["speedup_vs_vanilla"] == pytest.approx(1.0)
    assert [e["model"] for e in table["methods"]["hispec"]] == ["mid-1b"]


def test_lossless_counts_come_from_the_all_rows():
    table = sc.scaling_table([small(), big()])
    assert entry(table, "selfsd", "tiny-100m")["ok"] == 4  # 3 lossless + 1 near-tie
    assert (table["models"][0]["ok"], table["models"][0]["samples"]) == (6 * 4, 6 * 4)
    assert table["models"][1]["samples"] == 7 * 4


def test_a_summary_without_model_params_or_of_the_same_size_is_refused():
    old = small()
    del old["config"]["model_params"]
    with pytest.raises(sc.ScalingError, match="re-run the bench"):
        sc.scaling_table([old, big()])
    twin = big()
    twin["config"]["model"] = "other-1b"
    with pytest.raises(sc.ScalingError, match="same model or size"):
        sc.scaling_table([big(), twin])


# --------------------------------------------------------------------------- projection
def test_projection_numbers_by_hand():
    p = sc.projection(sc.scaling_table([small(), big()]), 1e10, 40, 4096)["methods"]  # see a)
    s = p["selfsd"]
    assert s["tau"] == pytest.approx(4.0)  # 3 + (3 - 2)
    assert s["r_cpu"] == pytest.approx(2.0)  # 1.5 + (1.5 - 1.0)
    assert s["speedup_cpu"] == pytest.approx(2.0)  # 4 / 2
    # p = 1 / (1 + 3) from the big model (cache time is ignored); drafting costs r·p = 0.5
    # vanilla steps, less than r - 1 = 1, so r_gpu = 1.5 and the GPU speedup 4 / 1.5
    assert s["p"] == pytest.approx(0.25)
    assert s["r_gpu"] == pytest.approx(1.5)
    assert s["speedup_gpu"] == pytest.approx(8 / 3)
    assert s["from"] == ["tiny-100m", "mid-1b"]
    assert p["vanilla"]["speedup_cpu"] == pytest.approx(1.0) and p["vanilla"][
        "speedup_gpu"
    ] == pytest.approx(1.0)


def test_projection_clamps():
    p = sc.projection(sc.scaling_table([small(), big()]), 1e10, 40, 4096)["methods"]
    assert p["lookup"]["tau"] == pytest.approx(6.0)  # 4 + 2.5 = 6.5, above 1.5 × 4
    assert p["lookup"]["r_cpu"] == 1.0  # 1.2 - 0.3 = 0.9, below 1
    assert p["lookup"]["speedup_cpu"] == pytest.approx(6.0)
    # r = 1: nothing drafted to cost
    assert p["lookup"]["r_gpu"] == 1.0 and p["lookup"]["note"] == ""
    assert p["clasp"]["tau"] == 1.0  # 1.2 - 0.8 = 0.4, below 1
    assert p["clasp"]["r_cpu"] == pytest.approx(1.4)  # 1.2 + 0.2
    assert p["clasp"]["speedup_cpu"] == pytest.approx(1 / 1.4)
    assert p["hf"]["r_cpu"] == 1.0  # 0.9 - 0.1 = 0.8, below 1
    # one model: held
    assert p["hispec"]["tau"] == 2.0 and p["hispec"]["r_cpu"] == pytest.approx(4 / 3)
    assert "one model" in p["hispec"]["note"] and "no phase timings" in p["hispec"]["note"]
    # drafting counted as free
    assert p["hispec"]["r_gpu"] == 1.0 and p["hispec"]["speedup_gpu"] == 2.0


def test_projection_gpu_cost_is_capped_at_the_cpu_cost():
    table = {
        "models": [],
        "methods": {
            "m": [
                {"model": "a", "params": 1e8, "tau": 2.0, "r": 2.0, "phase_s": {}},
                {
                    "model": "b",
                    "params": 1e9,
                    "tau": 2.0,
                    "r": 2.0,
                    "phase_s": {"propose": 9.0, "verify": 1.0},
                },
            ]
        },
    }
    m = sc.projection(table)["methods"]["m"]
    assert m["p"] == pytest.approx(0.9) and m["r_cpu"] == pytest.approx(2.0)
    assert m["r_gpu"] == pytest.approx(2.0)  # r·p = 1.8 > r - 1 = 1: drafting was already all of it
    assert m["speedup_gpu"] == pytest.approx(1.0)


def test_projection_default_target_is_a_7b_model_and_log_linear():
    table = sc.scaling_table([small(), big()])
    proj = sc.projection(table)
    assert proj["target"] == {
        "name": "Qwen2.5-7B-sized",
        "params": 7.6e9,
        "layers": 28,
        "hidden": 3584,
    }
    assert "not a measurement" in proj["kind"]
    # selfsd: τ 2 -> 3 per decade, so 3 + log10(7.6)
    assert proj["methods"]["selfsd"]["tau"] == pytest.approx(3 + math.log10(7.6))


# --------------------------------------------------------------------------- output
def test_markdown_labels_the_projection_and_flags_unlike_runs():
    table = sc.scaling_table([small(), big()])
    md = sc.scaling_markdown(table, sc.projection(table))
    assert "PROJECTION" in md and "projection" in md.lower() and "not a measurement" in md
    hf_table, rest = md.split("**Speedup over vanilla**")
    vanilla_table = rest.split("**τ")[0]
    assert "| selfsd | 2.00× | 1.80× |" in hf_table
    assert "| selfsd | 2.00× | 2.00× |" in vanilla_table
    assert "| hf-early-exit | 0.50× | 0.90× |" in md
    assert "tiny-100m (100M)" in md and "mid-1b (1.0B)" in md
    assert "differ in CPU" in md  # AMD EPYC here, Intel Xeon there
    assert "hispec | – | 1.50× |" in md


def test_format_params():
    assert [sc.format_params(x) for x in (134_515_008, 494_032_768, 1_543_714_304, 7.6e9)] == [
        "135M",
        "0.5B",
        "1.5B",
        "7.6B",
    ]


@pytest.mark.skipif(not HAS_MPL, reason="matplotlib is not installed")
def test_plot_is_written(tmp_path):
    from selfspec.app._bench.plot import scaling_plot

    path = tmp_path / "s.png"
    scaling_plot(sc.scaling_table([small(), big()]), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- command
def _bench_dir(path: Path, s: dict[str, Any]) -> str:
    path.mkdir()
    (path / "summary.json").write_text(json.dumps(s), encoding="utf-8")
    return str(path)


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, ["report", *args])


def _refused(res: Any, *words: str) -> None:
    assert res.exit_code != 0
    assert isinstance(res.exception, SystemExit), res.exception  # a click error, no traceback
    assert "Traceback" not in res.output
    for w in words:
        assert w in res.output, res.output


def test_report_scaling_writes_three_files(tmp_path):
    d1, d2 = _bench_dir(tmp_path / "a", small()), _bench_dir(tmp_path / "b", big())
    out = tmp_path / "out"
    res = _invoke("--scaling", d1, d2, "--out", str(out), *([] if HAS_MPL else ["--no-plot"]))
    assert res.exit_code == 0, res.output
    assert "PROJECTION" in res.output
    data = json.loads((out / "scaling.json").read_text())
    assert [m["name"] for m in data["measured"]["models"]] == ["tiny-100m", "mid-1b"]
    assert data["projection"]["methods"]["selfsd"]["speedup_cpu"] > 1
    assert (out / "scaling.md").read_text() in res.output
    assert (out / "scaling.png").is_file() == HAS_MPL


def test_report_scaling_defaults_to_scaling_results(tmp_path, monkeypatch):
    d1, d2 = _bench_dir(tmp_path / "a", small()), _bench_dir(tmp_path / "b", big())
    monkeypatch.chdir(tmp_path)
    assert _invoke("--scaling", d1, d2, "--no-plot").exit_code == 0
    assert sorted(p.name for p in (tmp_path / "scaling-results").iterdir()) == [
        "scaling.json",
        "scaling.md",
    ]


def test_report_scaling_errors(tmp_path):
    good = _bench_dir(tmp_path / "good", big())
    empty = tmp_path / "empty"
    empty.mkdir()
    _refused(
        _invoke("--scaling", str(empty), good, "--out", str(tmp_path / "o")),
        "empty",
        "no summary.json",
    )
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps({"plugin": "lookup", "axes": [], "cells": []}))
    _refused(_invoke("--scaling", str(sweep), good), "sweep")
    swept = _bench_dir(tmp_path / "swept", {"plugin": "lookup", "axes": [], "cells": []})
    _refused(_invoke("--scaling", swept, good), "sweep")
    old = small()
    del old["config"]["model_params"]
    _refused(
        _invoke("--scaling", _bench_dir(tmp_path / "old", old), good), "old", "re-run the bench"
    )
    _refused(_invoke("--scaling", good), "at least two")
    _refused(
        _invoke("--scaling", good, _bench_dir(tmp_path / "again", big())), "both benches of mid-1b"
    )
    assert not (tmp_path / "o").exists()


def test_report_without_scaling_still_takes_one_directory(tmp_path):
    d1, d2 = _bench_dir(tmp_path / "a", small()), _bench_dir(tmp_path / "b", big())
    _refused(_invoke(d1, d2), "--scaling")
    _refused(_invoke(d1), "neither results.jsonl")  # the single-directory path, unchanged
    _refused(_invoke(), "Missing argument 'DIRECTORY'")
