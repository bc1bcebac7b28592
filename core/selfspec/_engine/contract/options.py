"""Plugin options: declared by plugins through ``selfspec_options``, validated by the host."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any


class Layers:
    """The ``layers`` option type: a set of decoder-layer indices, written ``"3,5,10-12"``.

    ``Option("skip_attn", Layers, None, ...)`` parses the user's text into a sorted tuple of
    distinct non-negative ints (``""`` and ``"none"`` are the empty set); a Python sequence
    of ints is taken as it is. A layer listed twice or a malformed part is an
    :class:`OptionError`. The model's depth is not known when options are parsed: check the
    range at setup with :func:`check_layers`. :meth:`parse` parses the same syntax elsewhere (a
    command's ``--layers``); :func:`format_layers` writes the text back.
    """

    @classmethod
    def parse(cls, value: Any, name: str = "layers") -> tuple[int, ...]:
        """``"3,5,10-12"`` -> ``(3, 5, 10, 11, 12)``; ``""``/``"none"`` -> ``()``; a sequence of
        ints -> sorted. A layer listed twice or a malformed part is an :class:`OptionError`."""
        if isinstance(value, str):
            s = value.strip().lower()
            if s in ("", "none", "-"):
                return ()
            out: list[int] = []
            for part in s.replace(" ", "").split(","):
                if not part:
                    continue
                try:
                    if "-" in part:
                        lo, hi = (int(x) for x in part.split("-", 1))
                        out.extend(range(lo, hi + 1))
                    else:
                        out.append(int(part))
                except ValueError:
                    raise OptionError(
                        f"option {name!r}: {part!r} is not a layer index or range (e.g. 3,5,10-12)"
                    ) from None
        elif isinstance(value, (list, tuple)) and all(
            isinstance(i, int) and not isinstance(i, bool) for i in value
        ):
            out = [int(i) for i in value]
        else:
            raise OptionError(f"option {name!r}: expected layers like '3,5,10-12', got {value!r}")
        if any(i < 0 for i in out):
            raise OptionError(f"option {name!r}: layer indices must be >= 0")
        if len(set(out)) != len(out):
            twice = sorted({i for i in out if out.count(i) > 1})
            raise OptionError(f"option {name!r}: layer {twice[0]} is listed twice")
        return tuple(sorted(out))


def check_layers(
    layers: tuple[int, ...] | None, n_layers: int, name: str = "layers"
) -> tuple[int, ...] | None:
    """``layers`` unchanged when every index lies in ``[0, n_layers)``, else :class:`OptionError`
    naming the option (call it at setup, when the model's depth is known). None passes."""
    if layers is None:
        return None
    bad = [i for i in layers if not 0 <= i < n_layers]
    if bad:
        raise OptionError(
            f"option {name!r}: layer {bad[0]} is outside [0, {n_layers}) for this "
            f"{n_layers}-layer model"
        )
    return tuple(layers)


def format_layers(layers: Iterable[int]) -> str:
    """Inverse of :meth:`Layers.parse`, with ranges: ``(3, 10, 11, 12)`` -> ``"3,10-12"``;
    the empty set is ``"none"``."""
    xs = sorted(set(layers))
    parts: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(parts) if parts else "none"


_TYPES: dict[type, str] = {int: "int", float: "float", str: "str", bool: "bool", Layers: "layers"}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class OptionError(ValueError):
    """A user-supplied option is unknown or malformed; the CLI prints it as one line."""


@dataclass(frozen=True)
class Option:
    """One option a plugin accepts, declared in ``selfspec_options``: the host parses ``-o
    name=value``, validates it and fills in defaults.

    ``type`` is ``int``, ``float``, ``str``, ``bool`` or :class:`Layers` (a layer set, parsed
    into a sorted tuple). A ``float`` option takes ``"0.25"`` on the command line and an ``int``
    from Python (``1`` becomes ``1.0``). ``choices`` restricts the values; ``min``/``max``
    bound ``int`` and ``float`` values; ``check`` is an extra validator returning an error
    message or None. ``default`` may be None, meaning "the plugin decides" (in
    ``selfspec_setup``, e.g. from the model's depth): the plugin then receives ``None`` when the
    user gave nothing, and an explicit Python ``None`` (``options={"k": None}``, in ``Decoder``
    or the kit's ``assert_lossless``) means the same, while an option with a real default
    refuses ``None`` with an :class:`OptionError` saying so. ``choices``, ``min``, ``max`` and
    ``check`` never see ``None``. See [option types and None](docs/faq.md#option-types-and-none).
    """

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None
    min: float | None = None
    max: float | None = None
    check: Callable[[Any], str | None] | None = None

    def __post_init__(self) -> None:
        if self.type not in _TYPES:
            raise TypeError(
                f"option {self.name!r}: type must be one of int, float, str, bool, Layers"
            )
        if not all(part.isidentifier() for part in self.name.split(".", 1)):
            raise ValueError(
                f"option name {self.name!r} is not an identifier "
                "(or MEMBER.identifier in a composition)"
            )
        if self.default is not None:
            self.convert(self.default)

    def convert(self, value: Any) -> Any:
        """Parse/validate ``value`` (a string from the CLI, or a Python value)."""
        if value is None:
            if self.default is None:
                return None  # "the plugin decides", as when the option is not given
            raise OptionError(
                f"option {self.name!r}: None means 'the plugin decides', which only an option "
                f"whose default is None accepts; give a {_TYPES[self.type]} "
                f"(the default is {self.default!r})"
            )
        v = self._parse(value)
        if self.choices is not None and v not in self.choices:
            raise OptionError(f"option {self.name!r}: {v!r} is not one of {list(self.choices)}")
        numeric = self.type is not Layers
        if numeric and self.min is not None and v < self.min:
            raise OptionError(f"option {self.name!r}: {v!r} is below the minimum {self.min}")
        if numeric and self.max is not None and v > self.max:
            raise OptionError(f"option {self.name!r}: {v!r} is above the maximum {self.max}")
        if self.check is not None and (msg := self.check(v)):
            raise OptionError(f"option {self.name!r}: {msg}")
        return v

    def _parse(self, value: Any) -> Any:
        t = self.type
        if t is Layers:
            return Layers.parse(value, self.name)
        if isinstance(value, str) and t is not str:
            s = value.strip().lower()
            if t is bool:
                if s in _TRUE:
                    return True
                if s in _FALSE:
                    return False
                raise OptionError(f"option {self.name!r}: {value!r} is not a boolean (true/false)")
            try:
                return t(value)
            except ValueError:
                raise OptionError(
                    f"option {self.name!r}: {value!r} is not a valid {_TYPES[t]}"
                ) from None
        if t is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not isinstance(value, t) or (t is int and isinstance(value, bool)):
            raise OptionError(f"option {self.name!r}: expected {_TYPES[t]}, got {value!r}")
        return value

    def describe(self) -> dict[str, Any]:
        """The option as JSON: ``name``, ``type``, ``default``, ``help`` and ``choices``."""
        return {
            "name": self.name,
            "type": _TYPES[self.type],
            "default": (
                format_layers(Layers.parse(self.default, self.name))
                if self.type is Layers and self.default is not None
                else self.default
            ),
            "help": self.help,
            "choices": list(self.choices) if self.choices is not None else None,
        }


def parse_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """``["k=v", ...]`` -> ``{"k": "v"}`` (the ``-o`` flags of the CLI)."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise OptionError(f"option {pair!r} is not of the form key=value")
        out[key.strip()] = value
    return out


def resolve(
    declared: Mapping[str, Option], given: Mapping[str, Any], plugin: str
) -> dict[str, Any]:
    """Validate ``given`` against ``declared`` and fill in defaults."""
    unknown = sorted(set(given) - set(declared))
    if unknown:
        known = ", ".join(sorted(declared)) or "none"
        raise OptionError(
            f"plugin {plugin!r} has no option {', '.join(map(repr, unknown))} "
            f"(its options: {known})"
        )
    values = {
        name: opt.convert(opt.default)
        if opt.type is Layers and opt.default is not None
        else opt.default
        for name, opt in declared.items()
    }
    for name, raw in given.items():
        values[name] = declared[name].convert(raw)
    return values
