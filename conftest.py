"""Repository-wide test settings: which ``slow`` tests run.

A test marked ``@pytest.mark.slow`` loads a real model (the embedded SmolLM2, converted once
into the user cache) or installs and runs a nested suite. ``--slow`` (or ``SELFSPEC_SLOW``)
picks which of them run:

* ``all`` (the default): every one;
* ``ci``: the bounded subset marked ``@pytest.mark.slow(ci=True)``, the few that prove the
  real-model paths end to end; ``scripts/test.sh`` (and so CI) runs this;
* ``none``: none.

The others are reported as skipped, with the way to run them.
"""

from __future__ import annotations

import os

import pytest

SLOW_MODES = ("all", "ci", "none")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow",
        choices=SLOW_MODES,
        default=os.environ.get("SELFSPEC_SLOW") or "all",
        help="which @pytest.mark.slow tests run: all (default), ci (the bounded subset "
        "marked slow(ci=True)), none; also $SELFSPEC_SLOW",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mode = config.getoption("--slow")
    if mode not in SLOW_MODES:
        raise pytest.UsageError(f"SELFSPEC_SLOW={mode!r}: use one of {', '.join(SLOW_MODES)}")
    if mode == "all":
        return
    for item in items:
        marker = item.get_closest_marker("slow")
        if marker is None or (mode == "ci" and marker.kwargs.get("ci")):
            continue
        item.add_marker(
            pytest.mark.skip(reason=f"slow test not in --slow={mode}; run it with --slow=all")
        )
