"""Known-lossy plugins: the kit's own mutation score.

:class:`Echo` is a small correct drafter (it copies what followed the last earlier occurrence
of the pending token, up to ``k`` tokens) with its own verify and cache hooks that defer to the
built-in mechanics. Each mutant changes one thing, the way plugin authors get it wrong, and
only past a threshold (long prompts, late in a long output, deep drafts), so that a kit whose
strategies stay short cannot see it. ``MUTANTS`` lists them with a one-line description;
``tests/test_mutants.py`` checks that a standard :class:`~selfspec.testing.PluginSuite` under
the ``selfspec-ci`` profile catches every one and that :class:`Echo` passes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import torch

from selfspec._engine.builtin.verify import verify_greedy
from selfspec._engine.markers import hookimpl
from selfspec._engine.options import Option
from selfspec._engine.types import DecodeState, Draft, Verdict


class Echo:
    """Correct: drafts the ``k`` tokens that followed the pending token's last earlier occurrence."""

    bug: ClassVar[str] = "none (the correct control)"
    trigger: ClassVar[str] = "-"
    #: The hook the audit must blame (None: not checked).
    hook: ClassVar[str | None] = None
    #: ``state.step`` of the first wrong step of the last decode (None: none, or not recorded).
    fault_step: ClassVar[int | None] = None

    @hookimpl
    def selfspec_options(self, register: Any) -> None:
        register(Option("k", int, 8, "longest draft", min=1, max=16))

    @hookimpl
    def selfspec_setup(self, options: dict[str, Any]) -> None:
        self.k = options["k"]
        type(self).fault_step = None

    @hookimpl
    def selfspec_propose(self, state: DecodeState) -> Draft:
        ids = state.committed.tolist()
        pending = ids[-1]
        for j in range(len(ids) - 2, -1, -1):
            if ids[j] == pending:
                return Draft.chain(ids[j + 1 : j + 1 + self.k], device=state.runner.device)
        return Draft.empty(state.runner.device)

    @hookimpl
    def selfspec_verify(self, state: DecodeState, draft: Draft) -> Verdict:
        return self.verify(state, draft)

    @hookimpl
    def selfspec_cache(self, state: DecodeState, verdict: Verdict) -> None:
        self.cache(state, verdict)

    # what the mutants override
    def verify(self, state: DecodeState, draft: Draft) -> Verdict:
        return verify_greedy(state, draft)

    def cache(self, state: DecodeState, verdict: Verdict) -> None:
        pass  # the built-in commit keeps verdict.kv_slots

    def fault(self, state: DecodeState, after_commit: bool = False) -> None:
        """Note the step of the first wrong step of this decode (what the audit must name).
        ``selfspec_update_policy`` runs after the commit, where ``state.step`` already counts
        the step (``after_commit=True``)."""
        if type(self).fault_step is None:
            type(self).fault_step = state.step - 1 if after_commit else state.step


def _accept_all(state: DecodeState, draft: Draft) -> Verdict:
    """Accept every draft token unchecked (the bonus is the model's token after them)."""
    v = verify_greedy(state, draft)
    if len(draft) == len(v.accepted):
        return v
    # re-run the whole draft so the KV of [pending, draft...] is the full model's
    base = state.length - 1
    ids = torch.cat([state.tokens[base : base + 1], draft.tokens])
    out = state.runner.forward(ids, cache=state.cache, start=base, logits="last")
    bonus = int(out.logits[-1].to(torch.float32).argmax())
    return Verdict(tuple(draft.tokens.tolist()), bonus, tuple(range(len(draft))))


class WrongBonusLate(Echo):
    bug = "bonus token off by one"
    trigger = "from output token 100 on"
    at = 100

    def verify(self, state, draft):
        v = verify_greedy(state, draft)
        if state.generated + len(v.accepted) >= self.at:
            return replace(v, bonus=(v.bonus + 1) % state.runner.vocab_size)
        return v


class WrongBonusVeryLate(WrongBonusLate):
    trigger = "from output token 128 on"
    at = 128


class PastMismatchLongPrompt(Echo):
    bug = "accepts one draft token past the first mismatch"
    trigger = "prompts of 64+ tokens"
    at = 64

    def verify(self, state, draft):
        v = verify_greedy(state, draft)
        a = len(v.accepted)
        if state.prompt_length < self.at or a >= len(draft):
            return v
        return _accept_all(state, Draft(draft.tokens[: a + 1]))


class PastMismatchVeryLongPrompt(PastMismatchLongPrompt):
    trigger = "prompts of 200+ tokens"
    at = 200


class ShiftedSlotsDeep(Echo):
    bug = "kv_slots shifted by one (keeps the slot after each accepted token)"
    trigger = "drafts of 6+ tokens with one accepted"
    at = 6

    def verify(self, state, draft):
        v = verify_greedy(state, draft)
        a = len(v.accepted)
        if len(draft) >= self.at and 1 <= a < len(draft):
            return replace(v, kv_slots=(0, *range(2, a + 2)))
        return v


class ProposerOverwritesLong(Echo):
    bug = "the proposer writes its draft's KV over the last committed slot"
    trigger = "128+ committed tokens"
    at = 128

    def selfspec_propose(self, state):
        draft = super().selfspec_propose(state)
        if state.length >= self.at and len(draft) and state.length >= 2:
            ids = torch.cat([state.tokens[state.length - 1 : state.length], draft.tokens])
            state.runner.forward(ids, cache=state.cache, start=state.length - 2, logits=None)
        return draft


class PendingOverwrittenLate(Echo):
    bug = "the proposer overwrites the pending token with its first draft token"
    trigger = "from output token 32 on, with a draft"
    at = 32

    def selfspec_propose(self, state):
        draft = super().selfspec_propose(state)
        if state.generated >= self.at and len(draft):
            state.tokens[state.length - 1] = draft.tokens[0]
        return draft


class StaleKVLate(Echo):
    bug = "cache hook leaves the previous step's KV in the kept slots (lengths right)"
    trigger = "from output token 64 on, with an accepted draft"
    at = 64

    def verify(self, state, draft):
        base, c = state.length - 1, state.cache
        self._stale = [(k[:, :, base + 1 : base + 1 + len(draft)].clone(), v[:, :, base + 1 : base + 1 + len(draft)].clone())
                       if k is not None else None for k, v in zip(c.keys, c.values)]
        return verify_greedy(state, draft)

    def cache(self, state, verdict):
        a = len(verdict.accepted)
        if state.generated < self.at or a == 0:
            return
        base, c = state.length - 1, state.cache
        for i, kv in enumerate(self._stale):
            if kv is not None and c.keys[i] is not None:
                c.keys[i][:, :, base + 1 : base + 1 + a] = kv[0][:, :, :a]
                c.values[i][:, :, base + 1 : base + 1 + a] = kv[1][:, :, :a]


class SkipsCheckLongPrompt(Echo):
    bug = "verifier skips the check (accepts the whole draft)"
    trigger = "prompts of 128+ tokens"
    at = 128

    def verify(self, state, draft):
        return _accept_all(state, draft) if state.prompt_length >= self.at else verify_greedy(state, draft)


class SkipsCheckDeep(Echo):
    bug = "verifier skips the check (accepts the whole draft)"
    trigger = "drafts of 8+ tokens"
    at = 8

    def verify(self, state, draft):
        return _accept_all(state, draft) if len(draft) >= self.at else verify_greedy(state, draft)


class SkipsCheckLate(Echo):
    bug = "verifier skips the check (accepts the whole draft)"
    trigger = "from output token 64 on"
    at = 64

    def verify(self, state, draft):
        return _accept_all(state, draft) if state.generated >= self.at else verify_greedy(state, draft)


class StepKeyedNoise(Echo):
    bug = "samples with noise keyed by the step, not the position"
    trigger = "sampling, after a step that accepted a draft"

    def verify(self, state, draft):
        if not state.sampling_on:
            return verify_greedy(state, draft)
        from selfspec._engine.sampling import sample_tokens
        from selfspec._engine.verification import accepted_length

        base = state.length - 1
        ids = torch.cat([state.tokens[base : base + 1], draft.tokens])
        out = state.runner.forward(ids, cache=state.cache, start=base)
        # wrong: prompt length + step is the position only while every step commits one token
        at = torch.arange(len(draft) + 1) + state.prompt_length + state.step
        pred = sample_tokens(out.logits, at, state.sampler.sampling)
        a = accepted_length(pred, draft.tokens)
        return Verdict(tuple(draft.tokens[:a].tolist()), int(pred[a]), tuple(range(a)))


# ---------------------------------------------------------------- past the old reach
class PastMismatchPrompt400(Echo):
    bug = "accepts one draft token past the first mismatch"
    trigger = "prompts of 400+ tokens"
    hook = "selfspec_verify"
    at = 400

    def verify(self, state, draft):
        v = verify_greedy(state, draft)
        a = len(v.accepted)
        if state.prompt_length < self.at or a >= len(draft):
            return v
        self.fault(state)
        return _accept_all(state, Draft(draft.tokens[: a + 1]))


class WrongTokenAfter200(Echo):
    bug = "bonus token off by one"
    trigger = "from output token 200 on"
    hook = "selfspec_verify"
    at = 200

    def verify(self, state, draft):
        v = verify_greedy(state, draft)
        if state.generated + len(v.accepted) < self.at:
            return v
        self.fault(state)
        return replace(v, bonus=(v.bonus + 1) % state.runner.vocab_size)


class WrongTokenGemmaLate(WrongTokenAfter200):
    bug = "bonus token off by one, on Gemma 3 only"
    trigger = "Gemma 3, from output token 100 on"
    at = 100

    def verify(self, state, draft):
        if state.runner.config.model_type.startswith("gemma3"):
            return super().verify(state, draft)
        return verify_greedy(state, draft)


class DropsSlotEvery130(Echo):
    bug = "cache hook drops a KV slot (the next one moves into it) once every 130 steps"
    trigger = "steps 129, 259, ..."
    hook = "selfspec_verify or selfspec_cache"
    every = 130

    def cache(self, state, verdict):
        if (state.step + 1) % self.every:
            return
        self.fault(state)
        base, c = state.length - 1, state.cache
        for i in range(c.n_layers):
            if c.keys[i] is not None:
                c.keys[i][:, :, base] = c.keys[i][:, :, base + 1]
                c.values[i][:, :, base] = c.values[i][:, :, base + 1]


class EditsHeadInSetup(Echo):
    bug = "selfspec_setup scales one row of the model's LM head in place"
    trigger = "always (the output changes only where that token is near the top)"
    hook = "selfspec_setup"

    @hookimpl
    def selfspec_setup(self, runner: Any, options: dict[str, Any]) -> None:
        super().selfspec_setup(options)
        with torch.no_grad():
            runner.lm_head.weight[7].mul_(1.05)


class PolicyCorruptsKVLate(Echo):
    bug = "update-policy hook writes over the last committed KV slot"
    trigger = "from output token 150 on"
    hook = "selfspec_update_policy"
    at = 150

    @hookimpl
    def selfspec_update_policy(self, state, verdict):
        if state.generated < self.at or state.finished:
            return
        self.fault(state, after_commit=True)
        base, c = state.length - 2, state.cache
        for i in range(c.n_layers):
            if c.keys[i] is not None:
                c.keys[i][:, :, base] *= 0.5


# ---------------------------------------------------------------- sampling filters, EOS ids, seeds
class ForgetsTopK(Echo):
    bug = "its sampler applies temperature and top-p but forgets top-k"
    trigger = "sampling with top-k on"
    hook = "selfspec_verify"

    def verify(self, state, draft):
        if not state.sampling_on or state.sampler.sampling.top_k == 0:
            return verify_greedy(state, draft)
        from selfspec._engine.sampling import sample_tokens
        from selfspec._engine.verification import accepted_length

        base = state.length - 1
        ids = torch.cat([state.tokens[base : base + 1], draft.tokens])
        out = state.runner.forward(ids, cache=state.cache, start=base)
        at = torch.arange(len(draft) + 1) + base + 1  # the right positions
        pred = sample_tokens(out.logits, at, replace(state.sampler.sampling, top_k=0))  # wrong: no top-k
        a = accepted_length(pred, draft.tokens)
        return Verdict(tuple(draft.tokens[:a].tolist()), int(pred[a]), tuple(range(a)))


class EosAlias(Echo):
    bug = "treats every EOS id as the first one (its bonus becomes the smallest EOS id)"
    trigger = "two or more EOS ids, the model's next token one of the others"
    hook = "selfspec_verify"

    def verify(self, state, draft):
        v = verify_greedy(state, draft)
        eos = sorted(state.eos_token_ids)
        if len(eos) > 1 and v.bonus in eos and v.bonus != eos[0]:
            self.fault(state)
            return replace(v, bonus=eos[0])  # wrong: another EOS id is another token
        return v


class SeedlessPicks(Echo):
    bug = "memoises sampled picks on the instance keyed by position and logits, not by the seed"
    trigger = "a second sampled decode of the same prompt with another seed, on one instance"
    hook = "selfspec_verify"

    def verify(self, state, draft):
        v = verify_greedy(state, draft)
        if not state.sampling_on:
            return v
        memo = self.__dict__.setdefault("memo", {})  # kept across decodes, like a real cache
        # wrong: a position's pick depends on the seed too; the key leaves it out
        key = (state.length, hash(tuple(state.committed[-8:].tolist())))
        if key in memo and memo[key] != v.bonus and not v.accepted:
            self.fault(state)
            return replace(v, bonus=memo[key])
        memo.setdefault(key, v.bonus)
        return v


# ---------------------------------------------------------------- near-ties, tree masks, positions
class AcceptsNearTies(Echo):
    bug = "accepts a draft token whose logit is within 1e-3 of the top-1's"
    trigger = "a draft token near-tied with the model's top-1 (margin below 1e-3)"
    hook = "selfspec_verify"
    tolerance = 1e-3

    def verify(self, state, draft):
        if state.sampling_on or draft.parents is not None:
            return verify_greedy(state, draft)
        from selfspec._engine.reference import greedy

        base = state.length - 1
        ids = torch.cat([state.tokens[base : base + 1], draft.tokens])
        out = state.runner.forward(ids, cache=state.cache, start=base)
        logits = out.logits.to(torch.float64)  # [k+1, V]
        best = greedy(logits)
        a = 0
        for i, t in enumerate(draft.tokens.tolist()):
            # wrong: "close enough to the top-1" is not the top-1
            if float(logits[i, t]) < float(logits[i, best[i]]) - self.tolerance:
                break
            if t != int(best[i]):
                self.fault(state)
            a += 1
        return Verdict(tuple(draft.tokens[:a].tolist()), int(best[a]), tuple(range(a)), logits=out.logits)


class SiblingMaskRowDeep(Echo):
    bug = "a tree node's mask row copies its previous sibling's at depth 2 and below"
    trigger = "a tree draft with siblings below depth 1 (its own drafter makes chains only)"
    hook = "selfspec_verify"

    def verify(self, state, draft):
        if draft.parents is None:
            return verify_greedy(state, draft)
        from selfspec._engine.runner import masks
        from selfspec._engine.verification import _verdict, tree_path

        base = state.length - 1
        pl = draft.parents.tolist()
        depths = draft.depths()
        block = masks.tree(draft.parents)  # [k+1, k+1]
        right = block.clone()
        wrong_rows = set()
        for j, p in enumerate(pl):
            prev = [i for i in range(j) if pl[i] == p]
            if depths[j] >= 2 and prev:  # wrong: the row of node j is its sibling's, not its own
                block[j + 1] = block[prev[-1] + 1]
                wrong_rows.add(j)
        positions = masks.tree_positions(draft.parents, base)
        ids = torch.cat([state.tokens[base : base + 1], draft.tokens])
        at = positions + 1
        tokens = draft.tokens.tolist()

        def committed(pred: list[int]) -> tuple[list[int], list[int]]:
            path = tree_path(pl, tokens, pred)
            return path, [tokens[n] for n in path] + [pred[path[-1] + 1 if path else 0]]

        if wrong_rows:  # note the step when the wrong rows change what is committed, or are kept
            ok = state.runner.forward(ids, cache=state.cache, start=base, positions=positions,
                                      block_mask=right, write=False)
            _, ok_committed = committed(state.pick(ok.logits, at).tolist())
        out = state.runner.forward(ids, cache=state.cache, start=base, positions=positions, block_mask=block)
        pred = state.pick(out.logits, at).tolist()
        path, mine = committed(pred)
        if wrong_rows and (set(path) & wrong_rows or mine != ok_committed):
            self.fault(state)
        return _verdict(draft, path, pred, out.captured, (), out.logits)


class ClampsPositions(Echo):
    bug = "clamps position ids at 1010 (the tiny models hold 1024)"
    trigger = "the pending token past position 1010"
    hook = "selfspec_verify"
    at = 1010

    def verify(self, state, draft):
        base = state.length - 1
        if base <= self.at or draft.parents is not None:
            return verify_greedy(state, draft)
        from selfspec._engine.verification import chain_verdict

        self.fault(state)
        ids = torch.cat([state.tokens[base : base + 1], draft.tokens])
        positions = torch.arange(base, base + len(ids)).clamp(max=self.at)  # wrong: past it, one position
        out = state.runner.forward(ids, cache=state.cache, start=base, positions=positions)
        return chain_verdict(draft, out.logits, state=state)


#: Every mutant, in the order of the score table.
MUTANTS: tuple[type[Echo], ...] = (
    WrongBonusLate, WrongBonusVeryLate, PastMismatchLongPrompt, PastMismatchVeryLongPrompt,
    ShiftedSlotsDeep, ProposerOverwritesLong, PendingOverwrittenLate, StaleKVLate,
    SkipsCheckLongPrompt, SkipsCheckDeep, SkipsCheckLate, StepKeyedNoise,
    PastMismatchPrompt400, WrongTokenAfter200, WrongTokenGemmaLate, DropsSlotEvery130, EditsHeadInSetup,
    PolicyCorruptsKVLate, ForgetsTopK, EosAlias, SeedlessPicks, AcceptsNearTies, SiblingMaskRowDeep,
    ClampsPositions,
)
