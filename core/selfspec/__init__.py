"""selfspec: a plugin host for lossless self-speculative decoding of Hugging Face causal LMs.

This namespace is the **stable plugin contract** (``docs/api.md``): plugins import the engine
only from here (``from selfspec import Draft, verify_greedy``). Three more public namespaces
sit beside it: :mod:`selfspec.provisional` (tuning and calibration helpers whose shape may still
change), :mod:`selfspec.testing` (the kit, for tests) and :mod:`selfspec.app` (model loading,
data, the CLI's command context, for scripts and plugin commands). Everything else is private
by name: the engine lives in ``selfspec._engine``, the app's implementation in
``selfspec.app._*``. Nothing heavy is imported until a name is used: ``import selfspec`` is
cheap.
"""

from __future__ import annotations

from typing import Any

from ._engine.markers import hookimpl
from ._engine.version import __version__

#: The one list of public names: name -> (private module under ``selfspec._engine``, attribute),
#: grouped as docs/api.md documents them. ``__all__`` is derived from it.
_API: dict[str, tuple[str, str]] = {
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
    "WeightFormat": ("types", "WeightFormat"),
    "WeightFormatError": ("formats", "WeightFormatError"),
    "weight_formats": ("formats", "weight_formats"),
    "NgramIndex": ("ngram", "NgramIndex"),
    "verify_greedy": ("verification", "verify_greedy"),
    "verify_tree": ("verification", "verify_tree"),
    "ExtraBlock": ("verification", "ExtraBlock"),
    "verify_from_layer": ("verification", "verify_from_layer"),
    "accepted_length": ("verification", "accepted_length"),
    "draft_tree": ("drafttree", "draft_tree"),
    "DraftTree": ("drafttree", "DraftTree"),
    "skip_layer_step": ("drafttree", "skip_layer_step"),
    "register_tree_options": ("treeconfig", "register_tree_options"),
    "TreeConfig": ("treeconfig", "TreeConfig"),
    "greedy": ("reference", "greedy"),
    "reference_generate": ("reference", "reference_generate"),
    # sampling
    "Sampling": ("sampling", "Sampling"),
    # per-model artefacts
    "ModelIdentity": ("artefacts", "ModelIdentity"),
    "model_identity": ("artefacts", "model_identity"),
    "ArtefactStore": ("artefacts", "ArtefactStore"),
    "ArtefactError": ("artefacts", "ArtefactError"),
    "resolve_profile": ("artefacts", "resolve_profile"),
}

__all__ = ["__version__", "hookimpl", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        import importlib

        module, attr = _API[name]
        value = getattr(importlib.import_module(f"._engine.{module}", __name__), attr)
        globals()[name] = value  # once resolved, a plain attribute
        return value
    if name in ("app", "provisional", "testing"):  # the other public namespaces, as submodules
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'selfspec' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
