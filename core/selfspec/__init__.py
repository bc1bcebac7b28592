"""selfspec: a plugin host for lossless self-speculative decoding of Hugging Face causal LMs.

This namespace is the **stable plugin contract** (``docs/api/selfspec.md``, generated from these
docstrings): plugins import the engine only from here (``from selfspec import Draft,
verify_greedy``). Three more public namespaces sit beside it: :mod:`selfspec.provisional`
(tuning and calibration helpers whose shape may still change), :mod:`selfspec.testing` (the
kit, for tests) and :mod:`selfspec.app` (model loading, data, the CLI's command context, for
scripts and plugin commands). Everything else is private by name: the engine lives in
``selfspec._engine``, the app's implementation in ``selfspec.app._*``. Nothing heavy is imported
until a name is used: ``import selfspec`` is cheap.

The drafting and verification mechanics are pieces several methods share, written once in the
host. Each verifier here returns exactly the verdict greedy decoding of the full model gives
(the contract of ``selfspec_verify``); in a sampling decode "the full model's token" is
``state.pick`` of its logits, so the same verifiers are lossless under sampling. The hooks are
in [hooks.md](docs/hooks.md); composed and tree drafts in [composition.md](docs/composition.md)
and [tree-drafts.md](docs/tree-drafts.md); what authors asked in [faq.md](docs/faq.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._engine.contract.lazy import lazy_namespace

#: The pluggy marker of hook implementations: ``@selfspec.hookimpl`` (or
#: ``@selfspec.hookimpl(trylast=True)``, ``wrapper=True``, ...) on a method (or module-level
#: function) named after a hook ([hooks.md](docs/hooks.md)).
from ._engine.contract.markers import hookimpl

#: The host's version string.
from ._engine.tuning.version import __version__

#: The one list of public names: name -> (private module under ``selfspec._engine``, attribute),
#: grouped as docs/api/selfspec.md shows them: scripts/api_docs.py reads each ``# group``
#: comment and each entry's ``#:`` comment. ``__all__`` is derived from it.
_API: dict[str, tuple[str, str]] = {
    # decoding and the values that cross the hook boundary
    "Decoder": ("contract.loop", "Decoder"),
    "DecodeState": ("contract.types", "DecodeState"),
    "Draft": ("contract.types", "Draft"),
    "Verdict": ("contract.types", "Verdict"),
    "Result": ("contract.types", "Result"),
    "Stats": ("contract.types", "Stats"),
    # options
    "Option": ("contract.options", "Option"),
    "OptionError": ("contract.options", "OptionError"),
    "Layers": ("contract.options", "Layers"),
    "check_layers": ("contract.options", "check_layers"),
    "format_layers": ("contract.options", "format_layers"),
    # plugins
    "PluginError": ("contract.plugins", "PluginError"),
    "available_plugins": ("contract.plugins", "available"),
    # the runner
    "Runner": ("runner", "Runner"),
    "KVCache": ("runner", "KVCache"),
    "ForwardOut": ("runner", "ForwardOut"),
    # drafting and verification mechanics
    "skip_layer_draft": ("drafting.skipdraft", "skip_layer_draft"),
    "SkipDraft": ("drafting.skipdraft", "SkipDraft"),
    "DraftWeights": ("drafting.draftweights", "DraftWeights"),
    "DraftWeightsError": ("drafting.draftweights", "DraftWeightsError"),
    "draft_weights": ("drafting.draftweights", "draft_weights"),
    "draft_vocab": ("drafting.draftweights", "draft_vocab"),
    "register_draft_options": ("drafting.draftweights", "register_draft_options"),
    #: The backend names, ``("auto", "none", "int8", ...)``: ``auto`` and every registered draft
    #: format, read from the registry each time it is used (a sequence), so a format a package
    #: registers is a valid choice: the ``choices`` of a plugin's ``draft_weights`` option
    #: ([weight-formats.md](docs/weight-formats.md)).
    "DRAFT_WEIGHTS": ("drafting.draftweights", "BACKENDS"),
    "WeightFormat": ("runner.weightformat", "WeightFormat"),
    "WeightFormatError": ("runner.formats", "WeightFormatError"),
    "weight_formats": ("runner.formats", "weight_formats"),
    "NgramIndex": ("drafting.ngram", "NgramIndex"),
    "verify_greedy": ("contract.verification", "verify_greedy"),
    "verify_tree": ("contract.verification", "verify_tree"),
    "ExtraBlock": ("contract.verification", "ExtraBlock"),
    "verify_from_layer": ("contract.verification", "verify_from_layer"),
    "accepted_length": ("contract.verification", "accepted_length"),
    "draft_tree": ("drafting.drafttree", "draft_tree"),
    "DraftTree": ("drafting.drafttree", "DraftTree"),
    "skip_layer_step": ("drafting.drafttree", "skip_layer_step"),
    "register_tree_options": ("drafting.treeconfig", "register_tree_options"),
    "TreeConfig": ("drafting.treeconfig", "TreeConfig"),
    "greedy": ("contract.reference", "greedy"),
    "reference_generate": ("contract.reference", "reference_generate"),
    # lossless sampling
    "Sampling": ("contract.sampling", "Sampling"),
    # per-model artefacts
    "ModelIdentity": ("runner.identity", "ModelIdentity"),
    "model_identity": ("runner.identity", "model_identity"),
    "ArtefactStore": ("tuning.artefacts", "ArtefactStore"),
    "ArtefactError": ("tuning.artefacts", "ArtefactError"),
    "resolve_profile": ("tuning.artefacts", "resolve_profile"),
}

__all__ = ["__version__", "hookimpl", *_API]


__getattr__, __dir__ = lazy_namespace(
    __name__,
    {name: (f"selfspec._engine.{module}", attr) for name, (module, attr) in _API.items()},
    globals(),
    submodules=("app", "provisional", "testing"),
)

if TYPE_CHECKING:  # generated by scripts/typed_face.py: every public name's real type
    from selfspec._engine.contract.loop import Decoder as Decoder
    from selfspec._engine.contract.options import Layers as Layers
    from selfspec._engine.contract.options import Option as Option
    from selfspec._engine.contract.options import OptionError as OptionError
    from selfspec._engine.contract.options import check_layers as check_layers
    from selfspec._engine.contract.options import format_layers as format_layers
    from selfspec._engine.contract.plugins import PluginError as PluginError
    from selfspec._engine.contract.plugins import available as available_plugins  # noqa: F401 (a public name under another)
    from selfspec._engine.contract.reference import greedy as greedy
    from selfspec._engine.contract.reference import reference_generate as reference_generate
    from selfspec._engine.contract.sampling import Sampling as Sampling
    from selfspec._engine.contract.types import DecodeState as DecodeState
    from selfspec._engine.contract.types import Draft as Draft
    from selfspec._engine.contract.types import Result as Result
    from selfspec._engine.contract.types import Stats as Stats
    from selfspec._engine.contract.types import Verdict as Verdict
    from selfspec._engine.contract.verification import ExtraBlock as ExtraBlock
    from selfspec._engine.contract.verification import accepted_length as accepted_length
    from selfspec._engine.contract.verification import verify_from_layer as verify_from_layer
    from selfspec._engine.contract.verification import verify_greedy as verify_greedy
    from selfspec._engine.contract.verification import verify_tree as verify_tree
    from selfspec._engine.drafting.drafttree import DraftTree as DraftTree
    from selfspec._engine.drafting.drafttree import draft_tree as draft_tree
    from selfspec._engine.drafting.drafttree import skip_layer_step as skip_layer_step
    from selfspec._engine.drafting.draftweights import BACKENDS as DRAFT_WEIGHTS  # noqa: F401 (a public name under another)
    from selfspec._engine.drafting.draftweights import DraftWeights as DraftWeights
    from selfspec._engine.drafting.draftweights import DraftWeightsError as DraftWeightsError
    from selfspec._engine.drafting.draftweights import draft_vocab as draft_vocab
    from selfspec._engine.drafting.draftweights import draft_weights as draft_weights
    from selfspec._engine.drafting.draftweights import (
        register_draft_options as register_draft_options,
    )
    from selfspec._engine.drafting.ngram import NgramIndex as NgramIndex
    from selfspec._engine.drafting.skipdraft import SkipDraft as SkipDraft
    from selfspec._engine.drafting.skipdraft import skip_layer_draft as skip_layer_draft
    from selfspec._engine.drafting.treeconfig import TreeConfig as TreeConfig
    from selfspec._engine.drafting.treeconfig import register_tree_options as register_tree_options
    from selfspec._engine.runner import ForwardOut as ForwardOut
    from selfspec._engine.runner import KVCache as KVCache
    from selfspec._engine.runner import Runner as Runner
    from selfspec._engine.runner.formats import WeightFormatError as WeightFormatError
    from selfspec._engine.runner.formats import weight_formats as weight_formats
    from selfspec._engine.runner.identity import ModelIdentity as ModelIdentity
    from selfspec._engine.runner.identity import model_identity as model_identity
    from selfspec._engine.runner.weightformat import WeightFormat as WeightFormat
    from selfspec._engine.tuning.artefacts import ArtefactError as ArtefactError
    from selfspec._engine.tuning.artefacts import ArtefactStore as ArtefactStore
    from selfspec._engine.tuning.artefacts import resolve_profile as resolve_profile
# end of the generated block
