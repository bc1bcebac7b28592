"""The public API: what plugins may import, and that every name of it is documented.

a) Plugins (everything under ``plugins/``, the template included) use the host only through
   the plugin contract, the top-level ``selfspec`` namespace, as a third-party author must:
   ``import selfspec`` / ``from selfspec import X`` with ``X`` in ``selfspec.__all__``, and
   ``selfspec.X`` attributes likewise; through the provisional namespace ``selfspec.provisional``
   by its ``__all__``; and through the app namespace ``selfspec.app`` (their commands: model
   loading, data, the command context) by the names of ``selfspec.app.__all__``.
   Their tests may also use the ``selfspec.testing`` kit. Parsed with ``ast``, so
   function-local imports count.
b) No plugin file reads ``.adapter`` or ``.base`` (the runner's adapter and the model's inner
   module are the host's business; the runner's documented accessors give the final norm, the
   head and the embedding).
c) docs/api/<namespace>.md (generated from the docstrings by ``scripts/api_docs.py``) documents
   exactly the names of its namespace (the stable contract, the provisional namespace, the
   kit, the app's), and every import the API pages' examples show works.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import selfspec
import selfspec.app
import selfspec.provisional
import selfspec.testing

ROOT = Path(__file__).resolve().parents[1]
API = set(selfspec.__all__)
PROVISIONAL_API = set(selfspec.provisional.__all__)
APP_API = set(selfspec.app.__all__)
TESTING_API = set(selfspec.testing.__all__)
#: attributes no plugin file reads: the runner's adapter, the model's inner (base) module
PRIVATE_ATTRIBUTES = ("adapter", "base")


def _plugin_files() -> list[Path]:
    return sorted(
        p
        for p in (ROOT / "plugins").rglob("*.py")
        if ".venv" not in p.parts and "build" not in p.parts
    )


def violations(path: Path, source: str | None = None) -> list[str]:
    """Every way ``path`` reaches into the host past its public API (see a and b)."""
    tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"))
    in_tests = "tests" in path.parts
    allowed_modules = {"selfspec", "selfspec.app", "selfspec.provisional"} | (
        {"selfspec.testing"} if in_tests else set()
    )
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top == "selfspec" and not any(
                    alias.name == m or alias.name.startswith(m + ".") and m != "selfspec"
                    for m in allowed_modules
                ):
                    out.append(f"{path}:{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mod = node.module
            if mod.split(".")[0] != "selfspec":
                continue
            if mod in ("selfspec", "selfspec.app", "selfspec.provisional"):
                names = {
                    "selfspec": API | {"app", "provisional"},
                    "selfspec.app": APP_API,
                    "selfspec.provisional": PROVISIONAL_API,
                }[mod]
                out += [
                    f"{path}:{node.lineno}: from {mod} import {a.name} (not in {mod}.__all__)"
                    for a in node.names
                    if a.name not in names
                ]
            elif not (
                in_tests and (mod == "selfspec.testing" or mod.startswith("selfspec.testing."))
            ):
                out.append(f"{path}:{node.lineno}: from {mod} import ...")
        elif isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "selfspec":
                if node.attr not in API | {"app", "provisional"} and not (
                    in_tests and node.attr == "testing"
                ):
                    out.append(
                        f"{path}:{node.lineno}: selfspec.{node.attr} (not in selfspec.__all__)"
                    )
            elif (
                isinstance(node.value, ast.Attribute)
                and isinstance(node.value.value, ast.Name)
                and node.value.value.id == "selfspec"
                and node.value.attr in ("app", "provisional")
            ):
                names = APP_API if node.value.attr == "app" else PROVISIONAL_API
                if node.attr not in names:
                    out.append(
                        f"{path}:{node.lineno}: selfspec.{node.value.attr}.{node.attr} "
                        f"(not in selfspec.{node.value.attr}.__all__)"
                    )
            if node.attr in PRIVATE_ATTRIBUTES:
                out.append(
                    f"{path}:{node.lineno}: .{node.attr} "
                    f"(the host's internals: use the runner's accessors)"
                )
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr")
        ):
            if (
                len(node.args) > 1
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in PRIVATE_ATTRIBUTES
            ):
                out.append(f"{path}:{node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    return out


def test_plugins_use_the_host_only_through_its_public_api():
    files = _plugin_files()
    assert len(files) > 20  # the walk found the plugins
    bad = [
        v
        for f in files
        for v in violations(f.relative_to(ROOT), (ROOT / f).read_text(encoding="utf-8"))
    ]
    assert not bad, "plugins reach past the public API:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "source, n",
    [
        ("from selfspec._engine.runner import Runner", 1),
        (
            "def f():\n    from selfspec.app._models import cache_dir",
            1,
        ),  # function-local imports count
        ("import selfspec._engine.contract.loop", 1),
        ("from selfspec import _API", 1),
        ("from selfspec.provisional import cost_curve", 0),
        ("from selfspec.provisional import Draft", 1),
        ("import selfspec\nselfspec.provisional.tree_path", 0),
        ("from selfspec import Draft, verify_greedy\nimport selfspec\nselfspec.hookimpl", 0),
        ("import selfspec\nselfspec.models.cache_dir()", 1),
        ("from selfspec.testing import tiny_model", 1),  # the kit is for tests only
        (
            "from selfspec.app import CommandContext, load_task\n"
            "import selfspec.app\nselfspec.app.load_model()",
            0,
        ),
        ("from selfspec.app import Runner", 1),  # the app namespace holds only its own names
        ("import selfspec\nselfspec.app.cli", 1),
        # the app's modules are no more public than the engine's
        ("from selfspec.app._cli import Settings", 1),
        ("runner.adapter.final_norm(h)", 1),  # the runner's adapter: use runner.norm / runner.head
        ("model.base.embed_tokens", 1),
        ("runner.adapter.attn_block = f", 1),  # writing counts too
        ("getattr(runner, 'adapter')", 1),
        ("runner.norm(h)\nrunner.head(h, lm_head=m)\nrunner.embedding.weight", 0),
    ],
)
def test_the_guard_itself(source, n):
    assert len(violations(Path("plugins/x/x.py"), source)) == n


def test_tests_may_use_the_kit():
    assert (
        violations(
            Path("plugins/x/tests/test_x.py"),
            "from selfspec.testing import tiny_model\nimport selfspec.testing",
        )
        == []
    )


def test_the_template_is_checked_too():
    assert any("_template" in p.parts and "tests" not in p.parts for p in _plugin_files())


#: each public namespace's generated reference page under docs/api/
PAGES = {
    "selfspec.md": API,
    "provisional.md": PROVISIONAL_API,
    "app.md": APP_API,
    "testing.md": TESTING_API,
}


def _api_page(name: str) -> str:
    return (ROOT / "docs" / "api" / name).read_text(encoding="utf-8")


def _documented(page: str) -> set[str]:
    return set(re.findall(r"^### `(\w+)`", page, re.M))


@pytest.mark.parametrize("page", sorted(PAGES))
def test_each_api_page_documents_exactly_its_namespace(page):
    names, documented = PAGES[page], _documented(_api_page(page))
    assert not names - documented, (
        f"public names docs/api/{page} does not document: {sorted(names - documented)}"
    )
    assert not documented - names, (
        f"names docs/api/{page} documents that the namespace lacks: {sorted(documented - names)}"
    )


def test_the_namespaces_are_disjoint_and_the_contract_is_the_engine():
    assert not API & APP_API and not API & PROVISIONAL_API and not PROVISIONAL_API & APP_API
    for name, (module, _) in {**selfspec._API, **selfspec.provisional._API}.items():
        assert importlib.import_module(f"selfspec._engine.{module}"), (name, module)
    for name, (module, _) in selfspec.app._API.items():
        assert module.startswith("app._"), (name, module)


def _documented_imports() -> list[str]:
    """Every ``import selfspec...`` / ``from selfspec... import ...`` line in the code of
    docs/api.md and the pages under docs/api/."""
    text = "\n".join(
        p.read_text(encoding="utf-8")
        for p in [ROOT / "docs" / "api.md", *sorted((ROOT / "docs" / "api").glob("*.md"))]
    )
    lines = []
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if re.match(r"(from selfspec[\w.]* import [\w, ]+|import selfspec[\w.]*)$", line):
                lines.append(line)
    return sorted(set(lines))


def test_docs_api_md_shows_imports():
    assert len(_documented_imports()) >= 5


@pytest.mark.parametrize("line", _documented_imports())
def test_every_import_docs_api_md_documents_works(line):
    exec(line, {})


def test_app_names_resolve():
    for name in selfspec.app.__all__:
        assert getattr(selfspec.app, name) is not None
    assert selfspec.app.load_model is importlib.import_module("selfspec.app._models").load


def test_provisional_names_resolve():
    for name in selfspec.provisional.__all__:
        assert getattr(selfspec.provisional, name) is not None


def test_every_api_name_resolves_and_import_is_cheap():
    for name in selfspec.__all__:
        assert getattr(selfspec, name) is not None
    code = (
        "import sys, selfspec; "
        "print(sorted(m for m in ('torch', 'transformers', 'click') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_plain_decode_never_imports_the_benchmark_package():
    code = (
        "import sys\n"
        "from selfspec import Decoder\n"
        "from selfspec.testing import tiny_model\n"
        "for name in ('vanilla', 'lookup'):\n"
        "    Decoder(tiny_model('llama'), name).generate([1, 2, 3, 1, 2], 4)\n"
        "print(sorted(m for m in sys.modules if m.startswith(("
        "'selfspec.app._bench', 'selfspec.app._data', 'selfspec.app._cli', "
        "'selfspec.app._models', 'selfspec.app'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


RUNNER_ACCESSORS = (
    "final_norm",
    "norm",
    "lm_head",
    "logit_softcap",
    "softcap",
    "embedding",
    "head",
    "embed",
)


def test_the_runner_accessors_exist_and_are_documented():
    contract = _api_page("selfspec.md")
    runner_part = contract.split("### `Runner`", 1)[1].split("### `KVCache`", 1)[0]
    for name in RUNNER_ACCESSORS:
        assert hasattr(selfspec.Runner, name), name
        assert f"`{name}" in runner_part or f"`Runner.{name}`" in runner_part, (
            f"docs/api/selfspec.md's Runner entry does not name {name}"
        )


def test_every_public_namespace_has_its_generated_type_block_in_sync():
    # type checkers and IDEs read the block; the runtime imports stay lazy
    # (selfspec._engine.contract.lazy)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "typed_face.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    for namespace in (selfspec, selfspec.provisional, selfspec.app, selfspec.testing):
        text = Path(namespace.__file__).read_text(encoding="utf-8")
        block = text[text.index("if TYPE_CHECKING:") :]
        for name in namespace._API:
            assert f" as {name}" in block, (namespace.__name__, name)
