"""Tests of the Spec-Bench suite of ``specdec bench``: its questions, families and draw; both
MT-bench turns; failed runs; the answer files as Spec-Bench's own scripts read them; and that no
Spec-Bench text reaches a corpus or a development prompt.

Set-up: a) a 4-layer Llama (every plugin runs on it) with random weights, float64, and a word-level
tokenizer with a chat template (words it does not know read as ``<unk>``, so every Spec-Bench
question encodes), with room for prompts of thousands of tokens; b) no timing is asserted: the
answer-file test checks that Spec-Bench's computation on the files equals the bench's summary,
whatever the figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from selfspec.app import _data as data
from selfspec.app import _specbench as sb
from selfspec.app._bench import answers, harness, results, turns
from selfspec.app._bench.commands import bench
from selfspec.app._bench.report import report as report_cmd
from selfspec.app._data import Sample
from selfspec.app._specbench import leak

WORDS = (
    "the cat sat on a mat and then dog ran to because it was late write story about tell me more "
    "translate summarize question answer one two three"
).split()
ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- fixtures
def _tokenizer():
    from _tiny_models import chat_word_tokenizer

    return chat_word_tokenizer(WORDS)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # see a)
    from transformers import LlamaConfig, LlamaForCausalLM

    d = tmp_path_factory.mktemp("tiny-specbench")
    tok = _tokenizer()
    torch.manual_seed(1)
    cfg = LlamaConfig(
        vocab_size=48,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
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


def _two_turns(qid: str = "1") -> Sample:
    return Sample(
        "mt_bench",
        qid,
        "write a story about the cat",
        f"test:{qid}",
        meta={
            "category": "writing",
            "conversation": ["write a story about the cat", "tell me more about the dog"],
        },
    )


# --------------------------------------------------------------------------- the questions
def test_the_suite_ships_480_questions_in_six_families_with_licence_and_source():
    qs = sb.questions()
    assert len(qs) == 480 and len({q["question_id"] for q in qs}) == 480
    by_family: dict[str, int] = {}
    for q in qs:
        by_family[sb.family_of(q["category"])] = by_family.get(sb.family_of(q["category"]), 0) + 1
    assert by_family == {f: 80 for f in sb.FAMILIES}
    assert all(len(q["turns"]) == (2 if q["category"] in sb.MT_BENCH_CATEGORIES else 1) for q in qs)
    assert "Apache License" in sb.data_file("LICENSE").read_text(encoding="utf-8")
    assert "hemingkx/Spec-Bench" in sb.data_file("SOURCE.md").read_text(encoding="utf-8")
    # a non-editable install carries the three files: setuptools package data names them
    import tomllib

    conf = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    shipped = conf["tool"]["setuptools"]["package-data"]["selfspec.app._specbench"]
    assert {Path(p).name for p in shipped} == {"question.jsonl", "LICENSE", "SOURCE.md"}
    with pytest.raises(data.DataError):
        sb.family_of("poetry")


def test_questions_are_drawn_per_family_reproducibly():
    two = sb.load_suite(2, seed=0)
    assert [s.task for s in two] == [f for f in sb.FAMILIES for _ in range(2)]
    assert [s.id for s in sb.load_suite(2, seed=0)] == [s.id for s in two]
    assert [s.id for s in sb.load_suite(2, seed=1)] != [s.id for s in two]
    mt = sb.load_suite(8, seed=3, families=["mt_bench"])
    # the categories in turn
    assert sorted(s.meta["category"] for s in mt) == sorted(sb.MT_BENCH_CATEGORIES)
    assert all(len(s.meta["conversation"]) == 2 for s in mt)
    # the draw of one family does not depend on which others are asked for
    assert [s.id for s in sb.load_suite(3, families=["rag"])] == [
        s.id for s in sb.load_suite(3) if s.task == "rag"
    ]
    assert len(sb.load_suite()) == 480 and len(sb.load_suite(80)) == 480
    with pytest.raises(data.DataError, match="unknown Spec-Bench family"):
        sb.load_suite(1, families=["chat"])


# --------------------------------------------------------------------------- no leak
def test_the_overlap_rule():
    q = next(q for q in sb.questions() if q["category"] == "math_reasoning")
    words = leak.words(q["turns"][0])
    # case and spacing ignored
    assert leak.overlaps("Some preamble. " + q["turns"][0].upper() + " and more")
    assert leak.overlaps(" ".join(words[3 : 3 + leak.NGRAM]))  # 13 consecutive words suffice
    assert not leak.overlaps(" ".join(words[3 : 3 + leak.NGRAM - 2]))
    short = next(t for t in sb.texts() if leak.MIN_WORDS <= len(leak.words(t)) < leak.NGRAM)
    assert leak.overlaps(f"I was asked: {short} today")
    assert not leak.overlaps(
        "the cat sat on a mat and then the dog ran to the cat because it was late"
    )


def _normalized(text: str) -> str:
    return " " + " ".join(leak.words(text)) + " "


@pytest.mark.slow(ci=True)
def test_no_spec_bench_question_or_reference_is_in_any_corpus_or_dev_text():
    """Every Spec-Bench text of at least MIN_WORDS words, whole, against every text the corpus
    side holds: the corpus texts (Self-Draft's corpus, the draft vocabulary, calibration) and
    every text of every dev sample of the project's tasks. Checked by plain containment of the
    normalized text, not by the rule that filters them."""
    side = list(data.build_corpus_texts(("sharegpt", "humaneval", "gsm8k")))
    dev = [s for t in data.task_names() for s in data.load_task(t, "dev")]
    side += [x for s in dev for x in s.texts()]
    assert len(side) > 1000  # the data packages are installed: the check saw a real corpus
    haystack = "\n".join(_normalized(x) for x in side)
    probes = {_normalized(t) for t in sb.texts() if len(leak.words(t)) >= leak.MIN_WORDS}
    assert len(probes) > 480
    found = [p.strip()[:80] for p in probes if p in haystack]
    assert not found
    # the check can fail: the questions our own tasks share with Spec-Bench are held out of dev
    held = [
        s
        for t in ("mtbench", "gsm8k")
        for s in data.load_task(t, "all")
        if s.split == data.HELD_OUT
    ]
    assert held and all(data.split_of(s.key) == "dev" for s in held)
    assert any(_normalized(s.prompt) in probes for s in held)


# --------------------------------------------------------------------------- multi-turn
def test_turn_two_is_the_chat_with_the_method_s_own_first_answer(loaded):
    from selfspec.app._models import format_conversation

    methods = [harness.Method("hf", "hf"), harness.Method.of_plugin("vanilla")]
    calls: dict[str, list[list[int]]] = {"hf": [], "vanilla": []}
    real = {m.name: harness.make_runner(m, loaded.model, loaded.tokenizer) for m in methods}

    def observed(name):
        def run(ids, n, eos):
            calls[name].append(list(ids))
            return real[name](ids, n, eos)

        return run

    recs = harness.run_bench(
        loaded,
        [_two_turns()],
        methods,
        max_new_tokens=6,
        warmup=0,
        progress=False,
        runners={m.name: observed(m.name) for m in methods},
    )
    assert [(r["method"], r["turn"]) for r in recs] == [
        ("hf", 1),
        ("hf", 2),
        ("vanilla", 1),
        ("vanilla", 2),
    ]
    assert all(r["lossless"] and r["error"] is None for r in recs)
    for name in ("hf", "vanilla"):
        first = next(r for r in recs if r["method"] == name and r["turn"] == 1)
        answer = turns.answer_text(loaded.tokenizer, first["output_ids"])
        expect = format_conversation(
            loaded, ["write a story about the cat", "tell me more about the dog"], [answer]
        )
        assert calls[name] == [calls[name][0], expect]  # turn 1, then the chat with its own answer
        assert next(r for r in recs if r["method"] == name and r["turn"] == 2)[
            "prompt_tokens"
        ] == len(expect)
    assert (
        next(r for r in recs if r["method"] == "vanilla" and r["turn"] == 2)["reference_prompt"]
        == "shared"
    )


def test_a_first_turn_that_differs_is_not_hidden_in_the_second(loaded):
    methods = [harness.Method("hf", "hf"), harness.Method.of_plugin("vanilla", name="bad")]
    hf = harness.make_runner(methods[0], loaded.model, loaded.tokenizer)
    calls: list[list[int]] = []

    def bad(ids, n, eos):  # HF greedy's output with its first token changed, every turn
        run = hf(ids, n, eos)
        return harness.Run(
            [(run.output_ids[0] + 1) % 40 + 4, *run.output_ids[1:]], run.wall_time, run.forwards
        )

    def hf_observed(ids, n, eos):
        calls.append(list(ids))
        return hf(ids, n, eos)

    recs = harness.run_bench(
        loaded,
        [_two_turns()],
        methods,
        max_new_tokens=5,
        warmup=0,
        progress=False,
        runners={"hf": hf_observed, "bad": bad},
    )
    r1, r2 = (next(r for r in recs if r["method"] == "bad" and r["turn"] == t) for t in (1, 2))
    assert r1["lossless"] is False and r1["diverged_at"] == 0
    # turn 2 ran on its own (different) chat, and was checked against HF greedy on that chat
    assert (
        r2["reference_prompt"] == "own-prompt"
        and r2["lossless"] is False
        and r2["diverged_at"] == 0
    )
    assert len(calls) == 3 and calls[2] != calls[1]


def test_a_run_that_raises_is_recorded_and_the_bench_goes_on(loaded, tmp_path, capsys):
    methods = [harness.Method("hf", "hf"), harness.Method.of_plugin("vanilla", name="short")]
    hf = harness.make_runner(methods[0], loaded.model, loaded.tokenizer)

    def short(ids, n, eos):  # a method that cannot take prompts over 6 tokens
        if len(ids) > 6:
            raise RuntimeError("the prompt does not fit")
        return hf(ids, n, eos)

    samples = [
        _two_turns("1"),
        Sample("qa", "2", "the cat", "test:2", meta={"category": "qa"}),
        Sample(
            "rag", "3", " ".join(["the cat sat on a mat"] * 300), "test:3", meta={"category": "rag"}
        ),
    ]
    writer = answers.AnswerWriter(tmp_path, "tiny", ["hf", "short"])
    recs = harness.run_bench(
        loaded,
        samples,
        methods,
        max_new_tokens=4,
        warmup=1,
        progress=False,
        runners={"hf": hf, "short": short},
        on_sample=writer,
    )
    failed = [r for r in recs if r["error"]]
    # turn 2 never ran
    assert {(r["task"], r["turn"]) for r in failed} == {("mt_bench", 1), ("rag", 1)}
    assert all(
        r["method"] == "short" and r["lossless"] is None and r["new_tokens"] == 0 for r in failed
    )
    assert all("the prompt does not fit" in r["error"] for r in failed)
    assert next(r for r in recs if r["method"] == "short" and r["task"] == "qa")["lossless"] is True
    assert "ERROR short on rag/3" in capsys.readouterr().err
    rows = {(r["task"], r["method"]): r for r in results.summarize(recs)}
    assert rows[("all", "short")]["errors"] == 2 and rows[("qa", "short")]["errors"] == 0
    lines = results.read_jsonl(writer.paths["short"])
    assert [line["choices"][0]["turns"][0] for line in lines] == [
        "ERROR",
        lines[1]["choices"][0]["turns"][0],
        "ERROR",
    ]
    assert [
        len(line["choices"][0]["turns"]) for line in results.read_jsonl(writer.paths["hf"])
    ] == [2, 1, 1]
    assert "FAILED" in results.markdown({"rows": results.summarize(recs)})


def test_hf_accept_lengths_follow_the_positions_of_its_forwards(loaded):
    assert harness.accept_lengths_from_starts([0, 5, 6, 7], 5, 4) == [1, 1, 1, 1]  # greedy
    assert harness.accept_lengths_from_starts([0, 5, 8, 9], 5, 7) == [1, 3, 1, 2]  # drafts accepted
    assert harness.accept_lengths_from_starts([0, 5, None], 5, 3) is None
    assert harness.accept_lengths_from_starts([0, 5, 5], 5, 3) is None  # not all positive
    ids = data.encode_sample(
        loaded, Sample("t", "0", "the cat sat on a mat the cat sat on a mat", "k")
    )
    for kind in ("hf", "hf-pld"):
        m = harness.Method(
            kind, kind, extra={"prompt_lookup_num_tokens": 3} if kind == "hf-pld" else {}
        )
        run = harness.make_runner(m, loaded.model, loaded.tokenizer)(ids, 10, set())
        assert run.accept_lengths is not None and sum(run.accept_lengths) == len(run.output_ids)
        assert len(run.accept_lengths) == run.forwards
        if kind == "hf":
            assert set(run.accept_lengths) == {1}


@pytest.mark.slow
def test_long_prompts_run_with_every_installed_plugin(loaded):
    """A prompt of over a thousand tokens and a budget of 1,024 new tokens with every plugin
    at its defaults: no run fails and every output equals HF greedy's."""
    from selfspec._engine.contract.plugins import BUILTIN_METHOD, available

    text = " ".join(["summarize the story about the cat and the dog because it was late"] * 80)
    sample = Sample("summarization", "long", text, "test:long", meta={"category": "summarization"})
    assert len(data.encode_sample(loaded, sample)) > 1000
    methods = [
        harness.Method("hf", "hf"),
        harness.Method.of_plugin(BUILTIN_METHOD),
        *(harness.Method.of_plugin(p) for p in available() if p != BUILTIN_METHOD),
    ]
    recs = harness.run_bench(
        loaded, [sample], methods, max_new_tokens=1024, warmup=0, progress=False
    )
    assert not [(r["method"], r["error"]) for r in recs if r["error"]]
    assert all(r["lossless"] for r in recs), [
        (r["method"], r["diverged_at"]) for r in recs if not r["lossless"]
    ]


# --------------------------------------------------------------------------- answer files
def spec_bench_speed(path: Path, base_path: Path) -> dict[str, tuple[float, float | None]]:
    """Spec-Bench's evaluation/speed.py, as its SOURCE.md describes it: per task group, the mean
    over questions of sum(new_tokens) / sum(wall_time) divided by the same for the baseline
    file; #Mean Accepted Tokens, the mean of all accept lengths. Returns {group: (speedup, tau)}."""
    mt = set(sb.MT_BENCH_CATEGORIES)

    def read(p):
        return [
            json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()
        ]

    def group(rows, g):
        return [
            r
            for r in rows
            if g == "overall" or (r["category"] in mt if g == "mt_bench" else r["category"] == g)
        ]

    out = {}
    for g in [*sb.FAMILIES, "overall"]:
        rows, base = group(read(path), g), group(read(base_path), g)
        if not rows:
            continue
        speeds = [
            sum(r["choices"][0]["new_tokens"]) / sum(r["choices"][0]["wall_time"]) for r in rows
        ]
        speeds0 = [
            sum(r["choices"][0]["new_tokens"]) / sum(r["choices"][0]["wall_time"]) for r in base
        ]
        lengths = [x for r in rows for x in r["choices"][0]["accept_lengths"]]
        out[g] = (
            (sum(speeds) / len(speeds)) / (sum(speeds0) / len(speeds0)),
            sum(lengths) / len(lengths) if lengths else None,
        )
    return out


def test_answer_files_read_as_spec_bench_does_agree_with_the_summary(model_dir, tmp_path):
    out = tmp_path / "sb"
    args = [
        "--model",
        model_dir,
        "--dtype",
        "float64",
        "--threads",
        "1",
        "--suite",
        "spec-bench",
        "--samples",
        "1",
        "--max-new-tokens",
        "6",
        "--warmup",
        "0",
        "--plugin",
        "lookup",
        "--peers",
        "hf-pld",
        "--no-plot",
        "-q",
        "--out",
        str(out),
    ]
    res = CliRunner().invoke(bench, args)
    assert res.exit_code == 0, res.output + str(res.exception)
    summary = json.loads((out / results.SUMMARY).read_text())
    assert summary["config"]["suite"] == "spec-bench" and summary["config"]["tasks"] == list(
        sb.FAMILIES
    )
    records = results.read_jsonl(out / results.RECORDS)
    assert [r["task"] for r in records if r["method"] == "hf"] == [
        "mt_bench",
        "mt_bench",
        *sb.FAMILIES[1:],
    ]
    assert all(r["lossless"] for r in records)
    files = {p.name: p for p in (out / answers.MODEL_ANSWERS).iterdir()}
    model = summary["config"]["model"]
    assert set(files) == {
        f"{answers.model_id(model, m)}.jsonl" for m in ("hf", "vanilla", "hf-pld", "lookup")
    }
    base = files[f"{answers.model_id(model, 'hf')}.jsonl"]
    report = summary["spec_bench"]
    for method in ("hf", "vanilla", "hf-pld", "lookup"):
        path = files[f"{answers.model_id(model, method)}.jsonl"]
        lines = results.read_jsonl(path)
        assert len(lines) == 6 and [sb.family_of(x["category"]) for x in lines] == list(sb.FAMILIES)
        for x in lines:  # the fields of SOURCE.md, exactly
            assert set(x) == {
                "question_id",
                "category",
                "answer_id",
                "model_id",
                "choices",
                "tstamp",
            }
            assert isinstance(x["question_id"], int) and x["model_id"] == path.stem
            (c,) = x["choices"]
            assert set(c) == {
                "index",
                "turns",
                "decoding_steps",
                "new_tokens",
                "wall_time",
                "accept_lengths",
            }
            n = 2 if x["category"] in sb.MT_BENCH_CATEGORIES else 1
            assert c["index"] == 0 and all(
                len(c[k]) == n for k in ("turns", "decoding_steps", "new_tokens", "wall_time")
            )
            assert sum(c["accept_lengths"]) == sum(c["new_tokens"]) and len(
                c["accept_lengths"]
            ) == sum(c["decoding_steps"])
        theirs = spec_bench_speed(path, base)
        assert set(theirs) == {*sb.FAMILIES, "overall"}
        for g, (speedup, tau) in theirs.items():
            ours = report["methods"][method][g]
            assert ours["speedup"] == pytest.approx(speedup, rel=1e-9)
            assert ours["mean_accepted"] == pytest.approx(tau, rel=1e-9)
    table = (out / results.TABLE).read_text()
    assert "#Mean Accepted Tokens" in table and "Retrieval-aug. Generation" in table
    # re-rendered from the records alone, the report is the same
    res = CliRunner().invoke(report_cmd, [str(out), "--no-plot"])
    assert res.exit_code == 0, res.output
    again = json.loads((out / results.SUMMARY).read_text())["spec_bench"]["methods"]
    assert again["lookup"]["overall"]["speedup"] == pytest.approx(
        report["methods"]["lookup"]["overall"]["speedup"]
    )


def test_unknown_families_are_refused(model_dir, tmp_path):
    res = CliRunner().invoke(
        bench,
        ["--model", model_dir, "--suite", "spec-bench", "--tasks", "chat", "--out", str(tmp_path)],
    )
    assert res.exit_code == 2 and "unknown Spec-Bench family" in res.output


def test_resume_keeps_finished_samples_runs_the_rest_and_refuses_another_command(
    model_dir, tmp_path
):
    out = tmp_path / "sb"
    args = [
        "--model",
        model_dir,
        "--dtype",
        "float64",
        "--threads",
        "1",
        "--suite",
        "spec-bench",
        "--samples",
        "1",
        "--max-new-tokens",
        "5",
        "--warmup",
        "0",
        "--plugin",
        "lookup",
        "--no-peers",
        "--no-plot",
        "-q",
        "--out",
        str(out),
    ]
    res = CliRunner().invoke(bench, ["--resume", *args])
    assert res.exit_code == 2 and "no bench run to resume" in res.output
    res = CliRunner().invoke(bench, args)
    assert res.exit_code == 0, res.output + str(res.exception)
    full = results.read_jsonl(out / results.RECORDS)
    # an interruption during the last family: its records are partial, the answer files truncated
    last = full[-1]["task"]
    cut = [r for r in full if r["task"] != last] + [r for r in full if r["task"] == last][:1]
    (out / results.RECORDS).write_text("".join(json.dumps(r) + "\n" for r in cut))
    for p in (out / answers.MODEL_ANSWERS).iterdir():
        p.write_text("")
    res = CliRunner().invoke(bench, ["--resume", *args])
    assert res.exit_code == 0, res.output + str(res.exception)
    assert "resuming: 5 sample(s) kept" in res.output
    again = results.read_jsonl(out / results.RECORDS)
    assert len(again) == len(full)
    kept = [r for r in full if r["task"] != last]
    assert again[: len(kept)] == kept  # finished samples are kept as measured, not rerun
    assert sorted(r["method"] for r in again if r["task"] == last) == ["hf", "lookup", "vanilla"]
    assert all(r["lossless"] for r in again)
    for p in (out / answers.MODEL_ANSWERS).iterdir():  # answer files hold every question again
        assert [sb.family_of(x["category"]) for x in results.read_jsonl(p)] == list(sb.FAMILIES)
    summary = json.loads((out / results.SUMMARY).read_text())
    assert [p["samples_kept"] for p in summary["machine"]["parts"]] == [0, 5]
    res = CliRunner().invoke(bench, ["--resume", *args[:-1], str(out), "--max-new-tokens", "7"])
    assert res.exit_code == 2 and "max_new_tokens: 5 then, 7 now" in res.output


def test_resume_reads_a_run_recorded_before_a_key_existed_as_that_key_s_default(tmp_path):
    from selfspec.app._bench import resume as rs

    config = {"model": "m", "methods": [{"name": "hf"}], "weight_layout": "auto"}
    rs.start(tmp_path, config, {"date": "then"})
    run = json.loads((tmp_path / rs.RUN).read_text())
    del run["config"]["weight_layout"]  # a run.json from before the key was recorded
    (tmp_path / rs.RUN).write_text(json.dumps(run))
    (tmp_path / results.RECORDS).write_text("")
    kept, left = rs.resume(tmp_path, config, {"date": "now"}, [], ["hf"])
    assert kept == [] and left == []
    with pytest.raises(rs.ResumeError, match="weight_layout: 'auto' then, 'model' now"):
        rs.resume(tmp_path, {**config, "weight_layout": "model"}, {}, [], ["hf"])
