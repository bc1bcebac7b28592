"""What the user asks for a model bigger than memory: accelerate's ``device_map``,
``max_memory`` and ``offload_folder``, parsed and checked before any weight is loaded.

``device_map``: ``auto``, ``balanced``, ``balanced_low_0`` or ``sequential`` (accelerate's
strategies, filling the devices in ``max_memory`` in order and spilling to disk), or a JSON
object ``{"module name": device}`` with devices ``cpu``, ``disk``, ``cuda:N`` or a GPU index.
``max_memory``: ``cpu=6GiB,disk=40GiB,0=20GiB`` (a device, ``=``, a size with an optional unit
B, KB, MB, GB, KiB, MiB, GiB, TiB; GPUs by index or ``cuda:N``). A ``max_memory`` or an
``offload_folder`` without a ``device_map`` means ``auto``. Every bad value is a
:class:`~selfspec.app._models.common.ModelLoadError` of one line.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selfspec.app._models.common import ModelLoadError

STRATEGIES: tuple[str, ...] = ("auto", "balanced", "balanced_low_0", "sequential")
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class PlacementRequest:
    """A checked placement request: what goes to ``from_pretrained``.

    ``device_map``: a strategy name or ``{module: device}`` (``None``: no placement asked).
    ``max_memory``: ``{device: bytes}`` (GPU devices as ints, as accelerate wants them).
    ``offload_folder``: where accelerate writes weights it offloads to disk (created if missing).
    """

    device_map: str | dict[str, Any] | None = None
    max_memory: dict[Any, int] = field(default_factory=dict)
    offload_folder: str | None = None

    @property
    def asked(self) -> bool:
        return self.device_map is not None

    def kwargs(self) -> dict[str, Any]:
        """The ``from_pretrained`` keyword arguments."""
        if self.device_map is None:
            return {}
        out: dict[str, Any] = {"device_map": self.device_map}
        if self.max_memory:
            out["max_memory"] = dict(self.max_memory)
        if self.offload_folder is not None:
            out["offload_folder"] = self.offload_folder
        return out

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, as ``--json`` and bench summaries record the request."""
        return {
            "device_map": self.device_map,
            "max_memory": {str(k): v for k, v in self.max_memory.items()},
            "offload_folder": self.offload_folder,
        }


def parse_device_map(spec: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """A strategy name, or a JSON object of ``{module: device}``, checked."""
    if spec is None or isinstance(spec, dict):
        return None if spec is None else _check_map(spec)
    text = str(spec).strip()
    if text in STRATEGIES:
        return text
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ModelLoadError(
                f"--device-map is not valid JSON ({exc.msg} at character {exc.pos})"
            ) from None
        if not isinstance(value, dict):
            raise ModelLoadError("--device-map JSON must be an object of {module name: device}")
        return _check_map(value)
    raise ModelLoadError(
        f"unknown device map {text!r}: use one of {', '.join(STRATEGIES)} or a JSON object "
        '{"module name": "cpu" | "disk" | "cuda:N" | N}'
    )


def _check_map(value: dict[str, Any]) -> dict[str, Any]:
    if not value:
        raise ModelLoadError("--device-map JSON object is empty; name at least one module")
    out: dict[str, Any] = {}
    for name, dev in value.items():
        if not isinstance(name, str):
            raise ModelLoadError(f"--device-map: module names are strings, got {name!r}")
        out[name] = _device(dev, f"--device-map entry {name!r}")
    return out


def _device(dev: Any, where: str) -> str | int:
    if isinstance(dev, bool):
        raise ModelLoadError(f"{where}: {dev!r} is not a device (cpu, disk, cuda:N or a GPU index)")
    if isinstance(dev, int):
        if dev < 0:
            raise ModelLoadError(f"{where}: GPU index {dev} is negative")
        return dev
    text = str(dev).strip().lower()
    if text in ("cpu", "disk", "mps"):
        return text
    m = re.fullmatch(r"(?:cuda:)?(\d+)", text)
    if m:
        return int(m.group(1))
    raise ModelLoadError(f"{where}: unknown device {dev!r} (use cpu, disk, cuda:N or a GPU index)")


def parse_size(text: str, where: str = "--max-memory") -> int:
    """``"6GiB"`` -> 6442450944 bytes; a bare number is bytes."""
    m = _SIZE.match(str(text))
    if not m:
        raise ModelLoadError(f"{where}: {text!r} is not a size (e.g. 6GiB, 500MB, 1073741824)")
    value = float(m.group(1)) * _UNITS[(m.group(2) or "").lower()]
    if value <= 0:
        raise ModelLoadError(f"{where}: a size must be positive, got {text!r}")
    return int(value)


def parse_max_memory(spec: str | dict[Any, Any] | None) -> dict[Any, int]:
    """``"cpu=6GiB,disk=40GiB,0=20GiB"`` (or such a dict) ->
    ``{"cpu": bytes, "disk": bytes, 0: bytes}``."""
    if spec is None:
        return {}
    items: list[tuple[Any, Any]]
    if isinstance(spec, dict):
        items = list(spec.items())
    else:
        items = []
        for part in str(spec).split(","):
            if not part.strip():
                continue
            if "=" not in part:
                raise ModelLoadError(
                    f"--max-memory: {part.strip()!r} is not DEVICE=SIZE (e.g. cpu=6GiB,disk=40GiB)"
                )
            key, _, size = part.partition("=")
            items.append((key.strip(), size.strip()))
    if not items:
        raise ModelLoadError("--max-memory is empty; give DEVICE=SIZE pairs, e.g. cpu=6GiB")
    out: dict[Any, int] = {}
    for key, size in items:
        dev = _device(key, "--max-memory")
        if dev in out:
            raise ModelLoadError(f"--max-memory names {key!r} twice")
        out[dev] = (
            size if isinstance(size, int) and not isinstance(size, bool) else parse_size(size)
        )
    return out


def placement_request(
    device_map: str | dict[str, Any] | None = None,
    max_memory: str | dict[Any, Any] | None = None,
    offload_folder: str | Path | None = None,
) -> PlacementRequest:
    """Check the three together. A ``max_memory`` or ``offload_folder`` alone means
    ``device_map="auto"``; the offload folder is created (an existing file there is an error)."""
    dm = parse_device_map(device_map)
    mm = parse_max_memory(max_memory)
    folder = None
    if offload_folder is not None:
        path = Path(offload_folder).expanduser()
        if path.exists() and not path.is_dir():
            raise ModelLoadError(f"--offload-folder {str(path)!r} is a file, not a directory")
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ModelLoadError(
                f"--offload-folder {str(path)!r} cannot be created: {exc.strerror}"
            ) from None
        folder = str(path)
    if dm is None and (mm or folder is not None):
        dm = "auto"
    return PlacementRequest(dm, mm, folder)


def placement_line(loaded: Any) -> str:
    """``placement: layers 0-13 cpu, 14-27 disk; ... (max_memory cpu=3.0GiB)`` for stderr."""
    from selfspec._engine.runner.placement import summary  # noqa: PLC0415 (torch: on use only)

    line = (
        summary(loaded.model)
        or "placement: the whole model in memory on one device (nothing offloaded)"
    )
    request = loaded.request
    if request is not None and request.max_memory:
        budget = ",".join(f"{k}={v / 2**30:.2f}GiB" for k, v in request.max_memory.items())
        line += f" (max_memory {budget})"
    return line


def placement_record(loaded: Any) -> dict[str, Any] | None:
    """The placement as ``--json`` and bench summaries record it: what was asked and where the
    layers went; ``None`` when no placement was asked for."""
    request = loaded.request
    if request is None or not request.asked:
        return None
    return {**request.as_dict(), "placed": loaded.placement}
