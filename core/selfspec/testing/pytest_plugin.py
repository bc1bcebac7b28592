"""The kit as a pytest plugin (entry point ``pytest11: selfspec``).

Imports nothing heavy: torch, transformers and hypothesis load inside hooks and fixtures.

Fixtures:

* ``tiny_model_factory(arch, dtype=torch.float64, seed=0, **overrides)``: a tiny random model,
  built once per session and argument set (treat it as read-only; deep-copy to modify);
* ``offloaded_model_factory(arch, dtype=torch.float64, seed=0, **overrides)``: the same tiny
  model dispatched by accelerate over CPU memory and disk
  (:func:`selfspec.testing.offloaded_tiny_model`, its offload folder in the session's temporary
  directory), built once per session and argument set;
* ``selfspec_arch``: parametrizes a test over every architecture in ``ARCHS``;
* ``selfspec_device``: parametrizes a test over ``"cpu"`` and, when a GPU is present, ``"cuda"``.

Hypothesis profiles: ``selfspec-ci`` (derandomized, no deadline, few examples), ``selfspec-dev`` (no
deadline, more examples, random) and ``selfspec-release`` (no deadline, five times
``selfspec-dev``'s examples, random: before a release, never loaded unless named). They are loaded
only in a suite that uses the kit, so that the plugin is inert in any other project installed beside
selfspec: when the ini option ``selfspec_kit = true`` is set, or as soon as a test file (or
conftest) about to be imported mentions ``selfspec.testing`` or one of the kit's fixtures. Then the
profile named by the environment variable ``HYPOTHESIS_PROFILE`` is loaded; otherwise
``selfspec-ci`` when ``CI`` is set and ``selfspec-dev`` when not. ``--hypothesis-profile`` on the
command line wins over both. A name that no conftest registers either stops the run with a usage
error.

``--selfspec-coverage`` prints what every :class:`~selfspec.testing.PluginSuite` property
test exercised (its coverage buckets) at the end of the run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from selfspec.testing._archs import ARCHS

CI_PROFILE = "selfspec-ci"
DEV_PROFILE = "selfspec-dev"
#: The deep profile for a release check (random, 300 examples):
#: ``HYPOTHESIS_PROFILE=selfspec-release``.
RELEASE_PROFILE = "selfspec-release"
_PENDING_PROFILE = pytest.StashKey[str]()  # a profile name not registered at configure time
_ACTIVE = pytest.StashKey[bool]()  # the kit's profiles are loaded in this session
#: Text that marks a file as using the kit (checked before the file is imported).
_MARKERS = (
    b"selfspec.testing",
    b"tiny_model_factory",
    b"offloaded_model_factory",
    b"selfspec_arch",
    b"selfspec_device",
)


def devices() -> list[str]:
    """``["cpu"]``, plus ``"cuda"`` when ``torch.cuda.is_available()``."""
    import torch

    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def profile_name() -> str:
    """The Hypothesis profile the environment asks for."""
    return os.environ.get("HYPOTHESIS_PROFILE") or (
        CI_PROFILE if os.environ.get("CI") else DEV_PROFILE
    )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "selfspec_kit",
        "load the selfspec kit's Hypothesis profiles for this suite",
        type="bool",
        default=False,
    )
    parser.addoption(
        "--selfspec-coverage",
        action="store_true",
        default=False,
        help="print what each selfspec PluginSuite property test exercised",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "selfspec: tests of the selfspec losslessness kit")
    if config.getini("selfspec_kit"):
        activate(config)


def pytest_collect_file(file_path: Any, parent: pytest.Collector) -> None:
    """Before a test file that uses the kit is imported, load the profiles (so a module-level
    ``@given`` gets them)."""
    config = parent.config
    if config.stash.get(_ACTIVE, False) or file_path.suffix != ".py":
        return
    try:
        text = file_path.read_bytes()
    except OSError:
        return
    if any(m in text for m in _MARKERS):
        activate(config)
        _load_pending(config)  # conftests are loaded by now: an unknown name is an error now


def activate(config: pytest.Config) -> None:
    """Register the kit's Hypothesis profiles and load the one the environment asks for."""
    if config.stash.get(_ACTIVE, False):
        return
    config.stash[_ACTIVE] = True
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:  # the kit's strategies need hypothesis; the fixtures do not
        return
    quiet = [HealthCheck.too_slow, HealthCheck.data_too_large]
    settings.register_profile(
        CI_PROFILE,
        derandomize=True,
        deadline=None,
        max_examples=15,
        suppress_health_check=quiet,
        print_blob=True,
    )
    settings.register_profile(
        DEV_PROFILE, deadline=None, max_examples=60, suppress_health_check=quiet, print_blob=True
    )
    # random even where Hypothesis's own default profile derandomizes (its "ci" one, under CI=...)
    settings.register_profile(
        RELEASE_PROFILE,
        derandomize=False,
        deadline=None,
        max_examples=300,
        suppress_health_check=quiet,
        print_blob=True,
    )
    if config.getoption("hypothesis_profile", default=None):
        return  # hypothesis's own plugin loads the profile given on the command line
    name = profile_name()
    try:
        settings.load_profile(name)
    except Exception:  # maybe a profile of the project's own, registered in its conftest later
        config.stash[_PENDING_PROFILE] = name


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Load a profile that did not exist at configure time (registered by a conftest), or
    stop with a usage error: an unknown name must not silently run Hypothesis's defaults."""
    _load_pending(session.config)


def _load_pending(config: pytest.Config) -> None:
    name = config.stash.get(_PENDING_PROFILE, None)
    if name is None:
        return
    del config.stash[_PENDING_PROFILE]
    from hypothesis import settings

    try:
        settings.load_profile(name)
    except Exception as exc:
        raise pytest.UsageError(
            f"HYPOTHESIS_PROFILE={name!r} names no registered Hypothesis profile (selfspec "
            f"registers {CI_PROFILE!r} and {DEV_PROFILE!r}; register others in a conftest.py)"
        ) from exc


def pytest_report_header(config: pytest.Config) -> str | None:
    if not config.getini("selfspec_kit"):
        return None  # inert outside the kit's suites (they are known only during collection)
    return f"selfspec: hypothesis profile from environment {profile_name()!r}"


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or not config.stash.get(_ACTIVE, False) or config.getini("selfspec_kit"):
        return
    if config.option.verbose >= 0:
        from hypothesis import settings

        reporter.write_line(f"selfspec: hypothesis profile {settings._current_profile!r}")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if not config.getoption("selfspec_coverage", default=False):
        return
    from selfspec.testing._coverage import REGISTRY

    terminalreporter.section("selfspec coverage")
    ran = [
        cov for cov in REGISTRY.values() if cov.examples
    ]  # a suite's counters exist before it runs
    for cov in ran:
        terminalreporter.write_line(cov.report())
    if not ran:
        terminalreporter.write_line("no PluginSuite property test ran")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "selfspec_arch" in metafunc.fixturenames:
        metafunc.parametrize("selfspec_arch", ARCHS)
    if "selfspec_device" in metafunc.fixturenames:
        metafunc.parametrize("selfspec_device", devices())


@pytest.fixture(scope="session")
def tiny_model_factory() -> Callable[..., Any]:
    """``factory(arch, *, dtype=torch.float64, seed=0, device="cpu", **overrides)`` -> model,
    cached per argument set for the session. A cached model whose weights were changed since
    it was built (value for value), or that gained forward hooks, is built afresh: one
    suite's edit never reaches the next."""
    built: dict[Any, Any] = {}

    def factory(arch: str, **kwargs: Any) -> Any:
        from selfspec._engine.contract.audit import WeightGuard
        from selfspec.testing._models import tiny_model

        key = (arch, tuple(sorted((k, repr(v)) for k, v in kwargs.items())))
        if key in built:
            model, guard = built[key]
            if guard.changed() is None and not _hooked(model):
                return model
        model = tiny_model(arch, **kwargs)
        built[key] = (model, WeightGuard(model, exact=True))
        return model

    return factory


@pytest.fixture(scope="session")
def offloaded_model_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Any]:
    """``factory(arch, *, dtype=torch.float64, seed=0, **overrides)`` -> a tiny model split
    over CPU memory and disk by accelerate (:func:`selfspec.testing.split_device_map`),
    cached per argument set for the session; treat it as read-only."""
    built: dict[Any, Any] = {}

    def factory(arch: str, **kwargs: Any) -> Any:
        from selfspec.testing._models import offloaded_tiny_model

        key = (arch, tuple(sorted((k, repr(v)) for k, v in kwargs.items())))
        if key not in built:
            folder = tmp_path_factory.mktemp(f"offload-{arch}")
            built[key] = offloaded_tiny_model(arch, folder, **kwargs)
        return built[key]

    return factory


def _hooked(model: Any) -> bool:
    """Any forward (pre-)hook on the model's modules (a fresh tiny model has none)."""
    return any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
