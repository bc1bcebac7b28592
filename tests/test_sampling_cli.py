"""Sampling on the command line: ``specdec --temperature``, ``specdec check --temperature`` and
``specdec bench --temperature``, on tiny offline models (float64: exact)."""

from __future__ import annotations

import json
import textwrap

import pytest
from _tiny_models import save_tiny_llama
from click.testing import CliRunner
from test_bench import HAS_LOOKUP, _bench_args, loaded, model_dir, tiny_task  # noqa: F401

from selfspec import Sampling, reference_generate
from selfspec.app import _models as models
from selfspec.app import encode_sample, load_task
from selfspec.app._bench import harness, results
from selfspec.app._bench.commands import bench
from selfspec.app._cli import cli
from selfspec.provisional import reference_sample

PROMPT = "the cat sat on a mat"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("cli-sampling") / "tiny", seed=1)


def invoke(*args, ok: bool = True):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    if ok and result.exit_code != 0:
        raise AssertionError(f"exit {result.exit_code}\n{result.output}") from result.exception
    return result


def run_json(tiny_dir, *args) -> dict:
    return json.loads(
        invoke("-m", tiny_dir, "--dtype", "float64", "-n", 16, "--json", *args, PROMPT).stdout
    )


def test_run_samples_like_the_reference_and_records_the_settings(tiny_dir):
    loaded64 = models.load(tiny_dir, dtype="float64")
    data = run_json(tiny_dir, "--temperature", 0.8, "--top-k", 20, "--top-p", 0.9, "--seed", 1)
    s = Sampling(0.8, 20, 0.9, 1)
    assert data["sampling"] == s.as_dict()
    assert data["output_ids"] == reference_sample(
        loaded64.model, data["prompt_ids"], 16, loaded64.eos_token_ids, s
    )
    other = run_json(tiny_dir, "--temperature", 0.8, "--top-k", 20, "--top-p", 0.9, "--seed", 2)
    greedy = run_json(tiny_dir)
    assert greedy["sampling"]["temperature"] == 0.0
    assert greedy["output_ids"] == reference_generate(
        loaded64.model, greedy["prompt_ids"], 16, loaded64.eos_token_ids
    )
    assert (
        len({tuple(data["output_ids"]), tuple(other["output_ids"]), tuple(greedy["output_ids"])})
        > 1
    )
    assert run_json(tiny_dir, "--temperature", 0, "--seed", 5)["output_ids"] == greedy["output_ids"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--temperature", "-1"], "--temperature"),
        (["--top-p", "0"], "--top-p"),
        (["--top-k", "-3"], "--top-k"),
        (["--seed", "-1"], "--seed"),
    ],
)
def test_bad_sampling_values_are_one_clean_line(tiny_dir, args, message):
    r = invoke("-m", tiny_dir, *args, "hello", ok=False)
    assert r.exit_code == 2 and "Traceback" not in r.output and message in r.output


def test_check_compares_with_vanilla_sampling(tiny_dir, tmp_path):
    r = invoke(
        "check",
        "--plugin",
        "vanilla",
        "-m",
        tiny_dir,
        "--dtype",
        "float64",
        "-n",
        8,
        "--temperature",
        0.8,
        "--seed",
        1,
        "--prompt",
        "the cat sat",
        "--prompt",
        "hello world",
    )
    assert "T=0.8 top-k=0 top-p=1 seed=1" in r.stdout and "2 OK, 0 near-tie, 0 diverged" in r.stdout
    # a verifier that ignores the sampler (picks the argmax) is lossless greedily, not under
    # sampling
    path = tmp_path / "argmax.py"
    path.write_text(
        textwrap.dedent("""
        from selfspec import Verdict, hookimpl, greedy

        @hookimpl
        def selfspec_verify(state, draft):
            base = state.length - 1
            out = state.runner.forward(state.tokens[base : base + 1], cache=state.cache, start=base)
            return Verdict((), int(greedy(out.logits)[-1]))
        """)
    )
    ok = invoke(
        "check",
        "--plugin-file",
        path,
        "-m",
        tiny_dir,
        "--dtype",
        "float64",
        "-n",
        8,
        "--prompt",
        "the cat sat",
    )
    assert "1 OK" in ok.stdout
    bad = invoke(
        "check",
        "--plugin-file",
        path,
        "-m",
        tiny_dir,
        "--dtype",
        "float64",
        "-n",
        8,
        "--temperature",
        0.8,
        "--seed",
        1,
        "--prompt",
        "the cat sat",
        "--json",
        ok=False,
    )
    assert bad.exit_code == 1
    data = json.loads(bad.stdout)
    assert data["sampling"]["seed"] == 1 and data["results"][0]["status"] == "DIVERGED"


def test_bench_samples_every_method_and_checks_plugins_against_vanilla(
    model_dir,  # noqa: F811
    tiny_task,  # noqa: F811
    tmp_path,
):
    out = tmp_path / "run"
    extra = ["--peers", "hf-pld", "--temperature", "0.9", "--top-p", "0.95", "--sample-seed", "3"]
    extra += ["--plugin", "lookup[num_draft=4]"] if HAS_LOOKUP else ["--plugin", "none"]
    res = CliRunner().invoke(bench, _bench_args(model_dir, out, *extra))
    assert res.exit_code == 0, res.output + str(res.exception)
    recs = results.read_jsonl(out / results.RECORDS)
    for r in recs:
        if r["method"] in ("hf", "hf-pld"):
            assert r["lossless"] is None  # HF's RNG: not comparable token by token
        else:
            assert r["lossless"] is True
    summary = json.loads((out / results.SUMMARY).read_text())
    assert summary["config"]["sampling"] == Sampling(0.9, 0, 0.95, 3).as_dict()
    rows = {(r["task"], r["method"]): r for r in summary["rows"]}
    assert rows[("all", "hf")]["lossless"] is None and rows[("all", "vanilla")]["divergences"] == 0
    assert "HF's RNG" in (out / results.TABLE).read_text()
    m = models.load(model_dir, dtype="float64")
    van = [r for r in recs if r["method"] == "vanilla"]
    sample = next(s for s in load_task("tiny") if s.id == van[0]["question_id"])
    ids = encode_sample(m, sample)
    eos = set(models.eos_token_ids(m.model, m.tokenizer))
    assert van[0]["output_ids"] == reference_sample(m.model, ids, 8, eos, Sampling(0.9, 0, 0.95, 3))


def test_bench_catches_a_plugin_that_ignores_the_sampler(loaded, tiny_task):  # noqa: F811
    class Argmax:
        def selfspec_verify(self, state, draft):
            from selfspec import greedy
            from selfspec._engine.contract.types import Verdict

            base = state.length - 1
            out = state.runner.forward(state.tokens[base : base + 1], cache=state.cache, start=base)
            return Verdict((), int(greedy(out.logits)[-1]))

    samples = load_task("tiny", "test")
    methods = [
        harness.Method("hf", "hf"),
        harness.Method.of_plugin("vanilla"),
        harness.Method.of_plugin("argmax", plugin_object=Argmax()),
    ]
    recs = harness.run_bench(
        loaded,
        samples,
        methods,
        max_new_tokens=8,
        progress=False,
        sampling=Sampling(1.0, 0, 1.0, 0),
        reference="vanilla",
    )
    bad = [r for r in recs if r["method"] == "argmax"]
    assert bad and any(r["lossless"] is False for r in bad)
    assert all(r["lossless"] is None for r in recs if r["method"] == "hf")
