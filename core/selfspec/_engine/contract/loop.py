"""The decode loop: prefill, then propose -> verify -> cache -> update until done.

Reads in one sitting (gpt-fast's ``generate.py``): :meth:`Decoder.generate` is the loop; the
``_check_*`` helpers after it enforce the host's invariants (``docs/architecture.md``, "Invariants")
whatever a plugin returns. Only verified tokens are committed and streamed; EOS and the token budget
are the host's business; a broken contract stops the decode with an error naming the plugin.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pluggy
import torch

from selfspec._engine.contract import plugins
from selfspec._engine.contract.audit import Auditor, WeightGuard, audit_from_env
from selfspec._engine.contract.compose import Composer
from selfspec._engine.contract.draftcheck import check_draft_kept
from selfspec._engine.contract.eos import eos_token_ids
from selfspec._engine.contract.manager import make_manager
from selfspec._engine.contract.options import resolve
from selfspec._engine.contract.plugins import PluginError
from selfspec._engine.contract.sampling import GREEDY, Sampler, Sampling
from selfspec._engine.contract.types import (
    DecodeState,
    Draft,
    Result,
    Stats,
    StreamCallback,
    Verdict,
)
from selfspec._engine.runner import Runner


class Decoder:
    """One model + one method plugin (with its options); reusable across prompts.

    Called:
        Built once per model and plugin (``selfspec_setup`` runs here);
        :meth:`generate` decodes one prompt: prefill, then propose -> verify -> cache ->
        commit -> update policy until EOS or the budget. Two decoders never share plugin
        state: each builds its own plugin manager and instance.

    Args:
        model: a Hugging Face causal LM of a supported architecture.
        plugin: the method plugin's entry-point name (default ``vanilla``), or several joined by
            ``+`` (``"lookup+selfsd"``) or listed (``["lookup", "selfsd"]``): a composed draft
            ([composition.md](docs/composition.md)).
        options: the plugin's options (``{"ngram": 3}``), validated against its declaration; a
            composition's are its own (``budget``, ``cheap_first``, ``counterfactual``) and each
            member's under ``MEMBER.name`` (``{"selfsd.gamma": 0.5}``).
        tokenizer: the model's tokenizer, passed to ``selfspec_setup`` and used for
            ``Result.text`` and the default EOS ids.
        plugin_object: a class, instance or module to register under ``plugin`` instead of
            an installed entry point: a class is instantiated once per ``Decoder``, an instance
            is used as it is (shared by every ``Decoder`` given it), a module gives its
            module-level hooks ([class or instance?](docs/faq.md#plugin_object-class-or-instance));
            for a composition, a mapping ``{member: object}``.
        draft_slack: cache slots past ``prompt + max_new_tokens`` for drafts: each decode's KV
            cache holds ``len(prompt_ids) + max_new_tokens + draft_slack`` slots.
        trace: pluggy's hook-call tracing on stderr (default: ``SELFSPEC_TRACE``).
        weight_layout: how the runner holds the linear weights: ``auto`` (the host's choice
            for this CPU and dtype, ``docs/performance.md``), ``model`` (the model's own,
            bitwise), ``transposed``, ``packed``.
        audit: check every step against a shadow full-model cache and the weights against
            their state before setup (default: ``SELFSPEC_AUDIT``; ``selfspec.testing``).
        adopt_weights: apply the layout to ``model`` in place (one copy of each weight),
            as ``specdec`` does, instead of to copies beside it.
        sampling: how every decode picks its tokens unless :meth:`generate` is given its own
            (a :class:`selfspec.Sampling`; default greedy).
        exact: exact mode (``Runner(exact=True)``): every forward's rows are bitwise those of
            one-token forwards, so any lossless plugin's output equals ``vanilla``'s in exact
            mode bit for bit, in every dtype (docs/losslessness.md).

    Returns:
        :meth:`generate` ``(prompt_ids [T] or [1, T], max_new_tokens, eos_token_ids=None,
        stream=None, sampling=None)`` returns a :class:`selfspec.Result`: it decodes greedily,
        or samples with a :class:`selfspec.Sampling` (the call's, else the decoder's).
        ``stream`` receives each step's committed ids, and a ``stream`` that returns a true
        value ends the decode after that block (a stop string, a cancelled request; the result
        holds what was committed). ``eos_token_ids=None`` stops at the model's EOS ids by the
        host's one rule, the union of the generation config's, the model config's and the
        tokenizer's (the same ids ``specdec`` and ``specdec bench`` stop at); ``()`` always
        decodes ``max_new_tokens``. ``.plugin`` is the plugin instance, ``.runner`` the
        :class:`selfspec.Runner`, ``.auditor`` the last audited decode's auditor.

    Host enforces:
        An empty prompt, ids outside ``[0, vocab)``, a negative budget, or a prompt and
        budget past the model's positions (``len(prompt_ids) + max_new_tokens >
        max_position_embeddings``) are a ``ValueError`` before anything runs
        ([positions past the limit](docs/faq.md#may-a-forward-use-positions-past-the-models-limit)).
        Every hook result is checked (see each hook's contract) and a broken rule stops the
        decode with a ``PluginError`` naming the plugin; only verified tokens are committed
        and streamed; EOS (``eos_token_ids=None``: the host's one rule over generation config,
        model config and tokenizer; ``()``: never stop early) and the budget are the host's.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        plugin: str | Sequence[str] = plugins.BUILTIN_METHOD,
        options: Mapping[str, Any] | None = None,
        *,
        tokenizer: Any = None,
        plugin_object: Any = None,
        draft_slack: int = 256,
        trace: bool | None = None,
        weight_layout: str = "auto",
        audit: bool | None = None,
        adopt_weights: bool = False,
        sampling: Sampling | None = None,
        exact: bool = False,
    ) -> None:
        self.model = model
        self.sampling = sampling or GREEDY
        self.tokenizer = tokenizer
        plugin = plugins.label(plugin)
        #: the plugin's name (a composition's: its members joined by ``+``)
        self.plugin_name = plugin
        self.draft_slack = draft_slack
        #: the :class:`selfspec.Runner` over the model
        self.runner = Runner(model, weight_layout=weight_layout, adopt=adopt_weights, exact=exact)
        self._placement = self.runner.placement  # None unless accelerate dispatched the model
        #: the pluggy plugin manager and the plugin instance
        self.pm, self.plugin = make_manager(plugin, plugin_object, trace=trace)
        self.declared = plugins.declared_options(self.pm)
        #: the validated options, defaults filled in
        self.options = resolve(self.declared, options or {}, plugin)
        self.audit = audit_from_env() if audit is None else audit
        self.audit_tolerance: float | None = (
            None  # near-tie tolerance of the audit (None: per dtype)
        )
        self.auditor: Auditor | None = None
        #: the hooks the plugin implements (``"selfspec_verify" in decoder.plugin_hooks``)
        self.plugin_hooks = (
            plugins.hook_names(self.pm, self.plugin) if self.plugin is not None else []
        )
        self.weights = WeightGuard(model) if self.audit else None  # audit: the weights before setup
        self._call("selfspec_setup", runner=self.runner, options=self.options, tokenizer=tokenizer)
        if self.weights is not None:
            self.weights.check(self.plugin_name, "selfspec_setup")

    @property
    def hook(self) -> pluggy.HookRelay:
        """The plugin manager's hook relay (``decoder.hook.selfspec_options(...)``)."""
        return self.pm.hook

    # ------------------------------------------------------------------------------ the loop
    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        max_new_tokens: int = 128,
        eos_token_ids: Iterable[int] | None = None,
        stream: StreamCallback | None = None,
        sampling: Sampling | None = None,
    ) -> Result:
        """Decode from ``prompt_ids`` (a list or ``[T]``/``[1, T]`` tensor), greedily or with
        ``sampling`` (default: the decoder's). Temperature 0 runs no sampling code at all."""
        runner = self.runner
        prompt = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(-1).to(runner.device)  # [T]
        T = int(prompt.shape[0])
        if T == 0:
            raise ValueError("the prompt is empty")
        if max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        if int(prompt.min()) < 0 or int(prompt.max()) >= runner.vocab_size:
            raise ValueError(f"prompt token ids must lie in [0, {runner.vocab_size})")
        limit = runner.max_positions
        if limit is not None and T + max_new_tokens > limit:
            raise ValueError(
                f"a prompt of {T} tokens and max_new_tokens={max_new_tokens} "
                f"need {T + max_new_tokens} "
                f"positions; the model holds {limit} (max_position_embeddings): lower "
                f"max_new_tokens to {max(0, limit - T)} or shorten the prompt"
            )
        eos = frozenset(self._default_eos() if eos_token_ids is None else eos_token_ids)
        sampling = self.sampling if sampling is None else sampling
        sampler = None if sampling.greedy else Sampler(sampling, runner.vocab_size, runner.device)

        capacity = T + max_new_tokens + self.draft_slack
        tokens = torch.zeros(capacity, dtype=torch.long, device=runner.device)  # tokens: [capacity]
        tokens[:T] = prompt
        state = DecodeState(
            runner=runner,
            cache=runner.new_cache(capacity),
            tokens=tokens,
            length=T,
            prompt_length=T,
            max_new_tokens=max_new_tokens,
            eos_token_ids=eos,
            stats=Stats(weight_layout=self.runner.weight_layout, placement=self._placement),
            plugin_name=self.plugin_name,
            options=self.options,
            sampler=sampler,
        )
        stats = state.stats
        t_start = time.perf_counter()

        # 1. prefill: every prompt token but the last (the pending one) goes into the cache
        if T > 1:
            runner.forward(prompt[:-1], cache=state.cache, start=0, logits=None)
        self._sync()
        stats.prefill_s = time.perf_counter() - t_start
        bytes_at_start = runner.weight_bytes
        self.auditor = self._auditor()
        observers = [self.auditor] if self.auditor is not None else []  # see _observe
        if isinstance(
            self.plugin, Composer
        ):  # the audit blames a member for what its own hooks broke
            self.plugin.observers = observers
        self._call("selfspec_start", state=state)
        self._observe(observers, "start", state)

        while state.budget > 0 and not state.finished:
            # 2. propose: a chain [k] or a tree of draft tokens after the pending token
            draft, kept = self._check_draft(self._call("selfspec_propose", state=state), state)
            self._observe(observers, "proposed", state, draft)
            # 3. verify: the full model decides; accepted drafts + the bonus token
            verdict = self._check_verdict(
                self._call("selfspec_verify", state=state, draft=draft), draft, state
            )
            self._observe(observers, "verified", state, draft, verdict)
            # 4. cache: every cache holds exactly the committed prefix again
            self._call("selfspec_cache", state=state, verdict=verdict)
            # 5. commit: host-side EOS and budget rules, then stream
            new = self._commit(state, verdict, draft)
            self._observe(observers, "committed", state, new)
            if stream is not None and new and stream(new):
                state.finished = True  # the caller asked to end here (a stop string, a cancel)
            # 6. update policy: thresholds, layer sets, statistics
            self._call("selfspec_update_policy", state=state, verdict=verdict, kept=kept)
            self._observe(observers, "updated", state)
            # the step is over: free the verify block's logits before the next forward
            del draft, verdict

        self._sync()
        stats.wall_time_s = time.perf_counter() - t_start
        out = state.tokens[T : state.length].tolist()
        stats.new_tokens = len(out)
        stats.weight_bytes = runner.weight_bytes - bytes_at_start
        stats.choices = {what: choice.as_dict() for what, choice in self.runner.choices.items()}
        result = Result(
            prompt_ids=prompt.tolist(), output_ids=out, stats=stats, text=self._decode(out)
        )
        self._call("selfspec_end", state=state, result=result)
        self._observe(observers, "ended")
        return result

    # ------------------------------------------------------------------------------ helpers
    @staticmethod
    def _observe(observers: list[Any], event: str, *args: Any) -> None:
        """Tell each observer of the decode (the audit, when on) that a step phase ended:
        ``start(state)``, ``proposed(state, draft)`` (the host-checked draft),
        ``verified(state, draft, verdict)``, ``committed(state, new)``, ``updated(state)``,
        ``ended()``. Observers read; they never change the decode."""
        for observer in observers:
            getattr(observer, event)(*args)

    def _auditor(self) -> Auditor | None:
        if not self.audit:
            return None
        if self.weights is None:  # audit switched on after setup: the weights as they are now
            self.weights = WeightGuard(self.model)
        return Auditor(self.plugin_name, self.plugin_hooks, self.audit_tolerance, self.weights)

    def _commit(self, state: DecodeState, verdict: Verdict, draft: Draft) -> list[int]:
        new = list(verdict.committed)
        for i, t in enumerate(new):  # nothing after EOS is committed
            if t in state.eos_token_ids:
                new = new[: i + 1]
                state.finished = True
                break
        new = new[: state.budget]  # never past max_new_tokens
        n = len(new)
        state.tokens[state.length : state.length + n] = torch.tensor(
            new, dtype=torch.long, device=state.tokens.device
        )
        state.length += n
        state.step += 1
        s = state.stats
        s.steps += 1
        s.drafted += len(draft)
        s.drafted_depth += max(draft.depths(), default=0) if draft.is_tree else len(draft)
        s.accepted += len(verdict.accepted)
        s.forwards += verdict.forwards
        s.accept_lengths.append(n)
        if state.budget <= 0:
            state.finished = True
        if state.sampler is not None:
            state.sampler.forget_before(state.length)
        if not state.finished and state.cache.length != state.length - 1:
            raise PluginError(
                self.plugin_name,
                f"the KV cache holds {state.cache.lengths} positions after "
                f"the step, expected {state.length - 1} in every layer",
            )
        return new

    def _call(self, hook: str, **kwargs: Any) -> Any:
        return plugins.call_hook(self.pm, self.plugin_name, hook, **kwargs)

    def _check_draft(self, draft: Any, state: DecodeState) -> tuple[Draft, tuple[int, ...]]:
        """The checked, cut draft and the proposed index of each node it kept."""
        return check_draft_kept(draft, state, self.plugin_name)

    def _check_verdict(self, verdict: Any, draft: Draft, state: DecodeState) -> Verdict:
        name = self.plugin_name
        if not isinstance(verdict, Verdict):
            raise PluginError(
                name, f"selfspec_verify returned {type(verdict).__name__}, not a Verdict"
            )
        vocab = state.runner.vocab_size
        if not 0 <= verdict.bonus < vocab or any(not 0 <= t < vocab for t in verdict.accepted):
            raise PluginError(name, f"verdict token ids must lie in [0, {vocab})")
        nodes = verdict.accepted_nodes or (
            tuple(range(len(verdict.accepted))) if draft.parents is None else ()
        )
        if len(nodes) != len(verdict.accepted):
            raise PluginError(
                name, "verdict.accepted_nodes must name the draft node of every accepted token"
            )
        tokens = draft.tokens.tolist()
        parents = (
            draft.parents.tolist() if draft.parents is not None else list(range(-1, len(draft) - 1))
        )
        prev = -1
        for node, tok in zip(nodes, verdict.accepted):
            if not 0 <= node < len(draft) or tokens[node] != tok or parents[node] != prev:
                raise PluginError(name, "verdict.accepted is not a path of the draft")
            prev = node
        slots = verdict.slots()
        if len(slots) != len(verdict.accepted) + 1:
            raise PluginError(name, "verdict.kv_slots must name one slot per committed position")
        written = min(state.cache.lengths) - (state.length - 1)
        if (
            self.plugin_hooks
            and "selfspec_cache" not in self.plugin_hooks
            and (
                slots[0] < 0
                or any(b <= a for a, b in zip(slots, slots[1:]))
                or slots[-1] >= written
            )
        ):
            raise PluginError(
                name,
                f"selfspec_verify returned kv_slots {list(slots)}: they must increase "
                f"and lie in the {written} slots its forward wrote (step {state.step})",
            )
        return verdict

    def _default_eos(self) -> frozenset[int]:
        return eos_token_ids(
            self.model, self.tokenizer
        )  # the one EOS rule (generation config, config, tokenizer)

    def _decode(self, ids: list[int]) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _sync(self) -> None:
        if self.runner.device.type == "cuda":
            torch.cuda.synchronize()


# ------------------------------------------------------------------------------ draft checks
