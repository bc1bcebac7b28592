"""The losslessness kit: tiny models, Hypothesis strategies and ``assert_lossless``.

Plugin authors prove losslessness in a few lines::

    from hypothesis import given
    from selfspec.testing import assert_lossless, strategies as sst

    @given(arch=sst.archs(), prompt=sst.prompts(), n=sst.lengths())
    def test_lossless(tiny_model_factory, arch, prompt, n):
        assert_lossless(tiny_model_factory(arch), "mine", prompt, n)

Importing this package is cheap: torch, transformers and hypothesis load on first use. The
pytest plugin (:mod:`selfspec.testing.pytest_plugin`) adds fixtures and Hypothesis profiles.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._archs import ARCHS

__all__ = [
    "ARCHS",
    "ComposedSuite",
    "LosslessError",
    "NearTieWarning",
    "PluginSuite",
    "assert_lossless",
    "offloaded_tiny_model",
    "split_device_map",
    "strategies",
    "tiny_config",
    "tiny_model",
]

_LAZY = {
    "tiny_model": "_models",
    "tiny_config": "_models",
    "offloaded_tiny_model": "_models",
    "split_device_map": "_models",
    "assert_lossless": "_lossless",
    "LosslessError": "_lossless",
    "NearTieWarning": "_lossless",
    "PluginSuite": "_suite",
    "ComposedSuite": "_composed",
}


def __getattr__(name: str) -> Any:
    if name == "strategies":
        return importlib.import_module(f"{__name__}.strategies")
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
