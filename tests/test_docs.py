"""Docs that are generated from code must match it."""

from pathlib import Path

from selfspec import hooksdoc

ROOT = Path(__file__).resolve().parents[1]


def test_hooks_reference_is_generated_from_hookspecs():
    # see docs/hooks.md: regenerate with `python -m selfspec.hooksdoc > docs/hooks.md`
    assert (ROOT / "docs" / "hooks.md").read_text(encoding="utf-8") == hooksdoc.render()


def test_every_hook_has_a_heading_with_its_exact_signature():
    text = (ROOT / "docs" / "hooks.md").read_text(encoding="utf-8")
    for name, func in hooksdoc.hooks():
        assert f"## `{name}`" in text
        assert hooksdoc.signature(func) in text
