"""The converted-model cache: a GGUF file dequantized once into a safetensors copy, keyed by
the file's name, size and a hash of its bytes."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from selfspec.app._models.common import ModelLoadError, _check_runner, _say, cache_dir

_MARKER = "selfspec-converted.json"


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


#: Dtypes that get their own converted copy when no float32 copy exists yet: a 1.5B model run
#: in bfloat16 then needs a 3 GB file, not a 7 GB one. Every other dtype reads the float32 copy.
_LOW_PRECISION = {torch.bfloat16: "bf16"}


def _converted(gguf: Path, dtype: torch.dtype = torch.float32) -> Path:
    """A converted copy of ``gguf`` to load in ``dtype``, made on first use (atomically).

    The float32 copy serves every dtype (``from_pretrained`` casts while loading). A bfloat16
    load uses the float32 copy when there is one, else a bfloat16 copy made for it: the same
    values, since both are the GGUF's dequantized float32 weights rounded to bfloat16 once.
    """
    root = cache_dir() / "models"
    key = _cache_key(gguf)
    target = root / key
    if (target / _MARKER).is_file():
        return target
    suffix = _LOW_PRECISION.get(dtype)
    if suffix is not None:
        target = root / f"{key}-{suffix}"
        if (target / _MARKER).is_file():
            return target
    save_dtype = dtype if suffix is not None else torch.float32
    root.mkdir(parents=True, exist_ok=True)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _say(
        f"first use of {gguf.name}: dequantizing the GGUF to "
        f"{str(save_dtype).removeprefix('torch.')} "
        f"(this takes a while, once); the converted copy goes to {target}"
    )
    t0 = time.perf_counter()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=save_dtype
        )
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except Exception as exc:
        raise ModelLoadError(
            f"transformers could not read the GGUF file {str(gguf)!r}: {exc}"
        ) from exc
    _check_runner(model, str(gguf))
    # The weights are plain floats now: drop the GGUF quantizer so they are saved as they are.
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


def converted_copies(gguf: Path) -> list[str]:
    """Which converted copies of ``gguf`` the cache holds: ``"float32"`` and/or ``"bf16"``."""
    root = cache_dir() / "models"
    key = _cache_key(gguf)
    found = ["float32"] if (root / key / _MARKER).is_file() else []
    found += [
        suffix
        for suffix in _LOW_PRECISION.values()
        if (root / f"{key}-{suffix}" / _MARKER).is_file()
    ]
    return found
