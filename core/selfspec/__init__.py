"""selfspec: a plugin host for lossless self-speculative decoding of Hugging Face causal LMs.

Every name in ``__all__`` is the plugin contract, documented in ``docs/api.md``: plugins import
the engine only from here (``from selfspec import Draft, verify_greedy``), never from a
submodule; their tests may also use :mod:`selfspec.testing`, and their commands
(``selfspec_commands``) the app namespace :mod:`selfspec.app` (model loading, data, the CLI's
command context). Nothing heavy is imported until a name is used: ``import selfspec`` is cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .markers import hookimpl
from .version import __version__

# name -> (module, attribute): the public API, grouped as docs/api.md documents it
_LAZY: dict[str, tuple[str, str]] = {
    # decoding and the values that cross the hook boundary
    "Decoder": ("loop", "Decoder"),
    "DecodeState": ("types", "DecodeState"),
    "Draft": ("types", "Draft"),
    "Verdict": ("types", "Verdict"),
    "Result": ("types", "Result"),
    "Stats": ("types", "Stats"),
    # options
    "Option": ("options", "Option"),
    "OptionError": ("options", "OptionError"),
    "Layers": ("options", "Layers"),
    "check_layers": ("options", "check_layers"),
    "format_layers": ("options", "format_layers"),
    # plugins
    "PluginError": ("plugins", "PluginError"),
    "available_plugins": ("plugins", "available"),
    # the runner
    "Runner": ("runner", "Runner"),
    "KVCache": ("runner", "KVCache"),
    "ForwardOut": ("runner", "ForwardOut"),
    # drafting and verification mechanics
    "skip_layer_draft": ("skipdraft", "skip_layer_draft"),
    "SkipDraft": ("skipdraft", "SkipDraft"),
    "DraftWeights": ("draftweights", "DraftWeights"),
    "DraftWeightsError": ("draftweights", "DraftWeightsError"),
    "draft_weights": ("draftweights", "draft_weights"),
    "draft_vocab": ("draftweights", "draft_vocab"),
    "register_draft_options": ("draftweights", "register_draft_options"),
    "DRAFT_WEIGHTS": ("draftweights", "BACKENDS"),
    "NgramIndex": ("ngram", "NgramIndex"),
    "verify_greedy": ("verification", "verify_greedy"),
    "verify_tree": ("verification", "verify_tree"),
    "ExtraBlock": ("verification", "ExtraBlock"),
    "verify_from_layer": ("verification", "verify_from_layer"),
    "chain_verdict": ("verification", "chain_verdict"),
    "accepted_length": ("verification", "accepted_length"),
    "tree_path": ("verification", "tree_path"),
    "draft_tree": ("drafttree", "draft_tree"),
    "DraftTree": ("drafttree", "DraftTree"),
    "skip_layer_step": ("drafttree", "skip_layer_step"),
    "choose_size": ("drafttree", "choose_size"),
    "register_tree_options": ("drafttree", "register_tree_options"),
    "TreeConfig": ("drafttree", "TreeConfig"),
    "TreeCalibration": ("drafttree", "TreeCalibration"),
    "CostCurve": ("costcurve", "CostCurve"),
    "cost_curve": ("costcurve", "cost_curve"),
    "measure_cost_curve": ("costcurve", "measure_cost_curve"),
    "greedy": ("reference", "greedy"),
    "reference_generate": ("reference", "reference_generate"),
    # sampling
    "Sampling": ("sampling", "Sampling"),
    "sample_tokens": ("sampling", "sample_tokens"),
    "reference_sample": ("sampling", "reference_sample"),
    # per-model artefacts
    "ModelIdentity": ("artefacts", "ModelIdentity"),
    "model_identity": ("artefacts", "model_identity"),
    "ArtefactStore": ("artefacts", "ArtefactStore"),
    "ArtefactError": ("artefacts", "ArtefactError"),
    "resolve_profile": ("artefacts", "resolve_profile"),
    "cache_dir": ("artefacts", "cache_dir"),
}

# names that moved to the app namespace (selfspec.app): they still work from here, with a
# DeprecationWarning, for one release (0.2 removes them)
_MOVED_TO_APP: tuple[str, ...] = (
    "Sample", "DataError", "load_task", "task_names", "corpus_texts", "encode_sample",
    "load_model", "format_prompt", "Settings", "user_errors",
)

__all__ = [
    "__version__",
    "hookimpl",
    "Decoder",
    "DecodeState",
    "Draft",
    "Verdict",
    "Result",
    "Stats",
    "Option",
    "OptionError",
    "Layers",
    "check_layers",
    "format_layers",
    "PluginError",
    "available_plugins",
    "Runner",
    "KVCache",
    "ForwardOut",
    "skip_layer_draft",
    "SkipDraft",
    "DraftWeights",
    "DraftWeightsError",
    "draft_weights",
    "draft_vocab",
    "register_draft_options",
    "DRAFT_WEIGHTS",
    "NgramIndex",
    "verify_greedy",
    "verify_tree",
    "ExtraBlock",
    "verify_from_layer",
    "chain_verdict",
    "accepted_length",
    "tree_path",
    "draft_tree",
    "DraftTree",
    "skip_layer_step",
    "choose_size",
    "register_tree_options",
    "TreeConfig",
    "TreeCalibration",
    "CostCurve",
    "cost_curve",
    "measure_cost_curve",
    "greedy",
    "reference_generate",
    "Sampling",
    "sample_tokens",
    "reference_sample",
    "ModelIdentity",
    "model_identity",
    "ArtefactStore",
    "ArtefactError",
    "resolve_profile",
    "cache_dir",
]  # the names of _LAZY, spelled out for tools (tests/test_api.py checks they agree)

if TYPE_CHECKING:  # pragma: no cover
    from .artefacts import (
        ArtefactError,
        ArtefactStore,
        ModelIdentity,
        cache_dir,
        model_identity,
        resolve_profile,
    )
    from .costcurve import CostCurve, cost_curve, measure_cost_curve
    from .drafttree import (
        DraftTree,
        TreeCalibration,
        TreeConfig,
        choose_size,
        draft_tree,
        register_tree_options,
        skip_layer_step,
    )
    from .draftweights import BACKENDS as DRAFT_WEIGHTS
    from .draftweights import (
        DraftWeights,
        DraftWeightsError,
        draft_vocab,
        draft_weights,
        register_draft_options,
    )
    from .loop import Decoder
    from .ngram import NgramIndex
    from .options import Layers, Option, OptionError, check_layers, format_layers
    from .plugins import PluginError
    from .plugins import available as available_plugins
    from .reference import greedy, reference_generate
    from .runner import ForwardOut, KVCache, Runner
    from .sampling import Sampling, reference_sample, sample_tokens
    from .skipdraft import SkipDraft, skip_layer_draft
    from .types import DecodeState, Draft, Result, Stats, Verdict
    from .verification import (
        ExtraBlock,
        accepted_length,
        chain_verdict,
        tree_path,
        verify_from_layer,
        verify_greedy,
        verify_tree,
    )


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(f".{module}", __name__), attr)
        globals()[name] = value  # once resolved, a plain attribute
        return value
    if name == "app":  # the app namespace, a submodule: ``selfspec.app.load_model``
        import importlib

        return importlib.import_module(".app", __name__)
    if name in _MOVED_TO_APP:
        import importlib
        import warnings

        warnings.warn(f"selfspec.{name} moved to selfspec.app.{name} (the app namespace); the old name "
                      "is removed in selfspec 0.2", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(".app", __name__), name)  # not cached: warns every time
    raise AttributeError(f"module 'selfspec' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
