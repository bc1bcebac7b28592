"""Every hook of selfspec. Each docstring is the contract an implementation keeps.

Hooks are grouped by phase. The loop (``selfspec._engine.loop``) calls them in this order::

    selfspec_options            once, when the plugin is loaded
    selfspec_commands           once, when the CLI builds its command list
    selfspec_setup              once per decoder, after the model is loaded
    selfspec_start              once per decode, after prefill
      selfspec_propose  ->  selfspec_verify  ->  selfspec_cache  ->  selfspec_update_policy
                                                (repeated until EOS / stop / budget)
    selfspec_end                once per decode

An implementation may accept any subset of a hook's arguments (pluggy's opt-in
arguments); new arguments are only ever added at the end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from selfspec._engine.markers import hookspec

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

    from selfspec._engine.options import Option
    from selfspec._engine.runner import Runner
    from selfspec._engine.types import DecodeState, Draft, Result, Verdict


# ---------------------------------------------------------------------------------------------
# Lifecycle: options, commands, per-model setup
# ---------------------------------------------------------------------------------------------


@hookspec
def selfspec_options(register: Callable[[Option], None]) -> None:
    """Declare the options this plugin accepts (``-o key=value`` on the command line).

    Called once per plugin when it is loaded, before any model exists. Call
    ``register(Option(...))`` once per option; the host validates names (unique across the
    loaded plugins), types, choices and defaults, and rejects unknown or malformed user values
    with a message naming the option. Every plugin's implementation is called; return nothing.
    """


@hookspec
def selfspec_commands(register: Callable[[Any], None]) -> None:
    """Add sub-commands to ``specdec --plugin NAME <command>`` (e.g. ``tune``, ``sweep``).

    Called when the CLI resolves a sub-command for the selected plugin. Call
    ``register(command)`` with a :class:`click.Command`; its name must not clash with a
    built-in command. Every plugin's implementation is called; return nothing. Import heavy
    modules inside the command, not here. The command receives a
    :class:`selfspec.app.CommandContext` as ``ctx.obj`` (``@click.pass_obj``): the user's
    model, decoders for it, the plugin's ``-o`` options.
    """


@hookspec
def selfspec_setup(runner: Runner, options: dict[str, Any], tokenizer: Any) -> None:
    """Prepare for decoding with one model.

    Called once per decoder, after the model is loaded and before the first decode, for every
    plugin. ``runner`` is the :class:`~selfspec._engine.runner.Runner` over the model (its
    ``n_layers``, ``hidden_size``, ``vocab_size``, ``device``, ``dtype``); ``options`` holds the
    validated value of every declared option (defaults filled in); ``tokenizer`` is the
    model's Hugging Face tokenizer when the decoder was given one (the CLI and ``specdec bench``
    always do), else None: a plugin that needs text (an n-gram corpus) must work without it or
    refuse clearly. Load profiles, build compressed layers, allocate buffers here; keep them
    on the plugin instance (one instance per decoder), never in module globals. Raise an
    exception to refuse the model: the host reports it naming the plugin. Runs when the
    decoder is built, outside ``torch.inference_mode`` (the hooks of a decode run inside it).
    """


@hookspec
def selfspec_start(state: DecodeState) -> None:
    """A decode starts: the prompt is prefilled.

    Called once per decode, for every plugin, after prefill: ``state.cache`` holds the prompt
    but its last token (the pending token ``state.pending``), ``state.committed`` is the
    prompt ``[T]``. Reset per-decode state here (n-gram pools from the prompt, thresholds).
    From here to ``selfspec_end`` every hook runs inside ``Decoder.generate``, under
    ``torch.inference_mode()``: tensors made there are inference tensors.
    """


@hookspec
def selfspec_end(state: DecodeState, result: Result) -> None:
    """A decode ended (EOS, a stop token, or the budget).

    Called once per decode that completes, for every plugin, with the final state and the
    result; not called when the decode raised. Observe only: the result is already decided.
    """


# ---------------------------------------------------------------------------------------------
# The decode step: propose -> verify -> cache -> update policy
# ---------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def selfspec_propose(state: DecodeState) -> Draft | None:
    """Propose draft tokens to follow the pending token.

    Called once per step. Stops at the first non-None result; return None to defer (the
    built-in ``vanilla`` implementation is ``trylast`` and proposes an empty draft).

    Return a :class:`~selfspec._engine.types.Draft`: a chain ``tokens`` ``[k]`` (int64, on
    ``state.runner.device``), or a tree (``parents`` ``[k]``, ``parents[i] < i``, ``-1`` = the
    pending token). Invariants the host enforces: ids must be in ``[0, vocab)``, dtype int64,
    on the model's device, and parents well-formed, else the decode stops with an error naming
    the plugin; nodes deeper than ``state.max_draft_depth`` are cut (counted in
    ``stats.truncated_drafts``). The proposer may run the model through ``state.runner`` and
    may write cache slots at or past ``state.length - 1`` (they are overwritten by
    verification); it must not change slots before it.
    """


@hookspec(firstresult=True)
def selfspec_verify(state: DecodeState, draft: Draft) -> Verdict | None:
    """Verify a draft against the full model and decide what to commit.

    Called once per step, after propose. Stops at the first non-None result; return None to
    defer to the built-in greedy verifier (``trylast``): one full-model forward over
    ``[pending, draft...]`` written at cache slot ``state.length - 1`` with a causal or tree
    mask, argmax at every node, the longest path whose tokens match, plus the model's own next
    token (the bonus).

    Override only when verification differs (reusing hidden states, verifying extra branches
    in the same pass); the host's building blocks are ``selfspec.verify_greedy``,
    ``verify_tree``, ``verify_from_layer`` and ``chain_verdict``. A verifier that relies on
    what its proposer left in ``draft.meta`` first checks ``draft.is_from(self)`` (the proposer
    set ``owner=self``) and returns None for any other draft. The returned :class:`~selfspec._engine.types.Verdict` must be what greedy
    decoding of the full model would produce: ``accepted`` is a path of the draft, ``bonus``
    the full model's argmax after it (its token by ``state.pick``: under sampling the argmax of
    the position-keyed perturbed logits); ``kv_slots`` names the cache slots (relative to the
    pending token's slot) holding the full model's keys/values of ``[pending, accepted...]``
    in every layer. Losslessness of the whole system rests on this hook. A verifier that
    has the full model's logits of ``[pending, nodes...]`` passes them on as
    ``Verdict.logits`` (the host's building blocks do), for plugins that learn from them.
    """


@hookspec
def selfspec_cache(state: DecodeState, verdict: Verdict) -> None:
    """Make every cache hold exactly the committed prefix again.

    Called once per step after verify, for every plugin, *before* the host appends the
    committed tokens to ``state.tokens`` (so ``state.length`` is still the old length and
    ``verdict.committed`` the tokens about to be committed). The built-in implementation keeps
    ``verdict.kv_slots`` in the runner's KV cache (crop for a chain, gather for a tree) so it
    holds ``state.length + len(verdict.accepted)`` positions. Plugins update their own caches
    (n-gram pools, compressed-layer caches) here.
    """


@hookspec
def selfspec_update_policy(state: DecodeState, verdict: Verdict) -> None:
    """Adapt after a step: thresholds, layer sets, statistics.

    Called once per step after cache, for every plugin, with ``state.tokens`` already holding
    the newly committed tokens (``state.length`` updated). ``verdict`` is this step's
    :class:`~selfspec._engine.types.Verdict` (``verdict.committed`` may be longer than what was
    committed when EOS or the budget cut it). Nothing returned.

    To learn from the full model's predictions (a drafter, a confidence-based policy), read
    ``verdict.logits`` (``[1 + len(draft), V]``, row 0 after the pending token, row ``i + 1``
    after node ``i``; ``None`` from a verifier that gives none), ``verdict.logit_rows`` (the
    committed positions' rows) or ``verdict.top_k(k)`` here, instead of overriding
    ``selfspec_verify``. The block is the verifying forward's own (no copy) and is freed when
    the step ends: keep what you learn, not the tensor.
    """
