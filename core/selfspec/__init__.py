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
from ._engine.contract.version import __version__

#: The one list of public names: name -> (private module under ``selfspec._engine``, attribute),
#: grouped as docs/api/selfspec.md shows them: scripts/api_docs.py reads each ``# group``
#: comment and each entry's ``#:`` comment. ``__all__`` is derived from it.
_API: dict[str, tuple[str, str]] = {
    # decoding and the values that cross the hook boundary
    "Decoder": ("contract.loop", "Decoder"),
    #: A position is an index in prompt + output: in :meth:`DecodeState.pick` the row of the
    #: token at position ``p`` predicts position ``p + 1``. Every host verifier picks with it; a
    #: drafter that takes tokens from model logits picks with it too (``pick=state.pick`` for
    #: :func:`skip_layer_draft`); drafts from text need nothing. Thanks to :meth:`timed` a plugin
    #: never corrects the host's bookkeeping (``timed_s`` is the host's total of the decode's
    #: timed blocks). ``generated`` counts the tokens committed after the prompt; ``prior`` is how
    #: a composition's later members extend the earlier ones' draft
    #: ([composition.md](docs/composition.md), "Extending").
    "DecodeState": ("contract.types", "DecodeState"),
    #: A tree is built with the constructor, ``Draft(tokens, parents)``
    #: ([tree-drafts.md](docs/tree-drafts.md)); an empty draft still reaches ``selfspec_verify``
    #: ([empty drafts](docs/faq.md#is-selfspec_verify-called-for-an-empty-draft)).
    #: :meth:`Draft.best_nodes` gives the node indices of :meth:`Draft.best_path`. The convention
    #: for "this draft is mine": a plugin that leaves data in ``meta`` for its own
    #: ``selfspec_verify`` proposes with ``owner=self`` and its verifier starts with ``if not
    #: draft.is_from(self): return None``; the host keeps ``owner`` and ``meta`` when it cuts a
    #: draft past the depth or cache limits, so compare ``len(draft)`` with what was proposed
    #: when it matters.
    "Draft": ("contract.types", "Draft"),
    #: Every host verifier fills ``logits`` (:func:`verify_greedy`, :func:`verify_tree`, which
    #: leaves out its extra rows, :func:`verify_from_layer`,
    #: :func:`selfspec.provisional.chain_verdict`); it is ``None`` when a plugin's own verifier
    #: builds a ``Verdict`` without it. ``greedy(verdict.logits[list(verdict.logit_rows)])`` is
    #: ``verdict.committed``; :meth:`Verdict.slots` is ``kv_slots``, or ``0..len(accepted)`` when
    #: ``None``. A plugin that learns from the full model's predictions reads the logits in
    #: ``selfspec_update_policy``, with no need to override ``selfspec_verify``
    #: ([a plugin that learns from them](docs/faq.md#a-plugin-that-learns-from-verification)).
    #: They cost nothing when nobody reads them: a reference to the block the forward made
    #: anyway (no copy, no extra LM-head rows), freed before the next forward because the loop
    #: drops the verdict when the step ends, after ``selfspec_update_policy``
    #: (``tests/test_author_faq_learner.py`` checks both).
    "Verdict": ("contract.types", "Verdict"),
    #: ``prompt_ids``; ``output_ids``, the new tokens only; ``stats``, a :class:`Stats`; ``text``
    #: (needs a tokenizer); ``near_ties``, set by the kit's ``assert_lossless``: 1 when a
    #: float32/bf16 output left the reference at a near-tie.
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
    #: For plugins that build their own variants of :meth:`Runner.head` and
    #: :meth:`Runner.embed` (exit heads, compressed copies, a draft vocabulary), their parts:
    #: :attr:`Runner.final_norm` and :meth:`Runner.norm`, :attr:`Runner.lm_head`,
    #: :attr:`Runner.logit_softcap` and :meth:`Runner.softcap`, :attr:`Runner.embedding`;
    #: ``head(h) == softcap(lm_head(norm(h)))``. Read them, never modify them; a plugin never
    #: reads ``runner.adapter``: its shape is the host's business and may change. Plain
    #: attributes: ``model``, ``config``, ``layers`` (the model's own decoder layers),
    #: ``n_layers``, ``hidden_size`` (``H``), ``vocab_size`` (``V``), ``windows`` (each layer's
    #: sliding-window size, ``None`` for full attention), ``weight_layout`` (what ``auto``
    #: resolved to: ``"packed"``, ``"model"``, ...), ``exact`` (``Runner(model, exact=True)``:
    #: every row of a forward bitwise that row's one-token forward;
    #: [losslessness.md](docs/losslessness.md)); ``lean_drafts`` (default ``True``) runs draft
    #: weights' layers of Llama, Mistral, Qwen2 and Qwen3 models as lean blocks, the modules'
    #: own tensor operations without their calls, bitwise the same logits (``False``: through
    #: the modules; [architecture.md](docs/architecture.md)).
    #:
    #: A model accelerate dispatched over devices, CPU memory and disk runs as placed:
    #: :attr:`Runner.placement` says where its layers went (a plugin that cannot support a
    #: placement reads it at setup and raises a ``PluginError`` saying so), ``layer_devices``
    #: and ``layer_layouts`` where each layer runs and how, and :meth:`Runner.loaded` gives an
    #: offloaded module's weights values while a plugin reads them at setup. What
    #: :meth:`Runner.forward` returns and what ``start`` means, with code:
    #: [the FAQ](docs/faq.md#what-runnerforward-returns).
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
    #: A frozen dataclass ([weight-formats.md](docs/weight-formats.md)): a format's ``name`` is
    #: never ``auto``; ``unsupported`` defaults to running everywhere, ``auto`` to ``True``
    #: (``auto`` measures it where it runs), ``gated`` to ``False`` (``auto`` runs it only
    #: through the agreement gate). :meth:`WeightFormat.why_not` is ``unsupported`` with a
    #: failure inside it reported as the reason.
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
