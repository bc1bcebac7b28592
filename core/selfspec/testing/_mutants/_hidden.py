"""Mutants wrong where a kit that draws only greedy, one-EOS, chain-shaped, mid-length examples
never looks: sampling filters, several EOS ids, seeds across decodes, near-ties, tree masks
below depth 1, positions near the model's limit."""

from __future__ import annotations

from dataclasses import replace

import torch

from selfspec._engine.contract.builtin.verify import verify_greedy
from selfspec._engine.contract.types import Verdict
from selfspec.testing._mutants._echo import Echo


# ---------------------------------------------------------------- sampling filters, EOS ids, seeds
class ForgetsTopK(Echo):
    bug = "its sampler applies temperature and top-p but forgets top-k"
    trigger = "sampling with top-k on"
    hook = "selfspec_verify"

    def verify(self, state, draft):
        if not state.sampling_on or state.sampler.sampling.top_k == 0:
            return verify_greedy(state, draft)
        from selfspec._engine.contract.sampling import sample_tokens
        from selfspec._engine.contract.verification import accepted_length

        base = state.length - 1
        ids = torch.cat([state.tokens[base : base + 1], draft.tokens])
        out = state.runner.forward(ids, cache=state.cache, start=base)
        at = torch.arange(len(draft) + 1) + base + 1  # the right positions
        pred = sample_tokens(
            out.logits, at, replace(state.sampler.sampling, top_k=0)
        )  # wrong: no top-k
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


class AcceptsOtherEos(Echo):
    bug = (
        "accepts a drafted EOS id where the model predicts another EOS id (the decode stops "
        "either way)"
    )
    trigger = "two or more EOS ids, a draft holding one where the model's next token is another"
    hook = "selfspec_verify"

    def verify(self, state, draft):
        v = verify_greedy(state, draft)
        a = len(v.accepted)
        eos = state.eos_token_ids
        if draft.parents is not None or a >= len(draft):
            return v
        drafted = int(draft.tokens[a])
        if drafted in eos and v.bonus in eos and drafted != v.bonus:
            self.fault(state)  # wrong: another EOS id is another token, though both end the decode
            return Verdict((*v.accepted, drafted), v.bonus, tuple(range(a + 1)), logits=v.logits)
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
    float64_only = (
        "a wrong token within 1e-3 of the top-1 is within bf16's near-tie bound: a near-tie there"
    )

    def verify(self, state, draft):
        if state.sampling_on or draft.parents is not None:
            return verify_greedy(state, draft)
        from selfspec._engine.contract.reference import greedy

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
        return Verdict(
            tuple(draft.tokens[:a].tolist()), int(best[a]), tuple(range(a)), logits=out.logits
        )


class SiblingMaskRowDeep(Echo):
    bug = "a tree node's mask row copies its previous sibling's at depth 2 and below"
    trigger = "a tree draft with siblings below depth 1 (its own drafter makes chains only)"
    hook = "selfspec_verify"

    def verify(self, state, draft):
        if draft.parents is None:
            return verify_greedy(state, draft)
        from selfspec._engine.contract.verification import _verdict, tree_path
        from selfspec._engine.runner import masks

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
            ok = state.runner.forward(
                ids,
                cache=state.cache,
                start=base,
                positions=positions,
                block_mask=right,
                write=False,
            )
            _, ok_committed = committed(state.pick(ok.logits, at).tolist())
        out = state.runner.forward(
            ids, cache=state.cache, start=base, positions=positions, block_mask=block
        )
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
        from selfspec._engine.contract.verification import chain_verdict

        self.fault(state)
        ids = torch.cat([state.tokens[base : base + 1], draft.tokens])
        positions = torch.arange(base, base + len(ids)).clamp(
            max=self.at
        )  # wrong: past it, one position
        out = state.runner.forward(ids, cache=state.cache, start=base, positions=positions)
        return chain_verdict(draft, out.logits, state=state)
