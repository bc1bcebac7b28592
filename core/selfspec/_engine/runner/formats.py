"""The weight-format registry: every way the host can hold the weights of a linear layer.

A :class:`WeightFormat` is one of two roles:

* a **layout** (``--weight-layout``): how verification runs the model's own linear layers. It
  computes the same product in the model's dtype (only the summation order may differ), so
  the output stays greedy decoding's;
* a **draft** copy (``-o draft_weights=``): a compressed copy of the layers and head that only
  draft passes read, in any precision (a poor copy costs speed, never correctness).

Formats are registered through the ``selfspec_weight_formats`` hook: the host's own
(:mod:`selfspec._engine.runner.host_formats`) and those of every installed package that names a
module in the ``selfspec.weight_formats`` entry-point group, so a third-party package adds a
format as it adds a plugin. The CLI's choices, ``auto``'s candidates (every format with
``auto=True`` that runs here), ``specdec plugins`` and the docs all read this registry.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib import metadata
from typing import Any

import torch

from selfspec._engine.runner import host_formats
from selfspec._engine.runner.layout import choose_layout
from selfspec._engine.runner.weightformat import WeightFormat
from selfspec._engine.tuning.machine import cpu_capability

#: The entry-point group whose modules implement ``selfspec_weight_formats``.
ENTRY_POINT_GROUP = "selfspec.weight_formats"
ROLES = ("layout", "draft")
#: The owner of the host's own formats.
HOST = "selfspec"
_NAME = re.compile(r"[a-z0-9][a-z0-9.+-]*\Z")


class WeightFormatError(ValueError):
    """An unknown weight format (the message lists the registered ones), one that cannot run
    here, or a malformed registration. :class:`selfspec.DraftWeightsError` and the runner's
    ``WeightLayoutError`` are its subclasses."""


class FormatPackageError(WeightFormatError):
    """A package in the ``selfspec.weight_formats`` entry-point group that cannot be imported
    or registers a malformed format; the message names the package (``.package``)."""

    def __init__(self, package: str, message: str) -> None:
        super().__init__(f"package {package!r}: {message}")
        self.package = package


def weight_formats(role: str | None = None) -> dict[str, WeightFormat]:
    """``{name: format}`` of every registered format (of ``role`` when given), in registration
    order: the host's first, then each package's. Loaded once per process
    ([weight-formats.md](docs/weight-formats.md))."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _load()
    return {n: f for n, f in _REGISTRY.items() if role is None or f.role == role}


def weight_format(name: str, role: str) -> WeightFormat:
    """The format ``name`` of ``role``; :class:`WeightFormatError` listing the choices if there
    is none."""
    found = weight_formats(role)
    if name not in found:
        what = "weight layout" if role == "layout" else "draft weights"
        raise WeightFormatError(f"unknown {what} {name!r}; choose one of auto, {', '.join(found)}")
    return found[name]


def format_names(role: str) -> tuple[str, ...]:
    """``("auto", *names)``: the values an option choosing a format of ``role`` accepts."""
    return ("auto", *weight_formats(role))


def candidates(
    role: str, device: torch.device | str, dtype: torch.dtype, *, every: bool = False
) -> list[str]:
    """The formats of ``role`` that ``auto`` measures for a model on ``device`` in ``dtype``:
    every one with ``auto=True`` that runs there, in registration order (``every=True``: every
    one that runs there, ``auto`` or not)."""
    return [
        n
        for n, f in weight_formats(role).items()
        if (every or f.auto) and f.why_not(device, dtype) is None
    ]


def fitting(candidates: list[str], weight_bytes: int, available: int | None) -> list[str]:
    """The layouts among ``candidates`` whose copy of ``weight_bytes`` of weights (their
    registered ``memory`` factor) fits in three quarters of the ``available`` bytes (all of them
    when that is unknown); the first (the static choice) always."""
    if available is None:
        return list(candidates)
    found = weight_formats("layout")
    return [
        c
        for i, c in enumerate(candidates)
        if i == 0 or found[c].memory * weight_bytes <= 0.75 * available
    ]


def reload_weight_formats() -> None:
    """Forget the loaded registry (the next call loads the entry points again): for tests and
    for a process that installed a package."""
    global _REGISTRY
    _REGISTRY = None


def check_layout(layout: str, device: torch.device, dtype: torch.dtype) -> str:
    """The weight layout that runs for ``layout`` on ``device`` in ``dtype`` before anything is
    measured (:func:`selfspec._engine.runner.layout.choose_layout` with this process's CPU
    capability and the registered layouts); :class:`WeightLayoutError` for an unknown name,
    listing the registered ones, or for one that cannot run here, saying why."""
    why = (
        None
        if layout == "auto" or layout not in weight_formats("layout")
        else (weight_formats("layout")[layout].why_not(device, dtype))
    )
    cpu = cpu_capability() if torch.device(device).type == "cpu" else None
    return choose_layout(
        layout, torch.device(device).type, dtype, cpu, why, known=tuple(weight_formats("layout"))
    )


# ------------------------------------------------------------------------------ helpers
_REGISTRY: dict[str, WeightFormat] | None = None


def _load() -> dict[str, WeightFormat]:
    """Call every ``selfspec_weight_formats`` implementation: the host's own first, then each
    package's in the entry-point group."""
    sources: list[tuple[str, Any]] = [(HOST, host_formats)]
    eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    for ep in sorted(eps, key=lambda e: (_owner(e), e.name)):
        try:
            sources.append((_owner(ep), ep.load()))
        except Exception as exc:
            raise FormatPackageError(
                _owner(ep),
                f"weight formats entry point {ep.value!r} cannot be imported: "
                f"{type(exc).__name__}: {exc}",
            ) from exc
    found: dict[str, WeightFormat] = {}
    for owner, obj in sources:
        impl = getattr(obj, "selfspec_weight_formats", None)
        if not callable(impl):
            raise FormatPackageError(
                owner, f"{obj!r} in {ENTRY_POINT_GROUP!r} has no selfspec_weight_formats"
            )

        def register(fmt: WeightFormat, _owner: str = owner) -> None:
            _check(fmt, _owner, found)
            found[fmt.name] = WeightFormat(**{**fmt.__dict__, "owner": _owner})

        try:
            impl(register=register)
        except WeightFormatError as exc:
            raise FormatPackageError(owner, str(exc)) from exc
    return found


def _check(fmt: Any, owner: str, found: dict[str, WeightFormat]) -> None:
    if not isinstance(fmt, WeightFormat):
        raise WeightFormatError(f"registered {fmt!r}, not a selfspec.WeightFormat")
    if not _NAME.match(fmt.name) or fmt.name == "auto":
        raise WeightFormatError(
            f"weight format name {fmt.name!r} must be lower case letters, digits, "
            "'.', '+' or '-', and not 'auto'"
        )
    if fmt.role not in ROLES:
        raise WeightFormatError(
            f"weight format {fmt.name!r}: role must be one of {ROLES}, not {fmt.role!r}"
        )
    if fmt.build is not None and not callable(fmt.build):
        raise WeightFormatError(f"weight format {fmt.name!r}: build must be callable")
    if fmt.name in found:
        raise WeightFormatError(
            f"weight format {fmt.name!r} is registered twice (first by {found[fmt.name].owner})"
        )


class FormatChoices(Sequence):
    """``("auto", *names)`` of the formats of one role, read from the registry when used (an
    :class:`selfspec.Option`'s ``choices`` that follows what is installed)."""

    def __init__(self, role: str) -> None:
        self.role = role

    def __getitem__(self, i):  # type: ignore[override]
        return format_names(self.role)[i]

    def __len__(self) -> int:
        return len(format_names(self.role))

    def __repr__(self) -> str:
        return repr(format_names(self.role))


def _owner(ep: metadata.EntryPoint) -> str:
    """The distribution that declares ``ep`` (its entry point's name where unknown)."""
    return ep.dist.name if ep.dist is not None else ep.name
