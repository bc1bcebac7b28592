"""The public API: what plugins may import, and that every name of it is documented.

a) Plugins (everything under ``plugins/``) use the host only through the top-level ``selfspec``
   namespace, as a third-party author must: ``import selfspec`` / ``from selfspec import X``
   with ``X`` in ``selfspec.__all__``, and ``selfspec.X`` attributes likewise. Their tests may
   also use the ``selfspec.testing`` kit. Parsed with ``ast``, so function-local imports count.
b) Every name in ``selfspec.__all__`` has a ``### `name``` entry in docs/api.md.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import selfspec

ROOT = Path(__file__).resolve().parents[1]
API = set(selfspec.__all__)


def _plugin_files() -> list[Path]:
    return sorted(p for p in (ROOT / "plugins").rglob("*.py") if ".venv" not in p.parts and "build" not in p.parts)


def violations(path: Path, source: str | None = None) -> list[str]:
    """Every way ``path`` reaches into the host past its public API (see a)."""
    tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"))
    in_tests = "tests" in path.parts
    allowed_modules = {"selfspec"} | ({"selfspec.testing"} if in_tests else set())
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
            if mod == "selfspec":
                out += [f"{path}:{node.lineno}: from selfspec import {a.name} (not in selfspec.__all__)"
                        for a in node.names if a.name not in API]
            elif not (in_tests and (mod == "selfspec.testing" or mod.startswith("selfspec.testing."))):
                out.append(f"{path}:{node.lineno}: from {mod} import ...")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "selfspec":
            if node.attr not in API and not (in_tests and node.attr == "testing"):
                out.append(f"{path}:{node.lineno}: selfspec.{node.attr} (not in selfspec.__all__)")
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
])
def test_the_guard_itself(source, n):
    assert len(violations(Path("plugins/x/x.py"), source)) == n


def test_tests_may_use_the_kit():
    assert violations(Path("plugins/x/tests/test_x.py"), "from selfspec.testing import tiny_model\nimport selfspec.testing") == []


def test_every_api_name_is_documented():
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    missing = sorted(n for n in API if f"### `{n}`" not in text)
    assert not missing, f"docs/api.md does not document {missing}"


def test_all_lists_exactly_the_lazy_names():
    assert selfspec.__all__ == ["__version__", "hookimpl", *selfspec._LAZY]


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


def test_a_plain_decode_never_imports_the_benchmark_package():
    code = (
        "import sys\n"
        "from selfspec import Decoder\n"
        "from selfspec.testing import tiny_model\n"
        "for name in ('vanilla', 'lookup'):\n"
        "    Decoder(tiny_model('llama'), name).generate([1, 2, 3, 1, 2], 4)\n"
        "print(sorted(m for m in sys.modules if m.startswith(('selfspec.bench', 'selfspec.data'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
