"""Every hook is documented (its docstring is the contract) and has a test of its own.

Datasette's ``test_plugin_hooks_are_documented`` / ``test_plugin_hooks_have_tests``: adding a
hook without a contract or a test fails here.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from selfspec._engine.contract import hooksdoc, hookspecs

TESTS = Path(__file__).parent
ROOT = TESTS.parent
HOOKS = sorted(n for n, f in vars(hookspecs).items() if n.startswith("selfspec_") and callable(f))


def spec_opts(name: str) -> dict:
    return getattr(hookspecs, name).selfspec_spec


def signature(name: str) -> str:
    """``name(arg: Type, ...) -> Ret`` as the hooks reference prints it."""
    return name + str(inspect.signature(getattr(hookspecs, name))).replace("'", "")


def test_the_hook_set():
    assert HOOKS == sorted(
        [
            "selfspec_options",
            "selfspec_commands",
            "selfspec_setup",
            "selfspec_start",
            "selfspec_end",
            "selfspec_propose",
            "selfspec_verify",
            "selfspec_cache",
            "selfspec_update_policy",
            "selfspec_weight_formats",
        ]
    )
    assert {h for h in HOOKS if spec_opts(h).get("firstresult")} == {
        "selfspec_propose",
        "selfspec_verify",
    }


@pytest.mark.parametrize("name", HOOKS)
def test_hook_docstring_is_a_contract(name):
    """a) one-line summary; b) every required section, in order; c) each argument named in
    Args; d) Called says firstresult hooks stop at the first non-None result and the others
    call every plugin; e) Host enforces is never empty (say "Nothing" and why)."""
    doc = inspect.getdoc(getattr(hookspecs, name)) or ""
    summary, found = hooksdoc.sections(doc)
    assert summary and "\n" not in summary and summary.endswith((".", ")")), (
        f"{name}: one-line summary"
    )  # see a)
    missing = [s for s in hooksdoc.REQUIRED if not found.get(s)]
    assert not missing, f"{name}: sections missing or empty: {missing}"  # see b), e)
    args = set(re.findall(r"^(\w+):", found["Args"], re.M))
    assert args == set(inspect.signature(getattr(hookspecs, name)).parameters), (
        f"{name}: Args lists {args}"
    )  # c)
    called = " ".join(found["Called"].split())
    if spec_opts(name).get("firstresult"):  # see d)
        assert (
            "Stops at the first non-None result" in called and "return None to defer" in called
        ), name
    else:
        assert re.search(r"every plugin", called, re.I), f"{name}: say that every plugin is called"


@pytest.mark.parametrize(
    "doc, error",
    [
        ("Sum.\n\nArgs:\n    x: y\n\nCalled:\n    z", "out of order"),
        ("Sum.\n\nCalled:\n    z\n\nCalled:\n    z", "repeated"),
        ("Sum.\n\nloose prose\n\nCalled:\n    z", "before the first section"),
    ],
)
def test_the_section_parser_refuses_a_malformed_contract(doc, error):
    with pytest.raises(ValueError, match=error):
        hooksdoc.sections(doc)


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
