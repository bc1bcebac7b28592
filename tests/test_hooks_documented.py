"""Every hook is documented (its docstring is the contract) and has a test of its own.

Datasette's ``test_plugin_hooks_are_documented`` / ``test_plugin_hooks_have_tests``: adding a
hook without a contract or a test fails here.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from selfspec._engine import hookspecs

TESTS = Path(__file__).parent
ROOT = TESTS.parent
HOOKS = sorted(n for n, f in vars(hookspecs).items() if n.startswith("selfspec_") and callable(f))


def spec_opts(name: str) -> dict:
    return getattr(hookspecs, name).selfspec_spec


def signature(name: str) -> str:
    """``name(arg: Type, ...) -> Ret`` as the hooks reference prints it."""
    return name + str(inspect.signature(getattr(hookspecs, name))).replace("'", "")


def test_the_hook_set():
    assert HOOKS == sorted([
        "selfspec_options", "selfspec_commands", "selfspec_setup", "selfspec_start", "selfspec_end",
        "selfspec_propose", "selfspec_verify", "selfspec_cache", "selfspec_update_policy",
    ])
    assert {h for h in HOOKS if spec_opts(h).get("firstresult")} == {"selfspec_propose", "selfspec_verify"}


@pytest.mark.parametrize("name", HOOKS)
def test_hook_docstring_is_a_contract(name):
    doc = inspect.getdoc(getattr(hookspecs, name)) or ""
    flat = " ".join(doc.split())
    summary, _, body = doc.partition("\n\n")
    assert summary and "\n" not in summary.strip() and summary.strip().endswith("."), f"{name}: one-line summary"
    assert re.search(r"\bCalled\b", body), f"{name}: say when the loop calls it"
    if spec_opts(name).get("firstresult"):
        assert "Stops at the first non-None result" in flat and "return None to defer" in flat, name
    else:
        assert re.search(r"every plugin", flat, re.I), f"{name}: say that every plugin is called"
    for arg in inspect.signature(getattr(hookspecs, name)).parameters:
        assert re.search(rf"\b{arg}\b", doc), f"{name}: argument {arg!r} is not described"


@pytest.mark.parametrize("name", HOOKS)
def test_hook_has_a_test(name):
    short = name.removeprefix("selfspec_")
    pattern = re.compile(rf"^\s*def test_hook_{short}\(", re.M)
    assert any(pattern.search(p.read_text(encoding="utf-8")) for p in TESTS.rglob("test_*.py")), (
        f"no test_hook_{short} in tests/"
    )


@pytest.mark.parametrize("name", HOOKS)
def test_hook_is_in_the_reference_with_its_signature(name):
    page = ROOT / "docs" / "hooks.md"
    if not page.exists():
        pytest.skip("docs/hooks.md is not there")
    text = page.read_text(encoding="utf-8")
    assert name in text and signature(name) in text, f"{signature(name)} missing from docs/hooks.md"
