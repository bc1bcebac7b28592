"""The engine is four rooms with one way down: a module imports only from its own room and
the rooms below it, so the layering reads from the folders.

    drafting  (skip drafts, trees, compositions, n-grams, draft weights: built on the contract)
    contract  (the loop, hooks, types, options, plugins, verification, sampling, reference, audit)
    runner    (layer-level execution, weight layouts and formats, the KV cache)
    tuning    (measured choices, machine facts, the cache of artefacts)

Every import counts: module-level, ``TYPE_CHECKING`` blocks and function bodies. The contract
reaches the composer above it only by entry point, as it reaches every plugin. Imports sit at
the top of a module; the few inside a function say why on their line (``# here: ...``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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


def _imports(path: Path) -> list[tuple[int, str, bool]]:
    """``(line, imported module, inside a function)`` for every ``selfspec`` import of ``path``."""
    package = ".".join(path.relative_to(ENGINE.parents[1]).with_suffix("").parts[:-1])
    found: list[tuple[int, str, bool]] = []

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            local = inside or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                targets = [f"{base}.{a.name}" for a in child.names] if base else []
                found.extend((child.lineno, t, inside) for t in [base, *targets])
            elif isinstance(child, ast.Import):
                found.extend((child.lineno, a.name, inside) for a in child.names)
            visit(child, local)

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return [(n, m, i) for n, m, i in found if m.startswith("selfspec")]


def test_every_engine_module_lives_in_a_room():
    loose = [
        str(p.relative_to(ENGINE))
        for p in _modules()
        if p.relative_to(ENGINE).parts[0] not in ROOMS
    ]
    assert not loose, f"modules outside the four rooms {ROOMS}: {loose}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ENGINE)))
def test_a_module_imports_only_its_room_and_the_rooms_below(path):
    own = ROOMS.index(path.relative_to(ENGINE).parts[0])
    up = [
        f"line {n}: {m}"
        for n, m, _ in _imports(path)
        if (room := _room(m)) in ROOMS and ROOMS.index(room) < own
    ]
    assert not up, f"{path.relative_to(ENGINE)} imports a room above its own: {up}"


def test_the_engine_is_not_imported_from_above_the_public_namespaces():
    # nothing under _engine imports the app or the kit: they sit on the public namespaces
    bad = [
        f"{p.relative_to(ENGINE)} line {n}: {m}"
        for p in _modules()
        for n, m, _ in _imports(p)
        if m.startswith(("selfspec.app", "selfspec.testing"))
        or m in ("selfspec", "selfspec.provisional")
    ]
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
    # the rule itself: a runner module importing the contract is caught
    room = tmp_path / "core" / "selfspec" / "_engine" / "runner"
    room.mkdir(parents=True)
    probe = room / "probe.py"
    probe.write_text(
        "from selfspec._engine.contract.types import Draft\n"
        "def f():\n    import selfspec._engine.tuning.machine  # here: a reason\n"
    )
    global ENGINE
    saved, ENGINE = ENGINE, tmp_path / "core" / "selfspec" / "_engine"
    try:
        found = _imports(probe)
        with pytest.raises(AssertionError, match="imports a room above its own"):
            test_a_module_imports_only_its_room_and_the_rooms_below(probe)
    finally:
        ENGINE = saved
    assert (3, "selfspec._engine.tuning.machine", True) in found
