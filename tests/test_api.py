"""The public API: what plugins may import, and that every name of it is documented.

a) Plugins (everything under ``plugins/``, the template included) use the host only through
   the plugin contract, the top-level ``selfspec`` namespace, as a third-party author must:
   ``import selfspec`` / ``from selfspec import X`` with ``X`` in ``selfspec.__all__``, and
   ``selfspec.X`` attributes likewise; and through the app namespace ``selfspec.app`` (their
   commands: model loading, data, the command context) by the names of ``selfspec.app.__all__``.
   Their tests may also use the ``selfspec.testing`` kit. Parsed with ``ast``, so
   function-local imports count.
b) No plugin file reads ``.adapter`` or ``.base`` (the runner's adapter and the model's inner
   module are the host's business; the runner's documented accessors give the final norm, the
   head and the embedding).
c) docs/api.md documents every name of the contract in its contract part and every name of the
   app namespace in its own part, and the names moved from the top level to ``selfspec.app``
   still work there for one release, with a DeprecationWarning.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import selfspec
import selfspec.app

ROOT = Path(__file__).resolve().parents[1]
API = set(selfspec.__all__)
APP_API = set(selfspec.app.__all__)
#: attributes no plugin file reads: the runner's adapter, the model's inner (base) module
PRIVATE_ATTRIBUTES = ("adapter", "base")


def _plugin_files() -> list[Path]:
    return sorted(p for p in (ROOT / "plugins").rglob("*.py") if ".venv" not in p.parts and "build" not in p.parts)


def violations(path: Path, source: str | None = None) -> list[str]:
    """Every way ``path`` reaches into the host past its public API (see a and b)."""
    tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"))
    in_tests = "tests" in path.parts
    allowed_modules = {"selfspec", "selfspec.app"} | ({"selfspec.testing"} if in_tests else set())
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top == "selfspec" and not any(alias.name == m or alias.name.startswith(m + ".") and m != "selfspec"
                                                 for m in allowed_modules):
                    out.append(f"{path}:{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mod = node.module
            if mod.split(".")[0] != "selfspec":
                continue
            if mod in ("selfspec", "selfspec.app"):
                names = API | {"app"} if mod == "selfspec" else APP_API
                out += [f"{path}:{node.lineno}: from {mod} import {a.name} (not in {mod}.__all__)"
                        for a in node.names if a.name not in names]
            elif not (in_tests and (mod == "selfspec.testing" or mod.startswith("selfspec.testing."))):
                out.append(f"{path}:{node.lineno}: from {mod} import ...")
        elif isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "selfspec":
                if node.attr not in API and node.attr != "app" and not (in_tests and node.attr == "testing"):
                    out.append(f"{path}:{node.lineno}: selfspec.{node.attr} (not in selfspec.__all__)")
            elif (isinstance(node.value, ast.Attribute) and isinstance(node.value.value, ast.Name)
                  and node.value.value.id == "selfspec" and node.value.attr == "app" and node.attr not in APP_API):
                out.append(f"{path}:{node.lineno}: selfspec.app.{node.attr} (not in selfspec.app.__all__)")
            if node.attr in PRIVATE_ATTRIBUTES:
                out.append(f"{path}:{node.lineno}: .{node.attr} (the host's internals: use the runner's accessors)")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr"):
            if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and node.args[1].value in PRIVATE_ATTRIBUTES:
                out.append(f"{path}:{node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    return out


def test_plugins_use_the_host_only_through_its_public_api():
    files = _plugin_files()
    assert len(files) > 20  # the walk found the plugins
    bad = [v for f in files for v in violations(f.relative_to(ROOT), (ROOT / f).read_text(encoding="utf-8"))]
    assert not bad, "plugins reach past the public API:\n" + "\n".join(bad)


@pytest.mark.parametrize("source, n", [
    ("from selfspec.runner import Runner", 1),
    ("def f():\n    from selfspec.models import cache_dir", 1),  # function-local imports count
    ("import selfspec.loop", 1),
    ("from selfspec import _LAZY", 1),
    ("from selfspec import Draft, verify_greedy\nimport selfspec\nselfspec.hookimpl", 0),
    ("import selfspec\nselfspec.models.cache_dir()", 1),
    ("from selfspec.testing import tiny_model", 1),  # the kit is for tests only
    ("from selfspec.app import CommandContext, load_task\nimport selfspec.app\nselfspec.app.load_model()", 0),
    ("from selfspec.app import Runner", 1),  # the app namespace holds only its own names
    ("import selfspec\nselfspec.app.cli", 1),
    ("from selfspec.cli import Settings", 1),  # the app's modules are no more public than the engine's
    ("runner.adapter.final_norm(h)", 1),  # the runner's adapter: use runner.norm / runner.head
    ("model.base.embed_tokens", 1),
    ("runner.adapter.attn_block = f", 1),  # writing counts too
    ("getattr(runner, 'adapter')", 1),
    ("runner.norm(h)\nrunner.head(h, lm_head=m)\nrunner.embedding.weight", 0),
])
def test_the_guard_itself(source, n):
    assert len(violations(Path("plugins/x/x.py"), source)) == n


def test_tests_may_use_the_kit():
    assert violations(Path("plugins/x/tests/test_x.py"), "from selfspec.testing import tiny_model\nimport selfspec.testing") == []


def test_the_template_is_checked_too():
    assert any("_template" in p.parts and "tests" not in p.parts for p in _plugin_files())


def _api_sections() -> tuple[str, str]:
    """docs/api.md's contract part and its app-namespace part."""
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    marker = "\n# The app namespace"
    assert marker in text, "docs/api.md has no '# The app namespace' part"
    contract, app = text.split(marker, 1)
    return contract, app


def test_every_contract_name_is_documented_in_the_contract_part():
    contract, _ = _api_sections()
    missing = sorted(n for n in API if f"### `{n}`" not in contract)
    assert not missing, f"docs/api.md's contract part does not document {missing}"


def test_every_app_name_is_documented_in_the_app_part():
    _, app = _api_sections()
    missing = sorted(n for n in APP_API if f"### `{n}`" not in app)
    assert not missing, f"docs/api.md's app part does not document {missing}"


def test_the_contract_holds_no_app_names():
    # the CLI's settings, data splits and model loaders left the contract for selfspec.app
    assert not API & APP_API
    assert not API & set(selfspec._MOVED_TO_APP)
    for name in API - {"__version__", "hookimpl"}:
        module = selfspec._LAZY[name][0]
        assert module.split(".")[0] not in ("cli", "bench", "data", "models", "app"), (name, module)


def test_all_lists_exactly_the_lazy_names():
    assert selfspec.__all__ == ["__version__", "hookimpl", *selfspec._LAZY]
    assert selfspec.app.__all__ == [*selfspec.app._LAZY]


@pytest.mark.parametrize("name", sorted(selfspec._MOVED_TO_APP))
def test_moved_names_still_work_with_a_deprecation_warning(name):
    assert name in APP_API
    with pytest.warns(DeprecationWarning, match=rf"selfspec\.{name} moved to selfspec\.app\.{name}"):
        old = getattr(selfspec, name)
    assert old is getattr(selfspec.app, name)
    with pytest.warns(DeprecationWarning):  # `from selfspec import X` warns too, every time
        exec(f"from selfspec import {name}", {})


def test_app_names_resolve():
    for name in selfspec.app.__all__:
        assert getattr(selfspec.app, name) is not None
    assert selfspec.app.load_model is selfspec.models.load


def test_every_api_name_resolves_and_import_is_cheap():
    for name in selfspec.__all__:
        assert getattr(selfspec, name) is not None
    code = "import sys, selfspec; print(sorted(m for m in ('torch', 'transformers', 'click') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_plugin_modules_stay_small():
    # past ~400 lines a module becomes a package (STYLE.md); tests are not modules of a plugin
    big = {str(p.relative_to(ROOT)): n for p in _plugin_files() if "tests" not in p.parts
           and (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert not big, big


def test_host_modules_stay_small():
    # the same rule for the host, bench/ and cli/ included
    core = ROOT / "core" / "selfspec"
    big = {str(p.relative_to(ROOT)): n for p in core.rglob("*.py")
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert not big, big


def test_a_plain_decode_never_imports_the_benchmark_package():
    code = (
        "import sys\n"
        "from selfspec import Decoder\n"
        "from selfspec.testing import tiny_model\n"
        "for name in ('vanilla', 'lookup'):\n"
        "    Decoder(tiny_model('llama'), name).generate([1, 2, 3, 1, 2], 4)\n"
        "print(sorted(m for m in sys.modules if m.startswith(('selfspec.bench', 'selfspec.data', 'selfspec.cli', "
        "'selfspec.models', 'selfspec.app'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


RUNNER_ACCESSORS = ("final_norm", "norm", "lm_head", "logit_softcap", "softcap", "embedding", "head", "embed")


def test_the_runner_accessors_exist_and_are_documented():
    contract, _ = _api_sections()
    runner_part = contract.split("### `Runner`", 1)[1].split("### `KVCache`", 1)[0]
    for name in RUNNER_ACCESSORS:
        assert hasattr(selfspec.Runner, name), name
        assert f"`{name}" in runner_part, f"docs/api.md's Runner entry does not name {name}"
