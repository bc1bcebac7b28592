"""The HiSpec plugin: early-exit drafts at L_d, intermediate verification at L_i, full check.

One decode step (Algorithm 2 of the paper, with the reuse of §3.1):

1. ``selfspec_propose`` builds the *tentatively accepted buffer* ``c_1..c_m`` after the pending
   token ``c_0`` in rounds: draft ``N_d`` (``round_size``) tokens with the exit at ``L_d`` (each
   runs layers ``[0, L_d)`` once), run ``[c_m, d_1..d_{N_d-1}]`` from their ``L_d`` states through
   ``[L_d, L_i)`` only, accept the drafts the ``L_i`` exit agrees with, and on the first mismatch
   append the ``L_i`` exit's own token. Rounds repeat until the buffer holds ``N_i`` (``num_draft``)
   tokens. The buffer is private: it goes to the host as a chain ``Draft`` of this plugin
   (``owner``) whose ``meta`` holds the ``L_i`` states of ``c_0..c_{m-1}``.
2. ``selfspec_verify`` finishes the full-model check with the host's ``verify_from_layer``:
   ``c_m`` (never run yet) goes through ``[0, L_i)``, then ``[c_0..c_m]`` through ``[L_i, L)``
   from the ``L_i`` states; the greedy verdict is the longest matching prefix plus the model's
   bonus token. For a draft that is not its own, or that the host cut, it falls back to the
   host's full forward (``verify_greedy``).

KV cache: every write goes to slot ``base + j`` of the token ``c_j`` (``base`` = the pending
token's slot), so a rejected draft's slot is simply overwritten by its replacement; each layer
range is only ever read below what it has written. The host's crop after verify leaves every
layer holding exactly the committed prefix. When everything is accepted, each committed token
ran every layer exactly once.

``single_exit=true`` is the LayerSkip-style baseline at the same ``L_d``: draft ``N_i`` tokens
at ``L_d`` and verify them from their ``L_d`` states (no intermediate verification).

tau: one HiSpec verification counts as **one** full-model forward (``Verdict.forwards = 1``),
whatever layers the drafting and intermediate verification ran: tau = committed tokens per
full verification, the paper's acceptance measure. The intermediate work shows up in the time,
and in ``HiSpec.counters``.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

import selfspec
from selfspec import (
    DRAFT_WEIGHTS,
    Draft,
    Option,
    TreeConfig,
    Verdict,
    accepted_length,
    register_tree_options,
    resolve_profile,
    verify_from_layer,
    verify_greedy,
)

from .heads import STORE, ExitHeads, exit_layers, load_profile, profile_name
from .stats import COUNTERS


class HiSpec:
    """One instance per decoder: options, exit heads, the per-step buffer's meta, counters."""

    #: Joins compositions: its verifier only finishes, from the L_i states, the check the host's
    #: full forward makes; without it (in a composition) ``counters`` miss the verify-side counts.
    composable = True

    def __init__(self) -> None:
        self.ld = self.li = 0
        self.n_layers = 0
        self.nd = 2
        self.ni = 4
        self.single = False
        self.heads = ExitHeads()
        self.profile_path: str | None = None
        # tree drafts from the L_d exit (the host's draft_tree); set up from the options
        self.tree = TreeConfig()
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)

    # ------------------------------------------------------------------------ lifecycle
    @selfspec.hookimpl
    def selfspec_options(self, register) -> None:
        register(
            Option(
                "draft_layer", int, 0, "exit layer L_d that drafts (0: about L/8)", min=0, max=4096
            )
        )
        register(
            Option(
                "verify_layer",
                int,
                0,
                "exit layer L_i of the intermediate verifier (0: about L/4)",
                min=0,
                max=4096,
            )
        )
        register(
            Option(
                "round_size",
                int,
                2,
                "N_d: tokens drafted per round before intermediate verification",
                min=1,
                max=64,
            )
        )
        register(
            Option(
                "num_draft",
                int,
                4,
                "N_i: most tokens drafted per step (the tentatively accepted "
                "buffer the full model checks)",
                min=1,
                max=128,
            )
        )
        register(
            Option(
                "single_exit",
                bool,
                False,
                "LayerSkip-style baseline: draft N_i tokens at L_d, no intermediate verification",
            )
        )
        register(
            Option(
                "profile",
                str,
                "auto",
                "exit heads: 'auto' (this model's calibrated profile if any), 'none', "
                "or a profile path",
            )
        )
        # tree: a tree from the L_d exit, verified by the full model
        register_tree_options(register)
        register(
            Option(
                "draft_weights",
                str,
                "auto",
                "weights of the exit heads' LM head (the host's shared compressed copy; the "
                "layers stay the model's own, whose states verification reuses): none, a "
                "registered draft format (int8, int8-weights, bf16, bnb-int8, ...; `specdec "
                "plugins`), auto",
                choices=DRAFT_WEIGHTS,
            )
        )
        register(
            Option(
                "draft_vocab",
                int,
                0,
                "draft vocabulary of the exit heads: the N most frequent corpus tokens (0: all; a "
                "profile's own subset wins)",
                min=0,
            )
        )

    @selfspec.hookimpl
    def selfspec_setup(self, runner: Any, options: dict[str, Any], tokenizer: Any = None) -> None:
        n = runner.n_layers
        self.single = bool(options["single_exit"])
        ld, li = exit_layers(options, n)
        # single: verify from L_d
        self.ld, self.li, self.n_layers = ld, (ld if self.single else li), n
        self.nd, self.ni = int(options["round_size"]), int(options["num_draft"])
        self.heads, self.profile_path = _resolve_heads(options["profile"], runner)
        self.tree = TreeConfig.from_options(options, runner)
        vocab = selfspec.draft_vocab(runner, options["draft_vocab"], tokenizer)
        self.heads.draft = selfspec.draft_weights(
            runner, options["draft_weights"], vocab, layers=False
        )

    @selfspec.hookimpl
    def selfspec_commands(self, register) -> None:
        from .commands import calibrate, rates_command  # click, only for the CLI

        register(calibrate)
        register(rates_command)

    @selfspec.hookimpl
    def selfspec_start(self, state: selfspec.DecodeState) -> None:
        self.counters = dict.fromkeys(COUNTERS, 0)

    # ------------------------------------------------------------------------ the step
    @selfspec.hookimpl
    def selfspec_propose(self, state: selfspec.DecodeState) -> Draft:
        runner, cache = state.runner, state.cache
        dev = runner.device
        base = state.length - 1  # slot of the pending token c_0
        limit = min(self.ni, state.max_draft_depth)
        if limit <= 0:
            return Draft.empty(dev)
        # a tree from the L_d exit, verified by the host's verify_tree (no L_i stage)
        if self.tree.enabled:
            ld, heads = self.ld, self.heads

            def step(ids, start, positions, mask):
                h = runner.forward(
                    ids,
                    cache=cache,
                    start=start,
                    positions=positions,
                    block_mask=mask,
                    layers=(0, ld),
                    logits=None,
                ).hidden[0]  # [q, H]
                return heads.logits(runner, ld, h)

            tree = self.tree.draft(
                step, state, max_depth=limit, draft_cost=ld / self.n_layers, vocab=heads.vocab
            )
            self.counters["drafted"] += tree.ran
            return tree.draft(owner=self)
        buf: list[int] = [state.pending]  # c_0..c_m
        rows: list[torch.Tensor] = []  # states at the verifier's start layer of c_0..c_{m-1}
        eos = state.eos_token_ids
        while len(buf) - 1 < limit and not (len(buf) > 1 and buf[-1] in eos):
            m = len(buf) - 1
            n = min(self.nd, limit - m)
            # a) draft: c_m, d_1..d_{n-1} run layers [0, L_d) at slots base+m.. ; the exit guesses
            cur = torch.tensor(buf[-1:], dtype=torch.long, device=dev)  # [1]
            hd, drafts = [], []
            for j in range(n):
                h = runner.forward(
                    cur, cache=cache, start=base + m + j, layers=(0, self.ld), logits=None
                ).hidden[0]
                hd.append(h)  # [1, H]
                cur = self.heads.predict(runner, self.ld, h, state.pick, [base + m + j + 1])  # [1]
                drafts.append(cur)
            hds = torch.cat(hd)  # [n, H]: L_d states of [c_m, d_1..d_{n-1}]
            dtok = torch.cat(drafts)  # [n]: d_1..d_n
            self.counters["drafted"] += n
            if self.single:
                buf += dtok.tolist()
                rows.append(hds)
                continue
            # b) intermediate verification: only layers [L_d, L_i), from the L_d states
            hi = runner.forward(
                hidden=hds[None],
                cache=cache,
                start=base + m,
                layers=(self.ld, self.li),
                logits=None,
            ).hidden[0]  # [n, H]
            pred = self.heads.predict(
                runner, self.li, hi, state.pick, range(base + m + 1, base + m + n + 1)
            )  # [n]: L_i's token after c_m, d_1..
            a = accepted_length(pred, dtok)
            self.counters["li_accepted"] += a
            if a < n:  # first mismatch: L_i's own token replaces d_{a+1}
                new = dtok[:a].tolist() + [int(pred[a])]
                self.counters["li_corrections"] += 1
            else:
                new = dtok.tolist()
            buf += new
            rows.append(hi[: len(new)])  # states of c_m, d_1..d_{len(new)-1}
        m = len(buf) - 1
        for i, t in enumerate(buf[1:], 1):  # nothing after an EOS can be committed
            if t in eos:
                m = i
                break
        states = torch.cat(rows)[:m]  # [m, H]
        self.counters["buffered"] += m
        meta = {"states": states, "layer": self.li, "tokens": tuple(buf[1 : m + 1])}
        return Draft(
            torch.tensor(buf[1 : m + 1], dtype=torch.long, device=dev), meta=meta, owner=self
        )

    @selfspec.hookimpl
    def selfspec_verify(self, state: selfspec.DecodeState, draft: Draft) -> Verdict:
        if len(draft) == 0:  # no room to draft: a plain greedy step
            return verify_greedy(state, draft)
        meta = draft.meta
        if draft.parents is not None:  # a tree: one full-model tree pass
            return verify_greedy(state, draft)
        if (
            not draft.is_from(self)
            or tuple(draft.tokens.tolist()) != meta["tokens"]
            or state.capture_layers
        ):
            self.counters["fallbacks"] += 1  # foreign or cut draft: verify with a full forward
            return verify_greedy(state, draft)
        # c) c_m has run no layer yet: [0, L_i) at its slot; then [c_0..c_m] through [L_i, L)
        verdict = verify_from_layer(state, draft, meta["states"], meta["layer"], forwards=1.0)
        self.counters["steps"] += 1
        self.counters["full_accepted"] += len(verdict.accepted)
        return verdict

    @selfspec.hookimpl
    def selfspec_update_policy(self, state: selfspec.DecodeState, verdict: Verdict) -> None:
        # tree drafts: learn how often nodes of each draft probability pass
        self.tree.observe(verdict)


# ------------------------------------------------------------------------------ helpers
def _resolve_heads(spec: str, runner: Any) -> tuple[ExitHeads, str | None]:
    """The exit heads for ``profile=spec``: ``none`` -> shared head, ``auto`` -> this model's
    profile when one exists, else a path (an error if it cannot be read)."""
    path = resolve_profile(spec, STORE, profile_name(runner))
    if path is None:
        if str(spec).strip().lower() == "auto":
            print(
                "hispec: no exit heads are calibrated for this model, so it drafts through the "
                "plain LM head, whose early-exit drafts are rarely accepted; run `specdec "
                "--plugin hispec calibrate` (a few minutes) to fit them",
                file=sys.stderr,
            )
        return ExitHeads(), None
    return load_profile(path, runner).bind(runner), str(path)
