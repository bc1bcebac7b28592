#!/usr/bin/env python3
"""Render the API reference (``docs/api.md`` and one page per namespace under ``docs/api/``)
from the public namespaces' docstrings: one copy of the reference, in the code.

``python scripts/api_docs.py`` writes the pages; ``--check`` exits 1 with one line when a
committed page differs from what it would write (``tests/test_docs.py`` runs the same check).

Each namespace's names, their order and their groups come from its lazy loader's ``_API``
mapping (a ``# comment`` line in it starts a group), plus the names of ``__all__`` the mapping
lacks. A ``#:`` comment above an entry is the namespace's own word on the name: a constant's
whole documentation, else a paragraph after the object's docstring (for a name whose module
has no room left under the host's 400-line rule). For each name the page gives its kind, its
signature (a class's constructor), its docstring, and for a class the attributes documented by
``#:`` comments and its own public methods and properties with their docstrings. Nothing
depends on where a name is defined: no module path is printed.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
COMMAND = "python scripts/api_docs.py"

#: (namespace, page under docs/api/, what it is for, stability), in the index's order
NAMESPACES = (
    (
        "selfspec",
        "selfspec.md",
        "**the plugin contract**: the hook marker, options, the decoder "
        "and the values that cross the hook boundary, the runner and its accessors, drafting and "
        "verification mechanics, per-model artefacts",
        "stable",
    ),
    (
        "selfspec.provisional",
        "provisional.md",
        "tuning and calibration helpers: tree sizing and "
        "the cost curve, lower-level verification and sampling helpers, the cache directory, the "
        "draft-vocabulary corpus",
        "provisional",
    ),
    (
        "selfspec.testing",
        "testing.md",
        "the kit: tiny models, strategies, `assert_lossless`, "
        "`PluginSuite`, `ComposedSuite` ([testing-plugins.md](testing-plugins.md)); for tests "
        "only",
        "stable",
    ),
    (
        "selfspec.app",
        "app.md",
        "model loading, prompt encoding, the benchmark data splits and the "
        "`CommandContext` a plugin command receives: for scripts and plugin commands "
        "(`selfspec_commands`), never needed by a decode hook",
        "stable",
    ),
)
#: each page's title, after the namespace's name
TITLES = {
    "selfspec": "the plugin contract",
    "selfspec.provisional": "provisional helpers",
    "selfspec.testing": "the kit",
    "selfspec.app": "the application",
}
#: the title of the group of names ``__all__`` has beyond the lazy mapping
EXTRA_GROUP = {
    "selfspec": "The hook marker and the version",
    "selfspec.testing": "Architectures and strategies",
}
#: the sections of a sectioned (Google-style) docstring, as the hooks' contracts use them
SECTIONS = ("Called", "Args", "Returns", "Host enforces", "Notes")
GENERATED = f"Generated from the docstrings by `{COMMAND}`; do not edit by hand."

INDEX_INTRO = """\
The host has four public namespaces; everything else is private by name
(`selfspec._engine.*`, `selfspec.app._*`) and may be reorganised in any release. Each page
below is generated from the namespace's docstrings and lists its names in the namespace's
own order and groups.

| namespace | reference | for | stability |
| --- | --- | --- | --- |
{rows}

The engine (behind `selfspec`, `selfspec.provisional` and the kit) and the app are two layers
([architecture.md](architecture.md)): the app imports the engine, never the reverse
(`tests/test_import_cycles.py`).

Plugins import the host only from the public namespaces:

```python
import selfspec
from selfspec import Draft, Option, verify_greedy
from selfspec.provisional import cost_curve              # a provisional helper
from selfspec.app import CommandContext, load_task       # in a plugin command
from selfspec.testing import PluginSuite, assert_lossless  # in a plugin's tests
```

never from a private module (`selfspec._engine.contract.loop`, `selfspec.app._cli`, ...). No plugin
reads `runner.adapter` or a model's `.base` module: the runner's accessors give the final
norm, the head and the embedding. `tests/test_api.py` parses every file under `plugins/` (the
template included) and fails on any other import of the host or such a read, and runs every
import these pages show.

`import selfspec`, `import selfspec.provisional` and `import selfspec.app` are cheap: every
name but `hookimpl` and `__version__` is imported on first use.

## Guides

- [Questions authors ask](faq.md): answers, with code the tests run, to what plugin authors
  asked while writing a plugin from these pages.
- [Composed drafts](composition.md): several drafting plugins in one decode.
- [Tree drafts](tree-drafts.md): building, verifying and keeping a tree draft.
- [Weight formats](weight-formats.md): the layouts and draft copies of the linear weights,
  and how a package registers its own.
- [hooks.md](hooks.md): the hooks (also generated); [architecture.md](architecture.md): how
  the pieces fit.

## Compatibility

- **Stable** (`selfspec`, `selfspec.testing`, `selfspec.app`): a name is only added within a
  major version. Removing or changing one takes a release in which it still works and raises a
  `DeprecationWarning` naming its replacement; hooks grow only by new arguments at the end
  (an implementation may take any subset), never a rename.
- **Provisional** (`selfspec.provisional`): a name may change shape or go in a minor release,
  named in `CHANGELOG.md`. A name graduates to `selfspec` once plugins rely on it.
- **Private** (anything with a leading underscore in its path): no promise at all.
- Nothing has been released yet, so 0.1.0 carries no deprecated names: this policy starts with
  the first release.
"""


# --------------------------------------------------------------------------- names and groups
def groups(namespace: str) -> list[tuple[str, list[str]]]:
    """``[(title, names)]`` of ``namespace`` in declared order: first the names of ``__all__``
    that its lazy mapping ``_API`` lacks, then ``_API``'s groups (a ``# comment`` line starts
    one)."""
    module = importlib.import_module(namespace)
    api = list(getattr(module, "_API", {}))
    out: list[tuple[str, list[str]]] = []
    extra = [n for n in module.__all__ if n not in api]
    if extra:
        out.append((EXTRA_GROUP.get(namespace, "Other names"), extra))
    title = None
    for line in _api_block(module):
        text = line.strip()
        if text.startswith("#") and not text.startswith("#:"):
            title = text.lstrip("# ").strip()
            title = title[:1].upper() + title[1:]
            out.append((title, []))
        elif m := re.match(r"""["'](\w+)["']\s*:""", text):
            if not out or title is None:
                title = "Names"
                out.append((title, []))
            out[-1][1].append(m[1])
    listed = [n for _, names in out for n in names]
    if sorted(listed) != sorted(module.__all__):
        raise SystemExit(
            f"{namespace}: the groups list {sorted(listed)}, __all__ is {sorted(module.__all__)}"
        )
    return [(t, names) for t, names in out if names]


def _source_lines(module: ModuleType) -> list[str]:
    return inspect.getsource(module).splitlines()


def _api_block(module: ModuleType) -> list[str]:
    """The source lines of the module's ``_API = {...}`` assignment (none without one)."""
    tree = ast.parse(inspect.getsource(module))
    for node in tree.body:
        target = (
            node.target
            if isinstance(node, ast.AnnAssign)
            else (node.targets[0] if isinstance(node, ast.Assign) else None)
        )
        if isinstance(target, ast.Name) and target.id == "_API":
            return _source_lines(module)[node.lineno - 1 : node.end_lineno]
    return []


def _doc_comment(lines: list[str], index: int) -> str | None:
    """The ``#:`` comment lines right above ``lines[index]``, as text, or None."""
    found = []
    i = index - 1
    while i >= 0 and lines[i].strip().startswith("#:"):
        found.append(lines[i].strip()[2:].strip())
        i -= 1
    return "\n".join(reversed(found)) if found else None


def _binding_comment(lines: list[str], name: str) -> str | None:
    """The ``#:`` comment above the line that binds ``name`` (an ``_API`` entry, an import, an
    assignment), or None."""
    pattern = re.compile(
        rf"""^\s*(["']{re.escape(name)}["']\s*:|{re.escape(name)}\s*[:=]|"""
        rf"""(from\s+\S+\s+)?import\s+.*\b{re.escape(name)}\b)"""
    )
    for i, line in enumerate(lines):
        if pattern.match(line):
            doc = _doc_comment(lines, i)
            if doc:
                return doc
    return None


def constant_doc(namespace: str, name: str) -> str:
    """A constant's documentation: the ``#:`` comment on its binding in the namespace, else on
    its assignment where the namespace takes it from."""
    module = importlib.import_module(namespace)
    doc = _binding_comment(_source_lines(module), name)
    if doc:
        return doc
    origin = getattr(module, "_API", {}).get(name)
    if origin is None:  # imported by a plain import statement: follow it
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.ImportFrom) and any(
                (a.asname or a.name) == name for a in node.names
            ):
                base = importlib.util.resolve_name(
                    "." * node.level + (node.module or ""), module.__package__ or namespace
                )
                attr = next(a.name for a in node.names if (a.asname or a.name) == name)
                origin = (base, attr)
    if origin is not None:
        source = importlib.import_module(_absolute(namespace, origin[0]))
        doc = _binding_comment(_source_lines(source), origin[1])
    return doc or ""


def _absolute(namespace: str, module: str) -> str:
    """The absolute name of an ``_API`` module (the namespaces give it relative to a prefix)."""
    for candidate in (module, f"selfspec._engine.{module}", f"selfspec.{module}"):
        try:
            importlib.import_module(candidate)
            return candidate
        except ImportError:
            continue
    raise SystemExit(f"{namespace}: cannot find the module {module!r}")


# --------------------------------------------------------------------------- signatures
def _annotation(ann: Any) -> str:
    if isinstance(ann, str):
        return ann
    if isinstance(ann, type):
        return ann.__qualname__ if ann.__module__ != "builtins" else ann.__name__
    text = re.sub(r"ForwardRef\('([^']*)'[^)]*\)", r"\1", inspect.formatannotation(ann))
    return re.sub(r"\b(?:[a-z_]\w*\.)+([A-Z]\w*)", r"\1", text)  # no module paths


def _default(value: Any, factory: Any = None) -> str:
    if factory is not None:
        if factory in (dict, list, tuple, set):
            return repr(factory())
        return f"{getattr(factory, '__name__', 'factory')}()"
    if inspect.isfunction(value) or inspect.isclass(value) or inspect.isbuiltin(value):
        return value.__qualname__
    text = repr(value)
    if re.search(r" at 0x[0-9a-fA-F]+", text) or text.startswith("<"):
        return getattr(value, "__name__", type(value).__name__)
    return text


def _has_constructor(cls: type) -> bool:
    """A dataclass, or a class of which some non-builtin class defines ``__init__``/``__new__``."""
    return dataclasses.is_dataclass(cls) or any(
        "__init__" in vars(k) or "__new__" in vars(k)
        for k in cls.__mro__
        if k.__module__ != "builtins"
    )


def signature(name: str, obj: Any, *, drop_first: bool = False) -> str | None:
    """``name(params) -> ret``, wrapped one parameter a line past 88 columns; None when the
    object has none worth showing (a class without its own constructor)."""
    if inspect.isclass(obj) and not _has_constructor(obj):
        return None
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    factories = {}
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
        factories = {
            f.name: f.default_factory
            for f in dataclasses.fields(obj)
            if f.default_factory is not dataclasses.MISSING
        }
    params = list(sig.parameters.values())
    if drop_first and params:
        params = params[1:]
    parts: list[str] = []
    star = False
    slash = False
    for p in params:
        if p.name.startswith("_"):
            continue
        if p.kind is p.POSITIONAL_ONLY:
            slash = True
        elif slash:
            parts.append("/")
            slash = False
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        text = p.name
        if p.kind is p.VAR_POSITIONAL:
            text, star = f"*{p.name}", True
        elif p.kind is p.VAR_KEYWORD:
            text = f"**{p.name}"
        if p.annotation is not p.empty:
            text += f": {_annotation(p.annotation)}"
        if p.default is not p.empty:
            sep = " = " if p.annotation is not p.empty else "="
            text += sep + _default(p.default, factories.get(p.name))
        parts.append(text)
    if slash:
        parts.append("/")
    ret = ""
    if sig.return_annotation is not sig.empty and not inspect.isclass(obj):
        ret = f" -> {_annotation(sig.return_annotation)}"
    line = f"{name}({', '.join(parts)}){ret}"
    if len(line) <= 88:
        return line
    return f"{name}(\n" + "".join(f"    {p},\n" for p in parts) + f"){ret}"


# --------------------------------------------------------------------------- markdown
def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


class Page:
    """One namespace's page, and the anchor of each of its headings (GitHub numbers a repeated
    anchor: ``#draft_weights``, then ``#draft_weights-1``)."""

    def __init__(self, namespace: str, filename: str) -> None:
        self.namespace = namespace
        self.filename = filename
        self.module = importlib.import_module(namespace)
        self.title = f"`{namespace}`: {TITLES[namespace]}"
        self.groups = groups(namespace)
        self.names = [n for _, names in self.groups for n in names]
        self.anchors: dict[str, str] = {}  # a group's title, a name or "name.member" -> anchor
        seen: dict[str, int] = {}
        for key, heading in self.headings():
            anchor = slug(heading)
            if anchor in seen:
                seen[anchor] += 1
                anchor = f"{anchor}-{seen[anchor]}"
            else:
                seen[anchor] = 0
            self.anchors.setdefault(key, anchor)

    def headings(self) -> Iterator[tuple[str, str]]:
        """``(key, heading)`` of every heading of the page, in order."""
        yield "", self.title
        yield "", "Contents"
        for title, names in self.groups:
            yield f"group:{title}", title
            for name in names:
                yield name, f"`{name}`"
                for member in sub_entries(getattr(self.module, name)):
                    yield f"{name}.{member}", f"`{name}.{member}`"


class Links:
    """Where every public name (and every documented member) is, for ``:role:`target``` links."""

    def __init__(self, pages: list[Page]) -> None:
        self.where: dict[str, tuple[str, str]] = {}  # target -> (page, anchor)
        for page in pages:
            for name in page.names:
                self.where[f"{page.namespace}.{name}"] = (page.filename, page.anchors[name])
                for member in sub_entries(getattr(page.module, name)):
                    self.where[f"{page.namespace}.{name}.{member}"] = (
                        page.filename,
                        page.anchors[f"{name}.{member}"],
                    )
        bare: dict[str, list[tuple[str, str]]] = {}
        for target, place in self.where.items():
            for ns, *_ in NAMESPACES:
                if target.startswith(ns + "."):
                    rest = target[len(ns) + 1 :]
                    if rest.count(".") <= 1:
                        bare.setdefault(rest, []).append(place)
        self.bare = {k: v[0] for k, v in bare.items() if len(set(v)) == 1}

    def find(self, target: str, owner: str | None) -> tuple[str, str] | None:
        if target in self.where:
            return self.where[target]
        if owner and f"{owner}.{target}" in self.bare:
            return self.bare[f"{owner}.{target}"]
        return self.bare.get(target)


ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):`(~?)([^`]+)`")
LINK = re.compile(r"\]\(((?![a-z][a-z0-9+.-]*:|#)[^)\s]+)\)")


def inline(text: str, links: Links, page: str, owner: str | None) -> str:
    """reST inline markup to Markdown: ````code````, ``:role:`target``` (a link when the target
    is a public name), and repository-relative link targets made relative to ``docs/api/``."""

    def role(m: re.Match[str]) -> str:
        short, target = m[1], m[2].lstrip(".")
        shown = target.rsplit(".", 1)[-1] if short else target
        found = links.find(target.rstrip("()"), owner)
        if found is None:
            return f"`{shown}`"
        where = f"#{found[1]}" if found[0] == page else f"{found[0]}#{found[1]}"
        return f"[`{shown}`]({where})"

    def relative(m: re.Match[str]) -> str:
        target = m[1]
        if target.startswith("docs/"):
            return f"](../{target[5:]})"
        return f"](../../{target})"

    parts = re.split(r"(``.+?``)", text, flags=re.S)
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"`{part[2:-2]}`")
        else:
            out.append(ROLE.sub(role, LINK.sub(relative, part)))
    return "".join(out)


def _blocks(text: str) -> Iterator[tuple[str, str]]:
    """``("code", body)`` for each reST literal block (a paragraph ending in ``::`` and the
    indented lines after it), ``("text", body)`` for the rest."""
    lines = text.split("\n")
    buf: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        buf.append(line)
        i += 1
        if line.rstrip().endswith("::") and i < len(lines) and not lines[i].strip():
            buf[-1] = line.rstrip()[:-1] if line.strip() != "::" else ""
            code: list[str] = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith(" ")):
                code.append(lines[i])
                i += 1
            yield "text", "\n".join(buf)
            buf = []
            yield "code", textwrap.dedent("\n".join(code)).strip("\n")
    if buf:
        yield "text", "\n".join(buf)


def markdown(doc: str, links: Links, page: str, owner: str | None = None) -> str:
    """A docstring as Markdown: sections (``Args:``...) bold, arguments as bullets, literal
    blocks fenced, inline markup converted."""
    out: list[str] = []
    for kind, body in _blocks(inspect.cleandoc(doc)):
        if kind == "code":
            out.append(f"\n```python\n{body}\n```\n")
            continue
        section = None
        items: list[str] = []
        for line in body.split("\n"):
            head = line.rstrip()
            if head.endswith(":") and not line.startswith(" ") and head[:-1] in SECTIONS:
                items = _flush(out, section, items)
                section = head[:-1]
                out.append(f"\n**{section}.**" + ("\n" if section == "Args" else ""))
                continue
            if section is None:
                out.append(line)
            else:
                items.append(line)
        _flush(out, section, items)
    text = "\n".join(out)
    text = "\n\n".join(_definitions(p) for p in text.split("\n\n"))
    text = re.sub(r"\*\*(\w[\w ]*)\.\*\*\n(?!\n)", r"**\1.** ", text)  # "**Notes.** text"
    text = text.replace("\n\n\n", "\n\n")
    return _convert(text, links, page, owner).strip() + "\n"


ITEM = re.compile(r"([\w*][\w ,*/.]*?):\s(.*)")


def _definitions(paragraph: str) -> str:
    """A paragraph of ``name: text`` items with indented continuation lines (the style of an
    ``Args`` section without its heading) as a bullet list; any other paragraph as it is."""
    lines = paragraph.split("\n")
    if not (ITEM.match(lines[0]) and any(line.startswith("    ") for line in lines[1:])):
        return paragraph
    bullets: list[str] = []
    for line in lines:
        m = ITEM.match(line)
        if m and not line.startswith(" ") and len(m[1]) <= 40:
            bullets.append(f"- {_names(m[1])}: {m[2].strip()}")
        elif bullets:
            bullets[-1] += " " + line.strip()
        else:
            return paragraph
    return "\n".join(bullets)


def _names(text: str) -> str:
    """``a, b and c`` or ``a / b`` as code spans."""
    return ", ".join(f"`{n.strip()}`" for n in re.split(r",| and |/", text) if n.strip())


def _flush(out: list[str], section: str | None, items: list[str]) -> list[str]:
    if section is None or not items:
        return []
    body = textwrap.dedent("\n".join(items)).strip("\n")
    if section != "Args":
        out.append(body)
        return []
    bullets: list[str] = []
    for line in body.split("\n"):
        m = ITEM.match(line)
        if m and not line.startswith(" ") and len(m[1]) <= 40:
            bullets.append(f"- {_names(m[1])}: {m[2].strip()}")
        elif bullets:
            bullets[-1] += " " + line.strip()
        else:
            bullets.append(line)
    out.append("\n".join(bullets))
    return []


def _convert(text: str, links: Links, page: str, owner: str | None) -> str:
    """Inline markup of everything outside the fenced code."""
    parts = re.split(r"(```python\n.*?\n```)", text, flags=re.S)
    return "".join(p if i % 2 else inline(p, links, page, owner) for i, p in enumerate(parts))


# --------------------------------------------------------------------------- classes
def members(cls: type) -> list[tuple[str, Any]]:
    """The class's own public methods and properties, in definition order."""
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    out = []
    for name, value in vars(cls).items():
        if name.startswith("_") or name in fields:  # a field's default is no method
            continue
        if isinstance(value, (staticmethod, classmethod)):
            out.append((name, value))
        elif isinstance(value, property) or inspect.isfunction(value):
            out.append((name, value))
        elif type(value).__name__ == "cached_property":
            out.append((name, value))
    return out


def module_functions(module: ModuleType) -> list[tuple[str, Any]]:
    """The module's own public functions, in definition order."""
    return [
        (n, f)
        for n, f in vars(module).items()
        if not n.startswith("_")
        and callable(f)
        and not inspect.isclass(f)
        and getattr(f, "__module__", None) == module.__name__
    ]


def sub_entries(obj: Any) -> list[str]:
    """The names documented under a heading of their own below ``obj``'s."""
    if inspect.isclass(obj):
        return [m for m, _ in members(obj)]
    if inspect.ismodule(obj):
        return [f for f, _ in module_functions(obj)]
    return []


def attributes(cls: type) -> list[tuple[str, str]]:
    """``[(name, text)]`` of the class's public attributes documented by a ``#:`` comment: in
    its body (dataclass fields, class attributes) or as ``self.name = ...`` in its methods."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return []
    lines = source.splitlines()
    out: dict[str, tuple[int, str]] = {}
    for node in ast.walk(ast.parse(source)):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            flat = target.elts if isinstance(target, ast.Tuple) else [target]
            names = []
            for t in flat:
                if isinstance(t, ast.Name):
                    names.append(t.id)
                elif (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                ):
                    names.append(t.attr)
            name = "`, `".join(n for n in names if not n.startswith("_"))
            if name and name not in out:
                doc = _doc_comment(lines, node.lineno - 1)
                if doc:
                    out[name] = (node.lineno, doc)
    return [(name, doc) for name, (_, doc) in sorted(out.items(), key=lambda kv: kv[1][0])]


def kind(obj: Any) -> str:
    if inspect.ismodule(obj):
        return "module"
    if inspect.isclass(obj):
        if issubclass(obj, BaseException):
            return "exception"
        return "dataclass" if dataclasses.is_dataclass(obj) else "class"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.ismethod(obj):
        return "function"
    return "decorator" if callable(obj) else "constant"


def _bases(cls: type, public: dict[type, str]) -> str:
    names = [
        public.get(b) or (b.__name__ if b.__module__ == "builtins" else "")
        for b in cls.__bases__
        if b is not object
    ]
    names = [n for n in names if n]
    return f" (subclass of {', '.join(f'`{n}`' for n in names)})" if names else ""


def _member_kind(value: Any) -> str:
    if isinstance(value, property) or type(value).__name__ == "cached_property":
        return "property"
    if isinstance(value, classmethod):
        return "classmethod"
    if isinstance(value, staticmethod):
        return "staticmethod"
    return "method"


# --------------------------------------------------------------------------- pages
def render_name(page: Page, name: str, links: Links, public: dict[type, str]) -> str:
    obj = getattr(page.module, name)
    what = kind(obj)
    parts = [f"### `{name}`\n\n*{what}*"]
    if inspect.isclass(obj):
        parts[0] += _bases(obj, public)
    parts[0] += "\n"
    sig = None if what in ("constant", "decorator", "module") else signature(name, obj)
    if sig:
        parts.append(f"```python\n{sig}\n```\n")
    if what in ("constant", "decorator"):
        doc = constant_doc(page.namespace, name)
        if type(obj) in (str, int, float, tuple) and len(repr(obj)) < 80:
            parts.append(f"```python\n{name} = {obj!r}\n```\n")
    else:
        doc = inspect.getdoc(obj) or ""
    if doc:
        parts.append(markdown(doc, links, page.filename, name))
    note = (
        None
        if what in ("constant", "decorator")
        else _binding_comment(_source_lines(page.module), name)
    )
    if note:  # the namespace's own word on the name, after the object's docstring
        parts.append(markdown(note, links, page.filename, name))
    if what == "module":
        for fname, func in module_functions(obj):
            parts.append(f"#### `{name}.{fname}`\n")
            fsig = signature(f"{name}.{fname}", func)
            if fsig:
                parts.append(f"```python\n{fsig}\n```\n")
            if inspect.getdoc(func):
                parts.append(markdown(inspect.getdoc(func) or "", links, page.filename, name))
    if inspect.isclass(obj):
        documented = attributes(obj)
        if documented:
            parts.append(
                "**Attributes.**\n\n"
                + "\n".join(
                    "- `{}`: {}".format(
                        a, " ".join(markdown(t, links, page.filename, name).split())
                    )
                    for a, t in documented
                )
                + "\n"
            )
        for member, value in members(obj):
            func = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
            func = getattr(func, "func", func)  # functools.cached_property
            mkind = _member_kind(value)
            ann = getattr(func, "__annotations__", {}).get("return")
            if mkind == "property" and ann:
                mkind += f": `{_annotation(ann)}`"
            parts.append(f"#### `{name}.{member}`\n\n*{mkind}*\n")
            if not mkind.startswith("property"):
                msig = signature(f"{name}.{member}", func, drop_first=mkind != "staticmethod")
                if msig:
                    parts.append(f"```python\n{msig}\n```\n")
            mdoc = inspect.getdoc(func)
            if mdoc:
                parts.append(markdown(mdoc, links, page.filename, name))
    return "\n".join(parts)


def render_page(page: Page, links: Links, public: dict[type, str], stability: str) -> str:
    head = [
        f"# {page.title}\n",
        f"{GENERATED} Stability: {stability} ([compatibility](../api.md#compatibility)); "
        "all namespaces: [api.md](../api.md).\n",
    ]
    doc = inspect.getdoc(page.module) or ""
    head.append(markdown(doc, links, page.filename))
    contents = ["## Contents\n"]
    for title_, names in page.groups:
        refs = ", ".join(f"[`{n}`](#{page.anchors[n]})" for n in names)
        contents.append(f"- [{title_}](#{page.anchors['group:' + title_]}): {refs}")
    body = []
    for title_, names in page.groups:
        body.append(f"## {title_}\n")
        body += [render_name(page, n, links, public) for n in names]
    text = "\n".join(head) + "\n" + "\n".join(contents) + "\n\n" + "\n".join(body)
    text = re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"
    _check_anchors(page, text)
    return text


def _check_anchors(page: Page, text: str) -> None:
    """The page's headings are the ones its anchors were computed from (a docstring must not
    add a heading: the links to the names after it would be wrong)."""
    body = re.sub(r"```.*?```", "", text, flags=re.S)
    found = re.findall(r"^#{1,6} (.+)$", body, re.M)
    expected = [heading for _, heading in page.headings()]
    if found != expected:
        extra = sorted(set(found) - set(expected))
        raise SystemExit(f"docs/api/{page.filename}: a docstring adds headings {extra}")


def render_index(pages: list[Page]) -> str:
    rows = []
    for namespace, filename, purpose, stability in NAMESPACES:
        rows.append(
            f"| `{namespace}` | [api/{filename}](api/{filename}) | {purpose} | {stability} |"
        )
    return f"# The public API\n\n{GENERATED}\n\n" + INDEX_INTRO.format(rows="\n".join(rows))


def render() -> dict[Path, str]:
    """``{path: text}`` of every page: ``docs/api.md`` and ``docs/api/<namespace>.md``."""
    pages = [Page(ns, filename) for ns, filename, *_ in NAMESPACES]
    links = Links(pages)
    public: dict[type, str] = {}
    for page in pages:
        for name in page.names:
            obj = getattr(page.module, name)
            if inspect.isclass(obj):
                public.setdefault(obj, name)
    out = {DOCS / "api.md": render_index(pages)}
    for page, (*_, stability) in zip(pages, NAMESPACES):
        out[DOCS / "api" / page.filename] = render_page(page, links, public, stability)
    return out


def stale(rendered: dict[Path, str]) -> list[str]:
    """The pages whose committed text differs from ``rendered`` (or that are missing)."""
    bad = []
    for path, text in rendered.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            bad.append(str(path.relative_to(ROOT)))
    extra = sorted(set((DOCS / "api").glob("*.md")) - set(rendered))
    return bad + [str(p.relative_to(ROOT)) for p in extra]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rendered = render()
    if argv[:1] == ["--check"]:
        bad = stale(rendered)
        if bad:
            print(f"{', '.join(bad)} stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    (DOCS / "api").mkdir(exist_ok=True)
    for path, text in rendered.items():
        path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "core"))  # this checkout's code, whatever is installed
    raise SystemExit(main())
