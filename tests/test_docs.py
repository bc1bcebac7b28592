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


def test_code_included_in_docs_matches_the_real_files():
    # see scripts/docsync.py: regenerate with `python scripts/docsync.py`
    import runpy

    docsync = runpy.run_path(str(ROOT / "scripts" / "docsync.py"))
    for md in sorted((ROOT / "docs").rglob("*.md")):
        text = md.read_text(encoding="utf-8")
        assert docsync["render"](text) == text, f"{md} is stale: run python scripts/docsync.py"
