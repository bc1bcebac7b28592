"""Plugin options: declared by plugins through ``selfspec_options``, validated by the host."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

_TYPES: dict[type, str] = {int: "int", float: "float", str: "str", bool: "bool"}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class OptionError(ValueError):
    """A user-supplied option is unknown or malformed."""


@dataclass(frozen=True)
class Option:
    """One option a plugin accepts.

    ``type`` is ``int``, ``float``, ``str`` or ``bool``; ``choices`` restricts the values;
    ``min``/``max`` bound numbers; ``check`` is an extra validator returning an error message
    or None. ``default`` may be None (meaning "let the plugin decide").
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
            raise TypeError(f"option {self.name!r}: type must be one of int, float, str, bool")
        if not self.name.isidentifier():
            raise ValueError(f"option name {self.name!r} is not an identifier")
        if self.default is not None:
            self.convert(self.default)

    def convert(self, value: Any) -> Any:
        """Parse/validate ``value`` (a string from the CLI, or a Python value)."""
        v = self._parse(value)
        if self.choices is not None and v not in self.choices:
            raise OptionError(f"option {self.name!r}: {v!r} is not one of {list(self.choices)}")
        if self.min is not None and v < self.min:
            raise OptionError(f"option {self.name!r}: {v!r} is below the minimum {self.min}")
        if self.max is not None and v > self.max:
            raise OptionError(f"option {self.name!r}: {v!r} is above the maximum {self.max}")
        if self.check is not None and (msg := self.check(v)):
            raise OptionError(f"option {self.name!r}: {msg}")
        return v

    def _parse(self, value: Any) -> Any:
        t = self.type
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
                raise OptionError(f"option {self.name!r}: {value!r} is not a valid {_TYPES[t]}") from None
        if t is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not isinstance(value, t) or (t is int and isinstance(value, bool)):
            raise OptionError(f"option {self.name!r}: expected {_TYPES[t]}, got {value!r}")
        return value

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": _TYPES[self.type],
            "default": self.default,
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


def resolve(declared: Mapping[str, Option], given: Mapping[str, Any], plugin: str) -> dict[str, Any]:
    """Validate ``given`` against ``declared`` and fill in defaults."""
    unknown = sorted(set(given) - set(declared))
    if unknown:
        known = ", ".join(sorted(declared)) or "none"
        raise OptionError(f"plugin {plugin!r} has no option {', '.join(map(repr, unknown))} (its options: {known})")
    values = {name: opt.default for name, opt in declared.items()}
    for name, raw in given.items():
        values[name] = declared[name].convert(raw)
    return values
