"""No import cycles among the modules of ``core/selfspec``, function-local imports included.

A cycle hidden in a function (``plugins.py`` importing ``builtin`` at call time while
``builtin`` imports the marker from ``plugins``) still ties two modules together: neither can
be read, tested or moved alone. The graph is built with ``ast`` from every ``import`` and
``from ... import`` anywhere in a module (in functions too), except under
``if TYPE_CHECKING:``, which never runs. An import of ``pkg.mod`` is an edge to ``pkg.mod``;
``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``.
"""

from __future__ import annotations

from pathlib import Path

from _import_graph import cycles, import_graph

CORE = Path(__file__).resolve().parents[1] / "core"


def test_no_import_cycles_in_core():
    graph = import_graph(CORE)
    assert (
        "selfspec._engine.contract.loop" in graph
        and "selfspec._engine.contract.markers" in graph["selfspec._engine.contract.builtin.verify"]
    )
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_detector_sees_a_function_local_cycle(tmp_path):
    pkg = tmp_path / "selfspec"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("from ..a import f\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n"
    )
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
#: The app: the command line, the benchmarks, the data splits, model loading, behind the
#: ``selfspec.app`` namespace, and ``python -m selfspec``. The engine is ``selfspec._engine``
#: behind the namespaces ``selfspec`` and ``selfspec.provisional``, plus the kit
#: (``selfspec.testing``). Each is one tree on disk.
APP_PACKAGES = ("selfspec.app", "selfspec.__main__")
ENGINE_PACKAGES = ("selfspec._engine", "selfspec.testing")
NAMESPACES = ("selfspec", "selfspec.provisional")  # the engine's public namespaces: one file each


def _under(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def is_app(module: str) -> bool:
    return _under(module, APP_PACKAGES)


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import from an engine module up into the app."""
    return sorted(
        f"{m} -> {t}" for m, targets in graph.items() if not is_app(m) for t in targets if is_app(t)
    )


def test_the_engine_imports_nothing_from_the_app():
    graph = import_graph(CORE)
    engine = [m for m in graph if not is_app(m)]
    assert {
        "selfspec._engine.contract.loop",
        "selfspec._engine.runner.runner",
        "selfspec._engine.contract.verification",
        "selfspec._engine.tuning.artefacts",
    } <= set(engine)
    assert {
        "selfspec.app._cli.settings",
        "selfspec.app._bench.harness",
        "selfspec.app._models.load",
        "selfspec.app._data",
    } <= set(graph) - set(engine)
    bad = layer_violations(graph)
    assert not bad, "engine modules import the app:\n" + "\n".join(bad)


def test_every_module_sits_in_one_of_the_two_trees():
    graph = import_graph(CORE)
    stray = sorted(
        m
        for m in graph
        if not (_under(m, APP_PACKAGES) or _under(m, ENGINE_PACKAGES) or m in NAMESPACES)
    )
    assert not stray, (
        f"modules outside the engine tree (selfspec/_engine, selfspec/testing) "
        f"and the app tree (selfspec/app): {stray}"
    )


def test_implementation_modules_are_private_by_name():
    """Below the public namespaces every module name starts with an underscore, except the
    kit's public ``strategies`` and its pytest plugin (an entry point)."""
    public_ok = {"selfspec.testing.strategies", "selfspec.testing.pytest_plugin"}
    graph = import_graph(CORE)
    public = {
        "selfspec",
        "selfspec.provisional",
        "selfspec.app",
        "selfspec.testing",
        "selfspec.__main__",
    }
    leaked = []
    for m in sorted(set(graph) - public - public_ok):
        parts = m.split(".")
        if not any(part.startswith("_") for part in parts[1:]):
            leaked.append(m)
    assert not leaked, f"implementation modules without a private name: {leaked}"


def test_no_entry_point_the_package_consumes_itself():
    """The host declares entry points only for others to load (the console script, the kit's
    pytest plugin), never a group it reads itself to get around the layer rule."""
    import tomllib

    meta = tomllib.loads((CORE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    groups = set(meta["project"].get("entry-points", {}))
    assert groups <= {"pytest11"}, f"entry-point groups the host declares: {sorted(groups)}"


def test_the_layer_rule_itself(tmp_path):
    pkg = tmp_path / "selfspec"
    (pkg / "app").mkdir(parents=True)
    (pkg / "_engine").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "app" / "__init__.py").write_text("")
    (pkg / "_engine" / "__init__.py").write_text("")
    # function-local counts
    (pkg / "_engine" / "loop.py").write_text("def eos():\n    from ..app import x\n")
    # the app may import the engine
    (pkg / "app" / "cli.py").write_text("from .._engine import loop\n")
    assert layer_violations(import_graph(tmp_path)) == ["selfspec._engine.loop -> selfspec.app"]
