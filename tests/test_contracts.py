"""The public types whose docstrings are contracts have the hooks' sections.

``Draft``, ``Verdict``, ``DecodeState``, ``Decoder`` and ``PluginSuite`` are what a plugin
author reads most; their docstrings have the same sections as every hookspec (summary, Called,
Args, Returns, Host enforces, optional Notes), checked by the same parser, and Args names every
field of a dataclass.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

import selfspec
from selfspec._engine.contract import hooksdoc
from selfspec.testing import PluginSuite

TYPES = {
    "Draft": selfspec.Draft,
    "Verdict": selfspec.Verdict,
    "DecodeState": selfspec.DecodeState,
    "Decoder": selfspec.Decoder,
    "PluginSuite": PluginSuite,
}


@pytest.mark.parametrize("name", sorted(TYPES))
def test_public_type_docstring_has_the_contract_sections(name):
    summary, found = hooksdoc.sections(inspect.getdoc(TYPES[name]) or "")
    assert summary and "\n" not in summary, f"{name}: one-line summary"
    missing = [s for s in hooksdoc.REQUIRED if not found.get(s)]
    assert not missing, f"{name}: sections missing or empty: {missing}"
    args = set(re.findall(r"^(\w+)[:,]", found["Args"], re.M))
    cls = TYPES[name]
    if dataclasses.is_dataclass(cls):
        fields = {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}
        assert fields <= args | {"timed_s"}, f"{name}: fields not in Args: {sorted(fields - args)}"
    elif name == "Decoder":
        params = set(inspect.signature(cls.__init__).parameters) - {"self"}
        assert params <= args, f"{name}: arguments not in Args: {sorted(params - args)}"


# ---------------------------------------------------------------- code states rules, not history
HISTORY = re.compile(r"\bissue \d+|\bissue-\d+|\b20\d\d-\d\d-\d\d\b")


def _code_files() -> list:
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    roots = [root / "core", root / "tests", root / "plugins"]
    return sorted(
        p
        for r in roots
        for p in r.rglob("*.py")
        if not {"build", ".venv", ".tox"} & set(p.relative_to(root).parts)
    )


def test_code_comments_and_test_names_carry_no_issue_numbers_or_dates():
    """Comments, docstrings and test names state rules and what is tested; what changed goes to
    CHANGELOG.md, dated figures to the lab's logs. (Paths of lab folders named by date may be
    cited; they are data, not history.)"""
    bad = []
    for path in _code_files():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            text = re.sub(r"lab/results/\S+", "", line)  # a cited results folder is a path
            if path.name == "test_contracts.py" and "HISTORY" in line:
                continue
            if HISTORY.search(text):
                bad.append(f"{path.name}:{n}: {line.strip()[:90]}")
    assert not bad, "history in code:\n" + "\n".join(bad)


def test_the_history_guard_sees_an_issue_number():
    assert HISTORY.search("# measured for issue 24") and HISTORY.search("bench of 2026-11-24")
    assert not HISTORY.search("# the kit's reach: long prompts on every architecture")
