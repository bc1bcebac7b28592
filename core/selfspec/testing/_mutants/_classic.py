"""Mutants wrong past a length, a depth or a step: long prompts, late output tokens, deep drafts,
KV slots, the update policy, the model's weights."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from selfspec._engine.contract.builtin.verify import verify_greedy
from selfspec._engine.contract.markers import hookimpl
from selfspec._engine.contract.types import Draft, Verdict
from selfspec.testing._mutants._echo import Echo, _accept_all


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
        self._stale = [
            (
                k[:, :, base + 1 : base + 1 + len(draft)].clone(),
                v[:, :, base + 1 : base + 1 + len(draft)].clone(),
            )
            if k is not None
            else None
            for k, v in zip(c.keys, c.values)
        ]
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
        return (
            _accept_all(state, draft)
            if state.prompt_length >= self.at
            else verify_greedy(state, draft)
        )


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
        return (
            _accept_all(state, draft) if state.generated >= self.at else verify_greedy(state, draft)
        )


class StepKeyedNoise(Echo):
    bug = "samples with noise keyed by the step, not the position"
    trigger = "sampling, after a step that accepted a draft"

    def verify(self, state, draft):
        if not state.sampling_on:
            return verify_greedy(state, draft)
        from selfspec._engine.contract.sampling import sample_tokens
        from selfspec._engine.contract.verification import accepted_length

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
