"""Render ``docs/hooks.md`` from the hookspec docstrings (one copy of the contract).

``python -m selfspec._engine.contract.hooksdoc > docs/hooks.md`` writes it;
``--check docs/hooks.md`` exits 1 when the file is stale (the test suite runs the same check).
"""

from __future__ import annotations

import inspect
import sys
import textwrap

from selfspec._engine.contract import hookspecs

HEADER = """# Hooks reference

Generated from `core/selfspec/_engine/contract/hookspecs.py` by
`python -m selfspec._engine.contract.hooksdoc > docs/hooks.md`; do not edit by hand. Implement a
hook as a method (or module-level function) with the same name, decorated with
`@selfspec.hookimpl`; it may accept any subset of the arguments.

"""


def hooks() -> list[tuple[str, object]]:
    """Every hookspec, in source order."""
    found = [
        (n, f) for n, f in vars(hookspecs).items() if n.startswith("selfspec_") and callable(f)
    ]
    return sorted(found, key=lambda nf: inspect.getsourcelines(nf[1])[1])  # type: ignore[arg-type]


def signature(func: object) -> str:
    """``name(arg: type, ...) -> ret`` exactly as written in hookspecs.py."""
    src = inspect.getsource(func)  # type: ignore[arg-type]
    head = src[src.index("def ") + 4 : src.index(":\n", src.index(")"))]
    return " ".join(head.split())


#: The sections of every hook's docstring, in order (``Notes`` may be left out).
SECTIONS = ("Called", "Args", "Returns", "Host enforces", "Notes")
REQUIRED = SECTIONS[:-1]


def sections(doc: str) -> tuple[str, dict[str, str]]:
    """``(summary, {section: text})`` of a sectioned docstring (Google style: ``Name:`` on its
    own line, the section's text indented below it). Raises ``ValueError`` on a section out of
    order, unknown, or repeated."""
    summary, _, rest = doc.strip().partition("\n\n")
    found: dict[str, list[str]] = {}
    current = None
    for line in rest.splitlines():
        head = line.rstrip()
        if head.endswith(":") and not line.startswith(" ") and head[:-1] in SECTIONS:
            name = head[:-1]
            if name in found:
                raise ValueError(f"section {name!r} repeated")
            if found and SECTIONS.index(name) < SECTIONS.index(list(found)[-1]):
                raise ValueError(f"section {name!r} out of order")
            found[name] = []
            current = name
        elif current is None:
            if line.strip():
                raise ValueError(f"text before the first section: {line.strip()[:40]!r}")
        else:
            found[current].append(line)
    return summary.strip(), {k: textwrap.dedent("\n".join(v)).strip() for k, v in found.items()}


def _markdown(name: str, body: str) -> str:
    if name == "Args":  # one bullet per argument: "name: text" with continuation lines
        items: list[str] = []
        for line in body.splitlines():
            if line and not line.startswith(" ") and ":" in line:
                arg, _, text = line.partition(":")
                items.append(f"- `{arg.strip()}`: {text.strip()}")
            elif items:
                items[-1] += " " + line.strip()
        return "\n".join(items)
    return " ".join(body.split())


def render() -> str:
    module_doc = inspect.getdoc(hookspecs) or ""
    parts = [HEADER, module_doc, "\n"]
    for name, func in hooks():
        opts = getattr(func, "selfspec_spec", {}) or {}
        kind = "firstresult" if opts.get("firstresult") else "called for every plugin"
        parts.append(f"\n## `{name}`\n\n```python\n{signature(func)}\n```\n\n*{kind}*\n\n")
        summary, found = sections(inspect.getdoc(func) or "")
        parts.append(summary + "\n")
        for section, body in found.items():
            parts.append(f"\n**{section}.**\n\n" if section == "Args" else f"\n**{section}.** ")
            parts.append(_markdown(section, body) + "\n")
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render()
    if argv[:1] == ["--check"]:
        path = argv[1] if len(argv) > 1 else "docs/hooks.md"
        with open(path, encoding="utf-8") as fh:
            if fh.read() != text:
                print(
                    f"{path} is stale: run `python -m selfspec._engine.contract.hooksdoc > {path}`",
                    file=sys.stderr,
                )
                return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
