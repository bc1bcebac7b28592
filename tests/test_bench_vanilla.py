"""``lab/scripts/vanilla_vs_hf.py`` and ``selfspec.app._bench.vanilla`` on a tiny random model
(no timing assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import selfspec
from selfspec._engine.runner import Runner
from selfspec._engine.runner.layout import is_transposed
from selfspec.app._bench import vanilla as bench

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "lab" / "scripts" / "vanilla_vs_hf.py"
sys.path.insert(0, str(SCRIPT.parent))

import vanilla_vs_hf  # noqa: E402

CONFIG = dict(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=256,
)


def _tiny_llama(dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(LlamaConfig(**CONFIG)).to(dtype).eval()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from _tiny_models import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "m")


def _args(model_dir: Path, out: Path) -> list[str]:
    return [
        "--model",
        str(model_dir),
        "--dtype",
        "float64",
        "--prompts",
        "2",
        "--max-new-tokens",
        "6",
        "--repeats",
        "2",
        "--threads",
        str(torch.get_num_threads()),
        "--json",
        str(out),
    ]


def test_bench_reports_speed_and_equality(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "bench.json"
    assert vanilla_vs_hf.main(_args(model_dir, out)) == 0
    printed = capsys.readouterr().out
    assert (
        "host[model] tok/s" in printed
        and "host[transposed] tok/s" in printed
        and "ratio" in printed
    )

    res = json.loads(out.read_text())
    assert res["methods"] == ["hf", "host[model]", "host[transposed]"]
    assert res["smoke_prompts"] is True and res["all_equal"] is True
    assert res["machine"]["threads"] == torch.get_num_threads()
    assert len(res["prompts"]) == 2
    for row in res["prompts"]:
        assert row["new_tokens"] == 6
        for name in res["methods"]:
            m = row[name]
            assert m["equal"] is True
            assert m["tokens_per_s"] > 0 and m["ratio"] > 0 and len(m["times_s"]) == 2
    for name, s in res["summary"].items():
        assert s["all_equal"] is True and s["tokens_per_s"] > 0
        assert s["median_ratio"] == pytest.approx(1.0) if name == "hf" else s["median_ratio"] > 0


def test_bench_flags_a_different_output(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a) pretend HF generate answered differently from the 3rd token on: the check must see it
    real = bench.reference_generate

    def shifted(model, ids, n, eos_token_ids=()):  # noqa: ANN001
        out = real(model, ids, n, eos_token_ids=eos_token_ids)
        return out[:2] + [(t + 1) % CONFIG["vocab_size"] for t in out[2:]]

    monkeypatch.setattr(bench, "reference_generate", shifted)
    out = tmp_path / "bench.json"
    assert vanilla_vs_hf.main(_args(model_dir, out)) == 1  # see a)
    res = json.loads(out.read_text())
    assert res["all_equal"] is False
    row = res["prompts"][0]["host[model]"]
    assert row["equal"] is False and row["first_difference"] == 2 and row["near_tie"] is False


def test_the_script_runs_from_the_command_line(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    env = {**__import__("os").environ, "PYTHONPATH": str(Path(selfspec.__file__).parents[1])}
    args = _args(model_dir, out)
    args[args.index("--repeats") + 1] = "1"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["all_equal"] is True


def test_the_module_has_no_command_line_of_its_own() -> None:
    # one command line for this measurement (the script); the module is a library
    assert not hasattr(bench, "main") and not hasattr(bench, "load_model")


def test_smoke_prompts_go_through_the_one_encoder(model_dir: Path) -> None:
    loaded = selfspec.app.load_model(model_dir, dtype="float64")
    assert bench.prompt_ids(loaded, 2, 97) == [
        selfspec.app.format_prompt(loaded, t) for t in bench.SMOKE_PROMPTS[:2]
    ]
    assert [len(p) for p in bench.prompt_ids(None, 2, 97)] == [20, 23]


def test_transposed_layout_equals_the_model_up_to_rounding() -> None:
    model = _tiny_llama()
    own = Runner(model)
    fast = Runner(model, weight_layout="transposed")
    ids = torch.randint(0, CONFIG["vocab_size"], (12,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = model(ids[None]).logits[0]
    assert torch.equal(own.forward(ids).logits, ref)  # the default layout is bitwise the model's
    got = fast.forward(ids).logits
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    # the model itself is untouched; the runner's copies hold the transposed weights
    assert all(p.is_contiguous() for p in model.parameters())
    assert is_transposed(fast._run_layers[0].mlp.up_proj.weight)
    assert (
        fast._run_layers[0].input_layernorm.weight is model.model.layers[0].input_layernorm.weight
    )
    with pytest.raises(ValueError, match="unknown weight layout"):
        Runner(model, weight_layout="sideways")


def test_packed_layout_is_refused_in_float64_and_close_in_float32() -> None:
    from selfspec._engine.runner.layout import PackedLinear

    with pytest.raises(ValueError, match="'packed' cannot run here: it needs float32"):
        Runner(_tiny_llama(torch.float64), weight_layout="packed")
    model = _tiny_llama(torch.float32)
    fast = Runner(model, weight_layout="packed")
    assert isinstance(fast._run_layers[0].self_attn.q_proj, PackedLinear)
    ids = torch.randint(0, CONFIG["vocab_size"], (12,), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        ref = model(ids[None]).logits[0]
    torch.testing.assert_close(fast.forward(ids).logits, ref, rtol=1e-4, atol=1e-5)


def test_runners_over_one_model_share_their_layout_copies_until_a_weight_changes() -> None:
    # a) a benchmark or sweep builds one decoder per method over one model: one set of copies
    model = _tiny_llama(torch.float32)
    a, b = Runner(model, weight_layout="transposed"), Runner(model, weight_layout="transposed")
    assert a._run_layers[0] is b._run_layers[0] and a.adapter.lm_head is b.adapter.lm_head
    assert Runner(model, weight_layout="model")._run_layers[0] is model.model.layers[0]
    # b) an in-place change of a weight makes the next runner copy afresh (never stale, see a)
    ids = torch.arange(6)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(2.0)
    c = Runner(model, weight_layout="transposed")
    assert c._run_layers[0] is not a._run_layers[0]
    with torch.inference_mode():
        ref = model(ids[None]).logits[0]
    torch.testing.assert_close(c.forward(ids).logits, ref, rtol=1e-5, atol=1e-5)
