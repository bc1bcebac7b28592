"""selfspec.provisional: tuning and calibration helpers, public but not yet stable.

The names here are documented (``docs/api.md``, "The provisional namespace") and tested like the
stable contract, but their signatures may change in a minor release while the tuning and
calibration methods they serve settle: a plugin that uses one pins the host's minor version.
A name graduates to the top-level ``selfspec`` namespace once plugins rely on it; it is never
removed without a release of notice. Nothing heavy is imported until a name is used.
"""

from __future__ import annotations

from typing import Any

#: The one list of provisional names: name -> (private module under ``selfspec._engine``,
#: attribute). ``__all__`` is derived from it.
_API: dict[str, tuple[str, str]] = {
    # draft trees: sizing by the machine's cost curve, and their calibration
    "choose_size": ("treecost", "choose_size"),
    "TreeCalibration": ("treeconfig", "TreeCalibration"),
    "CostCurve": ("costcurve", "CostCurve"),
    "cost_curve": ("costcurve", "cost_curve"),
    "measure_cost_curve": ("costcurve", "measure_cost_curve"),
    # verification helpers below the verifiers
    "chain_verdict": ("verification", "chain_verdict"),
    "tree_path": ("verification", "tree_path"),
    # sampling helpers below Sampling
    "sample_tokens": ("sampling", "sample_tokens"),
    "reference_sample": ("sampling", "reference_sample"),
    # the cache directory and the corpus a draft vocabulary is ranked by
    "cache_dir": ("artefacts", "cache_dir"),
    "set_vocab_corpus": ("corpus", "set_vocab_corpus"),
}

__all__ = [*_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        import importlib

        module, attr = _API[name]
        value = getattr(importlib.import_module(f"selfspec._engine.{module}"), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'selfspec.provisional' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
