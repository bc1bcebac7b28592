"""The engine is four rooms with one way down: a module imports only from its own room and
the rooms below it, so the layering reads from the folders.

    drafting  (skip drafts, draft trees, n-grams, draft weights: built on the contract)
    contract  (the loop, hooks, types, options, plugins and their composition, verification,
              sampling, reference, audit)
    runner    (layer-level execution, weight layouts and formats, the KV cache)
    tuning    (measured choices, machine facts, the cache of artefacts)

Every import counts: module-level, ``TYPE_CHECKING`` blocks and function bodies. Imports sit at
the top of a module; the few inside a function say why on their line (``# here: ...``).
"""

from __future__ import annotations

import ast
from pathlib import Path

from _import_graph import import_graph

ENGINE = Path(__file__).resolve().parents[1] / "core" / "selfspec" / "_engine"
#: top to bottom
ROOMS = ("drafting", "contract", "runner", "tuning")
#: function-local imports allowed in the whole engine
MAX_LOCAL_IMPORTS = 9


def _modules() -> list[Path]:
    return sorted(p for p in ENGINE.rglob("*.py") if p != ENGINE / "__init__.py")


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["selfspec", "_engine"] else None


def upward_imports(core: Path) -> list[str]:
    """``module -> imported`` for every import of an engine module from a room above its own,
    ``TYPE_CHECKING`` blocks and function bodies included."""
    graph = import_graph(core, type_checking=True)
    return sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        if _room(m) in ROOMS
        for t in targets
        if _room(t) in ROOMS and ROOMS.index(_room(t)) < ROOMS.index(_room(m))
    )


def test_every_engine_module_lives_in_a_room():
    loose = [
        str(p.relative_to(ENGINE))
        for p in _modules()
        if p.relative_to(ENGINE).parts[0] not in ROOMS
    ]
    assert not loose, f"modules outside the four rooms {ROOMS}: {loose}"


def test_a_module_imports_only_its_room_and_the_rooms_below():
    up = upward_imports(ENGINE.parents[1])
    assert not up, "imports of a room above the importer's own:\n" + "\n".join(up)


def test_the_engine_is_not_imported_from_above_the_public_namespaces():
    # nothing under _engine imports the app or the kit: they sit on the public namespaces
    above = ("selfspec", "selfspec.provisional", "selfspec.app", "selfspec.testing")
    graph = import_graph(ENGINE.parents[1], type_checking=True)
    bad = sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        if _room(m) is not None
        for t in targets
        if t in above or t.startswith(("selfspec.app.", "selfspec.testing."))
    )
    assert not bad, bad


def test_function_local_imports_are_few_and_each_says_why():
    local = []
    for path in _modules():
        lines = path.read_text(encoding="utf-8").splitlines()
        tree = ast.parse("\n".join(lines))
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                for node in ast.walk(fn):
                    if isinstance(node, ast.Import | ast.ImportFrom):
                        text = " ".join(lines[node.lineno - 1 : node.end_lineno])
                        local.append(
                            (f"{path.relative_to(ENGINE)}:{node.lineno}", "# here:" in text)
                        )
    assert len(local) <= MAX_LOCAL_IMPORTS, (
        f"{len(local)} function-local imports: {[w for w, _ in local]}"
    )
    unexplained = [where for where, why in local if not why]
    assert not unexplained, (
        f"function-local imports without a '# here: <reason>' comment: {unexplained}"
    )


def test_the_check_sees_an_upward_import(tmp_path):
    # the rule itself: a runner module importing the contract is caught, in TYPE_CHECKING too
    engine = tmp_path / "selfspec" / "_engine"
    for room in ("runner", "contract", "tuning"):
        (engine / room).mkdir(parents=True)
        (engine / room / "__init__.py").write_text("")
    (tmp_path / "selfspec" / "__init__.py").write_text("")
    (engine / "__init__.py").write_text("")
    (engine / "contract" / "types.py").write_text("Draft = None\n")
    (engine / "tuning" / "machine.py").write_text("")
    (engine / "runner" / "probe.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from selfspec._engine.contract.types import Draft\n"
        "def f():\n    import selfspec._engine.tuning.machine  # here: a reason\n"
    )
    assert upward_imports(tmp_path) == [
        "selfspec._engine.runner.probe -> selfspec._engine.contract.types"
    ]
