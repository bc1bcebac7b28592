"""Every hook of selfspec. Each docstring is the contract an implementation keeps.

Hooks are grouped by phase. The loop (``selfspec._engine.contract.loop``) calls them in this order::

    selfspec_options            once, when the plugin is loaded
    selfspec_commands           once, when the CLI builds its command list
    selfspec_weight_formats     once per process, from every package that ships formats
    selfspec_setup              once per decoder, after the model is loaded
    selfspec_start              once per decode, after prefill
      selfspec_propose  ->  selfspec_verify  ->  selfspec_cache  ->  selfspec_update_policy
                                                (repeated until EOS / stop / budget)
    selfspec_end                once per decode

An implementation may accept any subset of a hook's arguments (pluggy's opt-in
arguments); new arguments are only ever added at the end.

Composed drafts (``--plugin lookup+selfsd``): the host's composer calls each member's
``selfspec_options`` (names prefixed ``MEMBER.``), ``selfspec_setup``, ``selfspec_start``,
``selfspec_propose``, ``selfspec_update_policy`` (with the verdict of the member's own draft)
and ``selfspec_end``; never its ``selfspec_verify`` or ``selfspec_cache``. A plugin with either
of those joins a composition only when it declares ``composable = True`` on its class (or
module): it decodes correctly when they are not called. ``composable = False`` refuses always.

Every docstring has the same sections, in this order: a one-line summary; **Called** (when,
for which plugins, firstresult or not); **Args** (each argument, with shapes and dtypes);
**Returns**; **Host enforces** (what the host checks and what it does when the rule is
broken); **Notes** (optional). ``docs/hooks.md`` renders them and ``tests/test_hooks_documented.py``
checks each section.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from selfspec._engine.contract.markers import hookspec

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

    from selfspec._engine.contract.options import Option
    from selfspec._engine.contract.types import DecodeState, Draft, Result, Verdict
    from selfspec._engine.runner import Runner
    from selfspec._engine.runner.weightformat import WeightFormat


# ---------------------------------------------------------------------------------------------
# Lifecycle: options, commands, per-model setup
# ---------------------------------------------------------------------------------------------


@hookspec
def selfspec_options(register: Callable[[Option], None]) -> None:
    """Declare the options this plugin accepts (``-o key=value`` on the command line).

    Called:
        Once per plugin when it is loaded, before any model exists; every plugin's
        implementation is called.

    Args:
        register: call ``register(Option(...))`` once per option.

    Returns:
        Nothing.

    Host enforces:
        Option names are unique across the loaded plugins, and types, choices and defaults
        are valid (else a ``PluginError`` at load). Unknown or malformed user values are an
        ``OptionError`` naming the option; the plugin only ever sees validated values.
    """


@hookspec
def selfspec_commands(register: Callable[[Any], None]) -> None:
    """Add sub-commands to ``specdec --plugin NAME <command>`` (e.g. ``tune``, ``sweep``).

    Called:
        When the CLI resolves a sub-command for the selected plugin; every plugin's
        implementation is called.

    Args:
        register: call ``register(command)`` with a :class:`click.Command`.

    Returns:
        Nothing.

    Host enforces:
        A command's name must not clash with a built-in command (``run``, ``plugins``,
        ``check``, ``bench``, ...): a clash is a one-line CLI error naming the plugin.

    Notes:
        Import heavy modules inside the command, not here. The command receives a
        :class:`selfspec.app.CommandContext` as ``ctx.obj`` (``@click.pass_obj``): the user's
        model, decoders for it, the plugin's ``-o`` options.
    """


@hookspec
def selfspec_weight_formats(register: Callable[[WeightFormat], None]) -> None:
    """Add weight formats: ways to hold a linear layer's weights (a layout or a draft copy).

    Called:
        Once per process, the first time a format is looked up; every plugin that ships
        formats is called: the host's built-in formats and every installed package whose
        module is named in the ``selfspec.weight_formats`` entry-point group, whichever method
        plugin runs. Not called on method plugins' managers.

    Args:
        register: call ``register(selfspec.WeightFormat(name, role, summary, build, ...))``
            once per format. ``build(weight, bias)`` gets a ``[out, in]`` weight in the model's
            dtype and returns a module mapping ``[..., in]`` to ``[..., out]`` in the caller's
            dtype.

    Returns:
        Nothing.

    Host enforces:
        Names are lower case, unique across every package and never ``auto``; the role is
        ``"layout"`` or ``"draft"``; anything else is a ``PluginError`` naming the package.
        A format whose ``unsupported(device, dtype)`` gives a reason is refused for that model
        with the reason, and ``auto`` never measures it there. A layout must compute the
        model's own product in its dtype (the kit's losslessness tests hold it to that); a
        draft copy may be any precision.

    Notes:
        The format then appears in ``--weight-layout`` or ``-o draft_weights=`` choices, in
        ``auto``'s candidates (``auto=True``) and in ``specdec plugins``. Import heavy
        libraries inside ``build`` and ``unsupported``, not at module import.
    """


@hookspec
def selfspec_setup(runner: Runner, options: dict[str, Any], tokenizer: Any) -> None:
    """Prepare for decoding with one model.

    Called:
        Once per decoder, after the model is loaded and before the first decode, for every
        plugin; outside ``torch.inference_mode`` (the hooks of a decode run inside it).

    Args:
        runner: the :class:`selfspec.Runner` over the model (``n_layers``, ``hidden_size``,
            ``vocab_size``, ``device``, ``dtype``, the accessors).
        options: the validated value of every declared option, defaults filled in.
        tokenizer: the model's Hugging Face tokenizer when the decoder was given one (the CLI
            and ``specdec bench`` always do), else None.

    Returns:
        Nothing. Load profiles, build compressed layers, allocate buffers here; keep them on
        the plugin instance (one instance per decoder), never in module globals.

    Host enforces:
        An exception refuses the model: the host raises it as a ``PluginError`` naming the
        plugin. Under audit, the model's weights must be unchanged after setup.

    Notes:
        A plugin that needs text (an n-gram corpus) must work without a tokenizer or refuse
        clearly.
    """


@hookspec
def selfspec_start(state: DecodeState) -> None:
    """A decode starts: the prompt is prefilled.

    Called:
        Once per decode, for every plugin, after prefill and before the first step.

    Args:
        state: the decode's :class:`selfspec.DecodeState`; ``state.cache`` holds the prompt
            but its last token (the pending token ``state.pending``), ``state.committed`` is
            the prompt ``[T]`` int64.

    Returns:
        Nothing. Reset per-decode state here (n-gram pools from the prompt, thresholds).

    Host enforces:
        Nothing beyond the step checks that follow.

    Notes:
        From here to ``selfspec_end`` every hook runs inside ``Decoder.generate``, under
        ``torch.inference_mode()``: tensors made there are inference tensors.
    """


@hookspec
def selfspec_end(state: DecodeState, result: Result) -> None:
    """A decode ended (EOS, a stop token, or the budget).

    Called:
        Once per decode that completes, for every plugin; not called when the decode raised.

    Args:
        state: the final :class:`selfspec.DecodeState`.
        result: the decode's :class:`selfspec.Result` (``output_ids``, ``stats``).

    Returns:
        Nothing: observe only, the result is already decided.

    Host enforces:
        Nothing: changes to ``result`` are not checked, and must not be made.
    """


# ---------------------------------------------------------------------------------------------
# The decode step: propose -> verify -> cache -> update policy
# ---------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def selfspec_propose(state: DecodeState) -> Draft | None:
    """Propose draft tokens to follow the pending token.

    Called:
        Once per step. Stops at the first non-None result; return None to defer (the
        built-in ``vanilla`` implementation is ``trylast`` and proposes an empty draft).

    Args:
        state: the step's :class:`selfspec.DecodeState`; the cache holds ``state.length - 1``
            positions, ``state.pending`` is the last committed id.

    Returns:
        A :class:`selfspec.Draft`: a chain (``tokens`` ``[k]`` int64 on
        ``state.runner.device``) or a tree (``parents`` ``[k]`` int64, ``parents[i] < i``,
        ``-1`` = the pending token); ``Draft.empty(device, owner=self)`` asks for a plain step
        (``selfspec_verify`` is still called with it).

    Host enforces:
        A ``Draft`` instance; ``tokens`` 1-D int64 on the model's device with ids in
        ``[0, vocab)``; ``parents`` int64, shaped like ``tokens``, ``-1 <= parents[i] < i``;
        ``probs`` (optional) floating, shaped like ``tokens``, in ``[0, 1]``; else the decode
        stops with a ``PluginError`` naming the plugin. Nodes deeper than
        ``state.max_draft_depth`` or past the cache's spare room are cut (counted in
        ``stats.truncated_drafts``; ``owner`` and ``meta`` kept, ``probs`` cut with the nodes).

    Notes:
        The proposer may run the model through ``state.runner`` and may write cache slots at
        or past ``state.length - 1`` (verification overwrites them); it must not change slots
        before it (the audit checks). In a composition, every member proposes from the same
        cache: the host crops it back to the committed prefix after each member, and may skip
        a costly member for a step (then it sees neither propose nor update policy that step).
    """


@hookspec(firstresult=True)
def selfspec_verify(state: DecodeState, draft: Draft) -> Verdict | None:
    """Verify a draft against the full model and decide what to commit.

    Called:
        Once per step, after propose, also for an empty draft. Stops at the first non-None
        result; return None to defer to the built-in greedy verifier (``trylast``): one
        full-model forward over ``[pending, draft...]`` written at cache slot
        ``state.length - 1`` with a causal or tree mask, ``state.pick`` at every node, the
        longest matching path, plus the model's own next token (the bonus).

    Args:
        state: the step's :class:`selfspec.DecodeState`.
        draft: the host-checked (possibly cut) :class:`selfspec.Draft` of this step.

    Returns:
        A :class:`selfspec.Verdict` equal to what greedy decoding (or the decode's sampling,
        by ``state.pick``) of the full model produces: ``accepted`` a path of the draft,
        ``bonus`` the full model's pick after it, ``kv_slots`` the cache slots (relative to
        the pending token's) holding the full model's keys/values of
        ``[pending, accepted...]`` in every layer, ``logits`` the verifying forward's
        ``[1 + len(draft), V]`` block when it has one. Losslessness rests on this hook.

    Host enforces:
        A ``Verdict`` instance; token ids in ``[0, vocab)``; ``accepted_nodes`` (or, for a
        chain, the default ``0..n-1``) name a path of the draft whose tokens are
        ``accepted``; one kv slot per committed position. When no plugin implements
        ``selfspec_cache``, ``kv_slots`` must also increase and lie in the slots the forward
        wrote (a plugin with its own ``selfspec_cache`` owns its layout). A broken rule is a
        ``PluginError`` naming the plugin and the step.

    Notes:
        Not called for a member of a composition (the host verifies the merged draft): a
        plugin implementing it declares ``composable = True`` only when its verifier is an
        optimisation it can do without (returns None, or the host's verdict faster), and
        nothing it needs is set here (count a draft in ``selfspec_propose``, not here).
        Override only when verification differs (reusing hidden states, verifying extra
        branches in the same pass); build on ``selfspec.verify_greedy``, ``verify_tree``,
        ``verify_from_layer`` (and ``selfspec.provisional.chain_verdict``). A verifier that
        relies on its proposer's ``draft.meta`` first checks ``draft.is_from(self)`` and
        returns None for any other draft; any other verifier must be right for every draft
        shape, not only its drafter's (the kit's ``test_verify_any_draft`` gives it kit-made
        chains and trees). Tokens riding along in the same pass (``verify_tree``'s
        ``ExtraBlock``) take absolute positions below ``state.runner.max_positions`` and must
        fit in the cache from slot ``state.length - 1`` (``state.cache.capacity``); their
        predictions are ``state.pick``'s, so under sampling the decode's own choice.
    """


@hookspec
def selfspec_cache(state: DecodeState, verdict: Verdict) -> None:
    """Make every cache hold exactly the committed prefix again.

    Called:
        Once per step after verify, for every plugin, *before* the host appends the committed
        tokens to ``state.tokens``.

    Args:
        state: the step's :class:`selfspec.DecodeState`; ``state.length`` is still the old
            length.
        verdict: this step's :class:`selfspec.Verdict`; ``verdict.committed`` are the tokens
            about to be committed.

    Returns:
        Nothing. The built-in implementation keeps ``verdict.kv_slots`` in the runner's KV
        cache (crop for a chain, gather for a tree) so it holds
        ``state.length + len(verdict.accepted)`` positions; plugins update their own caches
        (n-gram pools, compressed-layer caches) here.

    Host enforces:
        After the step (EOS and budget cuts applied) every layer of the KV cache holds
        exactly ``state.length - 1`` positions, else a ``PluginError`` naming the plugin.

    Notes:
        Not called for a member of a composition (see ``selfspec_verify``): update what a
        member keeps of the committed text in ``selfspec_update_policy`` instead.
    """


@hookspec
def selfspec_update_policy(state: DecodeState, verdict: Verdict, kept: tuple[int, ...]) -> None:
    """Adapt after a step: thresholds, layer sets, statistics.

    Called:
        Once per step after cache, for every plugin, with ``state.tokens`` already holding the
        newly committed tokens (``state.length`` updated).

    Args:
        state: the step's :class:`selfspec.DecodeState`.
        verdict: this step's :class:`selfspec.Verdict` (``verdict.committed`` may be longer
            than what was committed when EOS or the budget cut it). ``verdict.logits``
            (``[1 + len(draft), V]``, row 0 after the pending token, row ``i + 1`` after node
            ``i``; ``None`` from a verifier that gives none), ``verdict.logit_rows`` and
            ``verdict.top_k(k)`` are the full model's predictions.
        kept: for each node of the verified draft (the one ``selfspec_verify`` was given), its
            index in the draft ``selfspec_propose`` returned: ``tuple(range(len(draft)))`` when
            the host cut nothing. Row ``i + 1`` of ``verdict.logits`` and an ``accepted_nodes``
            entry ``i`` are about proposed node ``kept[i]``, so a plugin maps every row to its
            own node even when a cut by depth or room dropped nodes from the middle of a tree
            not stored breadth-first. Empty for an empty draft.

    Returns:
        Nothing.

    Host enforces:
        Nothing is checked; the verdict is dropped when the step ends, so its logits block
        is freed before the next forward.

    Notes:
        In a composition a member's ``verdict`` is that of its own draft (``kept`` maps its
        nodes to the member's own proposal): the longest prefix
        of the committed path among its nodes (``accepted``, ``accepted_nodes`` in its own
        numbering), the committed token after it (``bonus``), that path's ``kv_slots`` in the
        merged block, ``logits`` rows of its nodes (``None`` when the composition cut some),
        ``hidden`` rows of its path: what verifying its draft alone would have said. ``state``
        is the whole decode's (``state.length`` counts every committed token).
        Learn from the full model's predictions here instead of overriding
        ``selfspec_verify``. The logits block is the verifying forward's own (no copy): keep
        what you learn, not the tensor.
    """
