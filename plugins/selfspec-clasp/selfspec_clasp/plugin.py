"""The CLaSp plugin: its hooks (drafting, the search schedule) and options."""

from __future__ import annotations

from typing import Any

import torch

import selfspec
from selfspec import (
    DecodeState,
    Draft,
    Option,
    TreeConfig,
    Verdict,
    register_draft_options,
    register_tree_options,
    skip_layer_draft,
    skip_layer_step,
)

from .search import initial_skip, layer_search


class CLaSp:
    """One instance per decoder. Per decode: the current skip set and the search log.

    Schedule: the step whose index is a multiple of ``LOI`` (0, LOI, 2·LOI, ...) asks the
    verifier for every layer's hidden states; after it commits, the dynamic program runs on the
    last accepted token and its set is used for the next ``LOI`` drafts. Before the first search
    (step 0 only) the set is :func:`~selfspec_clasp.search.initial_skip`.
    """

    def __init__(self) -> None:
        self.runner: Any = None
        self.n_skip = 0
        self.loi = 1
        self.det = 0.7
        self.num_draft = 1
        self.keep_exit = True
        self.skip: tuple[int, ...] = ()
        self.search_steps: list[int] = []  # decode steps after which the program ran
        self.search_s = 0.0  # wall time spent in the program, this decode
        self.search_cos: list[float] = []  # D(L, M) of every search
        self._due = False
        self.backoff = 0  # option: longest pause in drafting after failed drafts (0 = never pause)
        self._pause = 0  # steps left without drafting
        self._next_pause = 1  # length of the next pause (doubles while drafts keep failing)
        self._attempted = False  # this step ran the draft model
        self.tree = TreeConfig()  # tree drafts (the host's draft_tree), off by default
        # the draft model's weights (host's draft_weights)
        self.weights: selfspec.DraftWeights | None = None

    @selfspec.hookimpl
    def selfspec_options(self, register) -> None:
        register(
            Option(
                "M",
                int,
                None,
                "layers skipped while drafting (default: half of them, rounded down)",
                min=0,
            )
        )
        register(
            Option(
                "LOI",
                int,
                8,
                "layer optimisation interval: re-run the search every LOI steps",
                min=1,
            )
        )
        register(
            Option(
                "DET",
                float,
                0.7,
                "draft-exit threshold: stop drafting before a token the draft "
                "model gives less than this probability",
                min=0.0,
                max=1.0,
            )
        )
        register(
            Option(
                "keep_exit",
                bool,
                True,
                "draft the token that fails DET too (its forward is paid; "
                "it is verified with the others) instead of dropping it",
            )
        )
        register(Option("num_draft", int, 8, "most tokens drafted in one step", min=1, max=64))
        register(
            Option(
                "backoff",
                int,
                0,
                "not in the paper: after a step whose draft got nothing "
                "accepted, skip drafting for 1, 2, 4, ... steps, at most this many (0 = off)",
                min=0,
                max=64,
            )
        )
        # tree, tree_budget, tree_topk, tree_calibrate: the host's defaults
        register_tree_options(register)
        register_draft_options(register)  # draft_weights, draft_vocab: the host's defaults

    @selfspec.hookimpl
    def selfspec_setup(self, runner: Any, options: dict[str, Any], tokenizer: Any = None) -> None:
        L = runner.n_layers
        M = L // 2 if options["M"] is None else options["M"]
        if M > L:
            raise ValueError(f"M={M}: the model has only {L} layers to skip")
        self.runner = runner
        self.n_skip, self.loi, self.det, self.num_draft = (
            M,
            options["LOI"],
            options["DET"],
            options["num_draft"],
        )
        self.backoff = options["backoff"]
        self.keep_exit = options["keep_exit"]
        vocab = selfspec.draft_vocab(runner, options["draft_vocab"], tokenizer)
        self.weights = selfspec.draft_weights(runner, options["draft_weights"], vocab)
        # with the draft passes' curve
        self.tree = TreeConfig.from_options(options, runner, weights=self.weights)

    @selfspec.hookimpl
    def selfspec_start(self, state: DecodeState) -> None:
        self.skip = initial_skip(self.runner.n_layers, self.n_skip)
        self.search_steps, self.search_s, self.search_cos = [], 0.0, []
        self._due = False
        self._pause, self._next_pause, self._attempted = 0, 1, False

    @selfspec.hookimpl
    def selfspec_propose(self, state: DecodeState) -> Draft:
        # the verifier captures every layer's states only on steps followed by a search
        self._due = state.step % self.loi == 0
        state.capture_layers = tuple(range(self.runner.n_layers + 1)) if self._due else None
        k = min(self.num_draft, state.max_draft_depth)
        slot = state.length - 1  # the pending token's slot and position
        pending = state.tokens[slot : slot + 1]  # pending: [1]
        self._attempted = k > 0 and self._pause == 0
        if not self._attempted:
            self._pause = max(0, self._pause - 1)
            return Draft.empty(self.runner.device)
        # both sub-blocks of every layer in S are skipped; drafting stops at a token the draft
        # model gives less than DET (kept and verified with the others when keep_exit)
        # a dynamic tree from the same draft model instead (verified by verify_tree)
        if self.tree.enabled:
            step = skip_layer_step(
                self.runner,
                state.cache,
                skip_attn=self.skip,
                skip_mlp=self.skip,
                weights=self.weights,
            )
            share = 1.0 - len(self.skip) / self.runner.n_layers  # layers the draft runs
            # on the draft weights: as measured against a full forward
            cost = self.tree.pass_cost(share)
            draft = self.tree.draft(step, state, max_depth=k, draft_cost=cost).draft()
        else:
            draft = Draft(
                skip_layer_draft(
                    self.runner,
                    state.cache,
                    pending,
                    slot,
                    max_tokens=k,
                    skip_attn=self.skip,
                    skip_mlp=self.skip,
                    exit_below=self.det,
                    keep_exit=self.keep_exit,
                    pick=state.pick,
                    weights=self.weights,
                ).tokens
            )
        # the skipped layers wrote no draft slots, the others did: forget the draft slots in
        # every layer so all hold the committed prefix again (verification rewrites them)
        state.cache.crop(slot)
        return draft

    @selfspec.hookimpl
    def selfspec_update_policy(self, state: DecodeState, verdict: Verdict) -> None:
        # tree drafts: learn how often nodes of each draft probability pass
        self.tree.observe(verdict)
        if self.backoff and self._attempted:
            if verdict.accepted:
                self._next_pause = 1
            else:  # the draft model's time bought nothing: pause drafting, longer each time
                self._pause = self._next_pause
                self._next_pause = min(2 * self._next_pause, self.backoff)
        L = self.runner.n_layers
        if (
            not self._due
            or state.finished
            or verdict.hidden is None
            or any(i not in verdict.hidden for i in range(L + 1))
        ):
            return
        # the last accepted token (the pending one if nothing was accepted): its states are the
        # last captured row, and after the commit it sits at slot length-2 (the bonus is pending)
        states = torch.stack([verdict.hidden[i][-1] for i in range(L + 1)])  # states: [L+1, H]
        with state.timed("layer_search"):  # its own phase, left out of "update" by the host
            found = layer_search(self.runner, state.cache, states, self.n_skip, state.length - 2)
        self.skip = found.skip
        self.search_steps.append(state.step - 1)
        self.search_cos.append(found.cosine)
        self.search_s = state.stats.phase_s["layer_search"]
