"""No import cycles among the modules of ``core/selfspec``, function-local imports included.

A cycle hidden in a function (``plugins.py`` importing ``builtin`` at call time while
``builtin`` imports the marker from ``plugins``) still ties two modules together: neither can
be read, tested or moved alone. The graph is built with ``ast`` from every ``import`` and
``from ... import`` anywhere in a module (in functions too), except under
``if TYPE_CHECKING:``, which never runs. An import of ``pkg.mod`` is an edge to ``pkg.mod``;
``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``.
"""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "core"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skip.update(id(n) for n in ast.walk(child))
    return skip


def import_graph(root: Path, package: str = "selfspec") -> dict[str, set[str]]:
    files = {module_name(p, root): p for p in (root / package).rglob("*.py")}
    modules = set(files)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_nodes(tree)
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    pkg = ".".join(base + ([node.module] if node.module else []))
                else:
                    pkg = node.module or ""
                targets = [f"{pkg}.{a.name}" if f"{pkg}.{a.name}" in modules else pkg for a in node.names]
            for t in targets:
                while t and t not in modules and "." in t:  # `import selfspec.runner.masks` style
                    t = t.rsplit(".", 1)[0]
                if t in modules and t != mod:
                    graph[mod].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_in_core():
    graph = import_graph(CORE)
    assert "selfspec.loop" in graph and "selfspec.markers" in graph["selfspec.builtin.verify"]
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_detector_sees_a_function_local_cycle(tmp_path):
    pkg = tmp_path / "selfspec"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("from ..a import f\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    graph = import_graph(tmp_path)
    assert cycles(graph) == [["selfspec.a", "selfspec.sub.b"]]
    assert graph["selfspec.c"] == set()


def test_no_import_cycles_in_plugin_packages():
    # the same rule inside each plugin package (hispec's plugin <-> commands was one)
    plugins = Path(__file__).resolve().parents[1] / "plugins"
    found = {}
    for pkg in sorted(plugins.glob("selfspec-*/selfspec_*/__init__.py")):
        graph = import_graph(pkg.parent.parent, pkg.parent.name)
        if cycles(graph):
            found[pkg.parent.name] = cycles(graph)
    assert not found, f"import cycles in plugins: {found}"


# ------------------------------------------------------------------------------ the two layers
#: The app: the command line, the benchmarks, the data splits, model loading, and the namespace
#: that exposes them (selfspec.app). Every other module of the package is the engine.
APP_PACKAGES = ("selfspec.app", "selfspec.cli", "selfspec.bench", "selfspec.data", "selfspec.models",
                "selfspec.__main__")


def is_app(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in APP_PACKAGES)


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import from an engine module up into the app."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() if not is_app(m) for t in targets if is_app(t))


def test_the_engine_imports_nothing_from_the_app():
    graph = import_graph(CORE)
    engine = [m for m in graph if not is_app(m)]
    assert {"selfspec.loop", "selfspec.runner.runner", "selfspec.verification", "selfspec.artefacts"} <= set(engine)
    assert {"selfspec.cli.settings", "selfspec.bench.harness", "selfspec.models.load", "selfspec.data"} <= set(graph) - set(engine)
    bad = layer_violations(graph)
    assert not bad, "engine modules import the app:\n" + "\n".join(bad)


def test_the_layer_rule_itself(tmp_path):
    pkg = tmp_path / "selfspec"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "__init__.py").write_text("")
    (pkg / "loop.py").write_text("def eos():\n    from .models import x\n")  # function-local counts
    (pkg / "cli.py").write_text("from . import loop\n")  # the app may import the engine
    assert layer_violations(import_graph(tmp_path)) == ["selfspec.loop -> selfspec.models"]
