"""Embedded models split over bare part packages (the Qwen2.5-Coder models): joining, checking,
the one-line errors, `specdec models`; the real models' own tests are marked and skip without
them."""

from __future__ import annotations

import hashlib
import importlib

import pytest
import torch
from click.testing import CliRunner

from selfspec.app import _models as models
from selfspec.app._cli import cli
from selfspec.app._models import ModelLoadError
from selfspec.app._models.embedded import (
    EMBEDDED,
    QWEN_0_5B,
    QWEN_1_5B,
    Parts,
    _Embedded,
    _parts_model,
)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))


def _fake_parts(
    tmp_path,
    monkeypatch,
    chunks: list[bytes],
    *,
    sha: str | None = None,
    present: int | None = None,
) -> Parts:
    root = tmp_path / "site"
    for n, chunk in enumerate(chunks[: present if present is not None else len(chunks)], start=1):
        pkg = root / f"fakepart{n}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{n:02d}.bin").write_bytes(chunk)
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    whole = b"".join(chunks)
    return Parts(
        "fake-part",
        "fakepart",
        len(chunks),
        "1.0",
        "fake.gguf",
        len(whole),
        sha or hashlib.sha256(whole).hexdigest(),
        "a fake model",
    )


def test_parts_join_in_order_and_check_the_sha256(tmp_path, monkeypatch):
    chunks = [b"first-" * 1000, b"second-" * 700, b"third"]
    parts = _fake_parts(tmp_path, monkeypatch, chunks)
    assert parts.requirements() == ["fake-part1==1.0", "fake-part2==1.0", "fake-part3==1.0"]
    target = tmp_path / "out" / "fake.gguf"
    parts.assemble(target, progress=False)
    assert target.read_bytes() == b"".join(chunks)


def test_a_wrong_checksum_leaves_nothing_behind(tmp_path, monkeypatch):
    parts = _fake_parts(tmp_path, monkeypatch, [b"a" * 10, b"b" * 10], sha="0" * 64)
    target = tmp_path / "out" / "fake.gguf"
    with pytest.raises(ValueError, match="sha256 .* not the pinned"):
        parts.assemble(target, progress=False)
    assert not target.exists() and not list(target.parent.iterdir())


def test_a_missing_part_names_it_and_the_install_command(tmp_path, monkeypatch):
    parts = _fake_parts(tmp_path, monkeypatch, [b"a", b"b", b"c"], present=2)
    with pytest.raises(ImportError, match=r"part 3 of 3 \(fake-part3\)"):
        parts.part_paths()
    emb = _parts_model(parts, "fake")
    monkeypatch.setitem(EMBEDDED, "fake-model", emb)
    assert not models.embedded_available("fake-model")
    with pytest.raises(ModelLoadError, match="not installed .*specdec models install fake-model"):
        models.load("fake-model")


def test_the_joined_file_is_found_in_the_cache_without_joining_again(tmp_path, monkeypatch):
    parts = _fake_parts(tmp_path, monkeypatch, [b"x" * 100, b"y" * 50])
    emb = _parts_model(parts, "fake")
    first = emb.locate(tmp_path)
    assert first == models.cache_dir() / "gguf" / "fake.gguf" and first.is_file()
    mtime = first.stat().st_mtime_ns
    assert emb.locate(tmp_path) == first and first.stat().st_mtime_ns == mtime


def test_qwen_pins_are_the_published_ones():
    assert (
        QWEN_1_5B.count == 22 and QWEN_1_5B.version == "0.2.0" and QWEN_1_5B.size == 1_117_320_768
    )
    assert QWEN_1_5B.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert QWEN_0_5B.count == 6 and QWEN_0_5B.version == "0.9.0" and QWEN_0_5B.size == 491_400_064
    assert QWEN_0_5B.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    for name, parts in (("qwen2.5-coder-1.5b", QWEN_1_5B), ("qwen2.5-coder-0.5b", QWEN_0_5B)):
        assert EMBEDDED[name].parts is parts
        assert EMBEDDED[name].install_command() == f"specdec models install {name}"


def test_pyproject_extras_pin_the_same_parts():
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert extras["qwen-1_5b"] == QWEN_1_5B.requirements()
    assert extras["qwen-0_5b"] == QWEN_0_5B.requirements()


def test_models_command_lists_every_embedded_model(monkeypatch):
    monkeypatch.setattr(_Embedded, "install_command", lambda self: "INSTALL-IT")
    monkeypatch.setattr(models.embedded, "embedded_available", lambda name=None: False)
    result = CliRunner().invoke(cli, ["models"])
    assert result.exit_code == 0, result.output
    for name in EMBEDDED:
        assert name in result.output
    assert "not installed: INSTALL-IT" in result.output


def test_models_install_refuses_an_unknown_name():
    result = CliRunner().invoke(cli, ["models", "install", "gpt-5"])
    assert result.exit_code == 2 and "is not an embedded model" in result.output


def test_bf16_gets_its_own_copy_only_without_a_float32_one(tmp_path, monkeypatch):
    from selfspec.app._models import convert

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 64)
    root = convert.cache_dir() / "models"
    key = convert._cache_key(gguf)
    (root / f"{key}-bf16").mkdir(parents=True)
    (root / f"{key}-bf16" / convert._MARKER).write_text("{}")
    assert convert._converted(gguf, torch.bfloat16) == root / f"{key}-bf16"
    assert convert.converted_copies(gguf) == ["bf16"]
    (root / key).mkdir()
    (root / key / convert._MARKER).write_text("{}")
    # the float32 copy serves bf16 too
    assert convert._converted(gguf, torch.bfloat16) == root / key
    assert convert._converted(gguf, torch.float32) == root / key
    assert convert.converted_copies(gguf) == ["float32", "bf16"]


# --------------------------------------------------------------------------- the real models
def _installed(name: str) -> bool:
    return models.embedded_available(name)


@pytest.mark.slow
@pytest.mark.skipif(
    not _installed("qwen2.5-coder-0.5b"),
    reason="needs `specdec models install qwen2.5-coder-0.5b` (0.5 GB)",
)
def test_qwen_0_5b_decodes_losslessly(monkeypatch):
    monkeypatch.delenv(models.CACHE_ENV)  # the user's cache, where the converted copy is
    from selfspec import Decoder
    from selfspec._engine.contract.reference import compare, reference_generate

    loaded = models.load("qwen2.5-coder-0.5b")
    assert loaded.chat and len(loaded.model.model.layers) == 24
    assert (
        loaded.model.get_output_embeddings().weight.data_ptr()
        != loaded.model.get_input_embeddings().weight.data_ptr()
    )
    ids = models.format_prompt(loaded, "Write a Python function that reverses a string.")
    ref = reference_generate(loaded.model, ids, 24, eos_token_ids=loaded.eos_token_ids)
    got = Decoder(loaded.model, "lookup").generate(
        ids, max_new_tokens=24, eos_token_ids=loaded.eos_token_ids
    )
    cmp = compare(loaded.model, ids, got.output_ids, ref)
    assert cmp.equal or cmp.near_tie
