"""Composed drafts: several method plugins propose into one tree, verified in one pass.

``Decoder(model, "lookup+selfsd")`` (or ``["lookup", "selfsd"]``, ``specdec --plugin
lookup+selfsd``) registers a :class:`Composer` as the decode's method plugin. It holds every
member's own plugin manager and instance (with the member's own options, ``selfsd.gamma=...``),
and each step:

1. asks the members to propose, cheapest first (:meth:`Composer.order`), each from the same
   cache state (the cache is cropped back to the committed prefix after every member), skipping
   a member the cheap-first rule finds not worth its cost once a draft exists (predicted by
   :func:`~selfspec._engine.contract.composetree.worth_calling` until the tokens per forward of the
   steps that called it and of those that skipped it, or would have (option ``counterfactual``), are
   measured, :class:`~selfspec._engine.contract.composetree.CallOutcomes`); a member sees the draft
   merged so far as ``state.prior`` (valued by
   :func:`~selfspec._engine.contract.composetree.node_values`), which it may extend; every member
   draft is checked and cut like a single plugin's and any error names the member;
2. merges the drafts into one trie (a shared prefix is one node, each node remembers its
   members) and keeps the nodes that maximise expected committed tokens per unit of cost on
   the machine's cost-per-width curve (option ``budget``);
3. hands the merged draft to the host, whose verifier checks it in one forward (the same
   verifier, tree mask and near-tie rule as any plugin's draft: lossless by construction);
4. gives each member that proposed its own verdict in ``selfspec_update_policy``: the longest
   prefix of the committed path that lies in its draft, its node ids, the committed token after
   it as the bonus, the slots, logits rows and hidden rows of those positions: what verifying
   its draft alone would have said.

A member's ``selfspec_verify`` and ``selfspec_cache`` are never called: a plugin that has them
joins only when it declares ``composable = True`` (they are optimisations it does without);
``composable = False`` refuses always (``docs/composition.md``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pluggy
import torch

from selfspec._engine.contract import hookspecs, plugins
from selfspec._engine.contract.composetree import (
    CallOutcomes,
    MemberStats,
    Trie,
    committed_path,
    cut,
    node_values,
    without_member,
    worth_calling,
)
from selfspec._engine.contract.draftcheck import (
    check_draft_kept,  # the host's own draft checks, blamed on the member
)
from selfspec._engine.contract.markers import PROJECT, hookimpl
from selfspec._engine.contract.options import Option
from selfspec._engine.contract.plugins import (
    SEPARATOR,
    PluginError,
    _Manager,
    blocked,
    declared_options,
    hook_names,
    instantiate,
)
from selfspec._engine.contract.treecost import check_budget
from selfspec._engine.contract.types import DecodeState, Draft, Verdict
from selfspec._engine.runner.costcurve import cost_curve

#: Joins member names: ``lookup+selfsd``.
#: A member's hooks a composition never calls (the host verifies and keeps the cache).
PRIVATE_HOOKS = ("selfspec_verify", "selfspec_cache")


def composable(obj: Any, hooks: Sequence[str]) -> str | None:
    """Why the plugin ``obj`` (implementing ``hooks``) cannot join a composition, or None.

    Its ``composable`` attribute decides when it has one; without it, a plugin joins unless it
    implements ``selfspec_verify`` or ``selfspec_cache``."""
    declared = getattr(obj, "composable", None)
    if declared is False:
        return "declares composable = False"
    own = [h for h in PRIVATE_HOOKS if h in hooks]
    if own and declared is not True:
        return (
            f"implements {' and '.join(own)}, which a composition never calls, "
            "and does not declare composable = True (that it decodes correctly without them)"
        )
    return None


@dataclass
class Member:
    """One member: its name, own plugin manager, instance and running statistics."""

    name: str
    index: int
    pm: pluggy.PluginManager
    plugin: Any
    stats: MemberStats = field(default_factory=MemberStats)
    outcomes: CallOutcomes = field(
        default_factory=CallOutcomes
    )  # the cheap-first rule's measured choices
    counters: dict[str, int] = field(default_factory=dict)

    def call(self, hook: str, **kwargs: Any) -> Any:
        return plugins.call_hook(self.pm, self.name, hook, **kwargs)


def load_member(name: str, index: int, obj: Any = None) -> Member:
    """A member's own plugin manager (the hook specs and the member, no built-ins), strict as
    the host's; a plugin that cannot join is a ``PluginError`` naming it."""
    if not name:
        raise PluginError(
            name, f"a composed plugin name has an empty member (use NAME{SEPARATOR}NAME)"
        )
    if name in blocked():
        raise PluginError(name, "is blocked by SELFSPEC_BLOCK_PLUGINS")
    obj = (
        obj if obj is not None else plugins._load_object(name)
    )  # looked up at call time (tests replace it)
    if obj is None:
        raise PluginError(
            name, "proposes nothing (the built-in vanilla): it cannot be a member of a composition"
        )
    pm = _Manager(PROJECT)
    pm.add_hookspecs(hookspecs)
    try:
        instance = instantiate(obj)
        pm.register(instance, name=name)
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(name, str(exc)) from exc
    except Exception as exc:
        raise PluginError(name, f"cannot be registered: {exc}") from exc
    hooks = hook_names(pm, instance)
    if "selfspec_propose" not in hooks:
        raise PluginError(
            name, "implements no selfspec_propose: it cannot be a member of a composition"
        )
    why = composable(instance, hooks)
    if why:
        raise PluginError(name, f"cannot join a composition: it {why}")
    return Member(name, index, pm, instance)


@dataclass
class _Proposal:
    """One member's part of a step: its (checked, cut) draft, where its nodes went in the trie."""

    member: Member
    tokens: list[int]
    parents: list[int] | None
    where: list[int]
    seconds: float
    kept: tuple[int, ...] = ()  # each node's index in the member's draft as proposed


class Composer:
    """The method plugin of a composed decode (see the module docstring)."""

    #: A composition is not itself a member of another.
    composable = False

    def __init__(self, name: str, members: list[Member]) -> None:
        self.name = name
        self.members = members
        self.budget: int | None = None
        self.cheap_first = True
        self.counterfactual = True
        self.curve: Callable[[int], float] | None = None
        self.forward_s = 0.0  # running one-token full-forward seconds (from the verify phase)
        self.forward_w = 0.0
        self.observers: list[
            Any
        ] = []  # the decoder's observers (the audit), told of each member's hooks
        self._step: list[_Proposal] = []
        self._judged: list[
            tuple[Member, bool]
        ] = []  # (member, called) where the cheap-first rule chose
        self._t_start = 0.0
        self._remap: dict[int, int] = {}
        self._width = 1
        self._verified: tuple[list[int], list[int], list[set[int]]] = ([], [], [])
        self._t_proposed = 0.0

    @classmethod
    def build(cls, name: str, members: Sequence[str], objects: Any = None) -> Composer:
        """The composer of ``members`` (entry-point names); ``objects``: a mapping ``{member:
        class, module or instance}`` used instead of installed entry points."""
        if len(members) < 2:
            raise PluginError(
                name, f"a composition needs two members or more (NAME{SEPARATOR}NAME)"
            )
        twice = sorted({m for m in members if members.count(m) > 1})
        if twice:
            raise PluginError(name, f"member {twice[0]!r} is named twice")
        objects = objects if isinstance(objects, dict) else {}
        return cls(name, [load_member(m, i, objects.get(m)) for i, m in enumerate(members)])

    # ------------------------------------------------------------------------------ lifecycle
    @hookimpl
    def selfspec_options(self, register: Callable[[Option], None]) -> None:
        register(
            Option(
                "budget",
                str,
                "auto",
                "most nodes of the merged draft: 'auto' (the nodes that maximise "
                "expected tokens per unit of cost on this machine's cost curve) or N",
                check=check_budget,
            )
        )
        register(
            Option(
                "cheap_first",
                bool,
                True,
                "skip a member whose expected extra accepted tokens do not pay "
                "for its proposing and verify cost, given the draft the cheaper members made",
            )
        )
        register(
            Option(
                "counterfactual",
                bool,
                True,
                "measure what skipping a member gives from the steps that "
                "call it (the step less its nodes and its proposing time), "
                "instead of skipping it to find out",
            )
        )
        for m in self.members:
            for opt in declared_options(m.pm).values():
                register(_prefixed(opt, m.name))

    @hookimpl
    def selfspec_setup(self, runner: Any, options: dict[str, Any], tokenizer: Any) -> None:
        spec = str(options["budget"]).strip().lower()
        self.budget = None if spec == "auto" else int(spec)
        self.cheap_first = bool(options["cheap_first"])
        self.counterfactual = bool(options["counterfactual"])
        self.curve = cost_curve(runner)
        for m in self.members:
            own = {k.split(".", 1)[1]: v for k, v in options.items() if k.startswith(f"{m.name}.")}
            m.call("selfspec_setup", runner=runner, options=own, tokenizer=tokenizer)

    @hookimpl
    def selfspec_start(self, state: DecodeState) -> None:
        for m in self.members:
            m.counters = {"proposed": 0, "skipped": 0, "drafted": 0, "accepted": 0, "longest": 0}
            m.outcomes = CallOutcomes()  # each decode's text decides its own: measured afresh
            m.call("selfspec_start", state=state)
        state.stats.members = {m.name: m.counters for m in self.members}

    @hookimpl
    def selfspec_end(self, state: DecodeState, result: Any) -> None:
        for m in self.members:
            m.call("selfspec_end", state=state, result=result)

    # ------------------------------------------------------------------------------ the step
    @hookimpl
    def selfspec_propose(self, state: DecodeState) -> Draft:

        base = state.length - 1
        dev = state.runner.device
        trie = Trie()
        self._step, self._judged = [], []
        self._t_start = time.perf_counter()
        capture: set[int] = set()
        spent = 0.0  # proposing cost so far, in one-token forwards
        stats = [m.stats for m in self.members]
        for m in self.order():
            values = node_values(trie, stats) if len(trie) else []
            if self.cheap_first and values and self.curve is not None and self.forward_w:
                called = m.outcomes.choose(
                    worth_calling(m.stats, sum(values), len(trie), spent, self.curve)
                )
                self._judged.append((m, called))
                if not called:
                    m.stats.skipped()
                    m.counters["skipped"] += 1
                    continue
            state.capture_layers = None
            state.prior = _merged(trie, values, dev) if values else None
            t0 = time.perf_counter()
            try:
                raw = m.call("selfspec_propose", state=state)
            finally:
                state.prior = None
            seconds = time.perf_counter() - t0
            state.cache.crop(
                base
            )  # the next member (and the verifier) start from the committed prefix
            self._watch(state, m.name, "selfspec_propose")
            draft, kept = check_draft_kept(Draft.empty(dev) if raw is None else raw, state, m.name)
            capture.update(state.capture_layers or ())
            tokens = draft.tokens.tolist()
            parents = draft.parents.tolist() if draft.parents is not None else None
            probs = draft.probs.tolist() if draft.probs is not None else None
            self._step.append(
                _Proposal(
                    m, tokens, parents, trie.add(tokens, parents, m.index, probs), seconds, kept
                )
            )
            m.counters["proposed"] += 1
            spent += self.forwards(seconds)
        state.capture_layers = tuple(sorted(capture)) or None
        keep = cut(
            node_values(trie, stats),
            self.curve if self.budget is None else None,
            spent,
            self.budget,
        )
        tokens, parents, self._remap = trie.subtree(keep)
        self._width = len(tokens) + 1
        self._verified = (tokens, parents, [trie.owners[i] for i in sorted(keep)])
        self._t_proposed = time.perf_counter()
        ids = torch.tensor(tokens, dtype=torch.long, device=dev)
        if parents == list(range(-1, len(parents) - 1)):
            return Draft(ids, None, owner=self)  # a chain: the chain verifier
        return Draft(ids, torch.tensor(parents, dtype=torch.long, device=dev), owner=self)

    @hookimpl
    def selfspec_update_policy(self, state: DecodeState, verdict: Verdict) -> None:
        seconds = time.perf_counter() - self._t_proposed  # verify, cache and commit of this step
        if self.curve is not None:
            self.forward_s += seconds / self.curve(self._width)
            self.forward_w += 1.0
        step, self._step = self._step, []
        if self._judged:  # the cheap-first choices of this step, and what the step gave
            took = self.forwards(time.perf_counter() - self._t_start)
            for m, called in self._judged:
                m.outcomes.observe(
                    called,
                    len(verdict.committed),
                    took,
                    self.without(m, step, verdict, took, self.forwards(seconds))
                    if called
                    else None,
                )
        mine = [self.member_verdict(p, verdict) for p in step]
        longest = max((len(v.accepted) for v in mine), default=0)
        for p, v in zip(step, mine):
            m = p.member
            kept = [i for i, n in enumerate(p.where) if n in self._remap]
            depth = 0
            depths: list[int] = []
            for i in range(len(p.tokens)):
                par = (i - 1) if p.parents is None else p.parents[i]
                depths.append(1 if par < 0 else depths[par] + 1)
            depth = max((depths[i] for i in kept), default=0)
            m.stats.observe(depth, len(v.accepted), len(kept))
            if self.forward_s:
                m.stats.observe_cost(self.forwards(p.seconds))
            m.counters["drafted"] += len(kept)
            m.counters["accepted"] += len(v.accepted)
            m.counters["longest"] += bool(v.accepted) and len(v.accepted) == longest
            m.call("selfspec_update_policy", state=state, verdict=v, kept=p.kept)
            self._watch(state, m.name, "selfspec_update_policy")

    # ------------------------------------------------------------------------------ helpers
    def forwards(self, seconds: float) -> float:
        """``seconds`` in one-token full forwards: over the mean one-forward time measured from
        the verify phases so far (0 before any was measured)."""
        return seconds * self.forward_w / self.forward_s if self.forward_s else 0.0

    def without(
        self, m: Member, step: Sequence[_Proposal], verdict: Verdict, took: float, verify: float
    ) -> tuple[int, float] | None:
        """``(tokens, forwards)`` this step would have given without ``m`` (which it called
        after a cheaper draft): the path through the other members' verified nodes
        (:func:`~selfspec._engine.contract.composetree.without_member`), for the step's forwards
        less ``m``'s proposing time and its nodes' share of the verification (``verify`` forwards,
        scaled on the cost curve); None with ``counterfactual`` off or before a cost is known."""
        if not self.counterfactual or self.curve is None or not took:
            return None
        tokens, width = without_member(verdict.committed, *self._verified, m.index)
        own = sum(self.forwards(p.seconds) for p in step if p.member is m)
        saved = verify * (1.0 - self.curve(width) / self.curve(self._width))
        return tokens, max(took - own - saved, 1e-9)

    def order(self) -> list[Member]:
        """Members in proposing order: by measured proposing cost, cheapest first (a member not
        measured yet counts as free); ties in the order given."""
        return sorted(self.members, key=lambda m: (m.stats.mean_cost() or 0.0, m.index))

    def member_verdict(self, p: _Proposal, verdict: Verdict) -> Verdict:
        """The verdict of ``p``'s own draft: the longest prefix of the committed path that lies
        among its nodes the merged draft kept, the committed token after it, and that path's
        slots, logits rows and hidden rows in the verified block."""
        committed = verdict.committed
        children: dict[int, dict[int, int]] = {}
        for i, tok in enumerate(p.tokens):
            if p.where[i] in self._remap:
                par = (i - 1) if p.parents is None else p.parents[i]
                children.setdefault(par, {}).setdefault(tok, i)
        path = committed_path(children, committed)
        a = len(path)
        merged = [self._remap[p.where[i]] for i in path]
        logits = None
        if verdict.logits is not None and all(n in self._remap for n in p.where):
            rows = [0] + [self._remap[n] + 1 for n in p.where]
            if rows == list(range(len(rows))):
                logits = verdict.logits[: len(rows)]  # a view: the member's nodes lead the block
            else:
                logits = verdict.logits.index_select(
                    0, torch.tensor(rows, device=verdict.logits.device)
                )
        hidden = (
            None if verdict.hidden is None else {k: h[: a + 1] for k, h in verdict.hidden.items()}
        )
        return Verdict(
            accepted=tuple(committed[:a]),
            bonus=int(committed[a]),
            accepted_nodes=tuple(path),
            kv_slots=(0, *(n + 1 for n in merged)),
            forwards=verdict.forwards,
            hidden=hidden,
            logits=logits,
        )

    def _watch(self, state: DecodeState, member: str, hook: str) -> None:
        """Tell the decoder's observers (the audit) that ``member`` finished ``hook``, so a
        broken rule is blamed on the member, not on the composition."""
        for observer in self.observers:
            check = getattr(observer, "member", None)
            if check is not None:
                check(state, member, hook)


def _merged(trie: Trie, values: Sequence[float], device: torch.device) -> Draft:
    """The merged draft so far, its nodes valued by :func:`node_values` (``state.prior``)."""
    return Draft(
        torch.tensor(trie.tokens, dtype=torch.long, device=device),
        torch.tensor(trie.parents, dtype=torch.long, device=device),
        probs=torch.tensor(values, dtype=torch.float32, device=device),
    )


def _prefixed(opt: Option, member: str) -> Option:
    """A member's option under the composition's name for it: ``selfsd.gamma``."""
    return replace(opt, name=f"{member}.{opt.name}")
