"""Docs that are generated from code must match it."""

import functools
import re
import runpy
import subprocess
from pathlib import Path

from selfspec._engine.contract import hooksdoc

ROOT = Path(__file__).resolve().parents[1]


def test_hooks_reference_is_generated_from_hookspecs():
    # see docs/hooks.md: regenerate with
    # `python -m selfspec._engine.contract.hooksdoc > docs/hooks.md`
    assert (ROOT / "docs" / "hooks.md").read_text(encoding="utf-8") == hooksdoc.render()


# --------------------------------------------------------------------------- the API reference
@functools.cache
def _api_docs() -> dict:
    return runpy.run_path(str(ROOT / "scripts" / "api_docs.py"))


@functools.cache
def _api_pages() -> dict:
    """``{path: text}`` of the API pages as ``scripts/api_docs.py`` renders them now."""
    return _api_docs()["render"]()


def test_api_reference_is_generated_from_the_docstrings():
    # see docs/api.md: regenerate with `python scripts/api_docs.py`
    stale = _api_docs()["stale"](_api_pages())
    assert not stale, f"{', '.join(stale)} stale: run `python scripts/api_docs.py`"


def test_the_api_check_fails_on_a_stale_page():
    pages = dict(_api_pages())
    path = sorted(pages)[0]
    pages[path] += "an edit by hand\n"
    assert _api_docs()["stale"](pages) == [str(path.relative_to(ROOT))]


def test_the_api_pages_hold_nothing_machine_dependent():
    for path, text in _api_pages().items():
        assert not re.search(r" at 0x[0-9a-f]+|/home/|/work/|/tmp/|site-packages", text), path
    import selfspec
    import selfspec.app

    text = "\n".join(_api_pages().values())
    for obj in (selfspec.Decoder, selfspec.Runner, selfspec.draft_tree, selfspec.app.load_model):
        # no name is shown with the module it is defined in: those move
        assert f"{obj.__module__}.{obj.__qualname__}" not in text, obj


def _slugs(md: Path) -> set[str]:
    """GitHub's anchors of a markdown file's headings (a repeated one numbered -1, -2, ...)."""
    text = re.sub(r"^(```|~~~).*?^\1", "", md.read_text(encoding="utf-8"), flags=re.S | re.M)
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug)
        seen[slug] = 0 if n is None else n + 1
        out.add(slug if n is None else f"{slug}-{n + 1}")
    return out


#: the pages the API reference was split into: every link to one of their anchors must land
SPLIT_PAGES = (
    "docs/api.md",
    "docs/faq.md",
    "docs/composition.md",
    "docs/tree-drafts.md",
    "docs/weight-formats.md",
    "docs/api/selfspec.md",
    "docs/api/provisional.md",
    "docs/api/app.md",
    "docs/api/testing.md",
)


def test_links_into_the_api_pages_and_the_faq_land_on_a_heading():
    files = subprocess.run(
        ["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    files = sorted({*files, *SPLIT_PAGES})
    targets = {(ROOT / p).resolve(): _slugs(ROOT / p) for p in SPLIT_PAGES}
    bad = []
    for name in files:
        md = ROOT / name
        text = re.sub(r"^(```|~~~).*?^\1", "", md.read_text(encoding="utf-8"), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]*#[^)\s]+)\)", text):
            path, anchor = target.split("#", 1)
            page = (md.parent / path).resolve() if path else md.resolve()
            if page in targets and anchor not in targets[page]:
                bad.append(f"{name}: {target}")
    assert not bad, "links to a heading that does not exist:\n" + "\n".join(bad)


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


# --------------------------------------------------------------------------- attributes in docs
#: the variable names docs use for the host's types, and the attributes that lead from one to
#: another
_VARS = {
    "state": "DecodeState",
    "verdict": "Verdict",
    "draft": "Draft",
    "result": "Result",
    "stats": "Stats",
    "runner": "Runner",
}
_LINKS = {
    ("DecodeState", "runner"): "Runner",
    ("DecodeState", "stats"): "Stats",
    ("Result", "stats"): "Stats",
}
# a module's file name (`runner.py`) is not an attribute chain
_CHAIN = re.compile(r"(?<![\w./])(" + "|".join(_VARS) + r")((?:\.[A-Za-z_]\w*)+)(?!\w)(?<!\.py)")


def _public_attributes(name: str) -> set[str]:
    import dataclasses

    import selfspec

    cls = getattr(selfspec, name)
    names = set(vars(cls)) - {"__dataclass_fields__"}
    if dataclasses.is_dataclass(cls):
        names |= {f.name for f in dataclasses.fields(cls)}
    else:  # the Runner: what its constructor sets too
        from selfspec.testing import tiny_model

        names |= set(vars(cls(tiny_model("llama"))))
    return {n for n in names if not n.startswith("_")}


def _api_section(name: str) -> str:
    """The entry of ``name`` in docs/api/selfspec.md, its members' headings included."""
    text = (ROOT / "docs" / "api" / "selfspec.md").read_text(encoding="utf-8")
    start = text.index(f"### `{name}`\n")
    ends = [i for i in (text.find("\n### ", start + 1), text.find("\n## ", start + 1)) if i >= 0]
    return text[start : min(ends, default=len(text))]


def _mentioned(section: str, attr: str) -> bool:
    return re.search(rf"`[^`\n]*\b{re.escape(attr)}\b[^`\n]*`", section) is not None


def _attributes_used_in_docs() -> dict[tuple[str, str], str]:
    """``{(class, attribute): file}`` for every ``state.x``, ``verdict.x``, ``state.runner.x``, ...
    in the docs, the README and the plugins' READMEs."""
    files = [
        *sorted((ROOT / "docs").rglob("*.md")),
        ROOT / "README.md",
        *sorted((ROOT / "plugins").glob("*/README.md")),
    ]
    used: dict[tuple[str, str], str] = {}
    for path in files:
        for m in _CHAIN.finditer(path.read_text(encoding="utf-8")):
            cls: str | None = _VARS[m[1]]
            for attr in m[2].split(".")[1:]:
                if cls is None:
                    break
                used.setdefault((cls, attr), str(path.relative_to(ROOT)))
                cls = _LINKS.get((cls, attr))
    return used


def test_every_attribute_the_docs_use_exists_and_is_documented_in_the_api_page():
    used = _attributes_used_in_docs()
    # the scan finds them
    assert ("DecodeState", "committed") in used and ("Runner", "n_layers") in used
    unknown = sorted(
        f"{c}.{a} ({f})" for (c, a), f in used.items() if a not in _public_attributes(c)
    )
    assert not unknown, f"the docs use attributes that do not exist: {unknown}"
    missing = sorted(
        f"{c}.{a} ({f})" for (c, a), f in used.items() if not _mentioned(_api_section(c), a)
    )
    assert not missing, f"docs/api/selfspec.md does not document attributes the docs use: {missing}"


def test_every_public_attribute_of_the_hook_types_is_documented_in_the_api_page():
    missing = sorted(
        f"{c}.{a}"
        for c in sorted(set(_VARS.values()))
        for a in _public_attributes(c)
        if not _mentioned(_api_section(c), a)
    )
    assert not missing, f"docs/api/selfspec.md does not document {missing}"


def test_the_attribute_checks_can_fail():
    assert not _mentioned("### `Verdict`\nWhat `selfspec_verify` returns: `accepted`", "bonus")
    assert _mentioned("`(*accepted, bonus)`", "bonus")
    assert "no_such_attribute" not in _public_attributes("Verdict")


def test_the_kits_tools_are_one_extra_away_and_the_docs_say_so():
    line = re.search(
        r"^test = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M
    )  # the extra
    assert line and {re.split(r"[<>=!~ ]", r.strip(' "'))[0] for r in line[1].split(",")} >= {
        "pytest",
        "hypothesis",
    }
    for page in (
        "docs/tutorial-first-plugin.md",
        "docs/testing-plugins.md",
        "plugins/_template/README.md",
    ):
        assert "pip install -e '.[test]'" in (ROOT / page).read_text(encoding="utf-8"), page
    extras = re.search(
        r"-e '\.\[([a-z,]+)\]'", (ROOT / "scripts" / "demo.sh").read_text(encoding="utf-8")
    )
    # the demo installs these
    assert extras and {"bench", "serve", "test"} <= set(extras[1].split(","))


def _environment_table() -> set[str]:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    section = text.split("## Environment", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(SELFSPEC_[A-Z_]+)", section, flags=re.M))


def test_every_environment_variable_the_code_reads_is_in_the_cli_pages_table():
    code = "\n".join(
        p.read_text(encoding="utf-8") for p in (ROOT / "core" / "selfspec").rglob("*.py")
    )
    read = set(re.findall(r"[\"'](SELFSPEC_[A-Z_]+)[\"']", code))
    assert read, "no SELFSPEC_* variable found: the pattern is wrong"
    assert read <= _environment_table(), (
        f"missing from docs/cli.md's Environment table: {read - _environment_table()}"
    )
