"""The tree options every tree-drafting plugin shares, and what they ask for.

:func:`register_tree_options` declares them in ``selfspec_options``; :meth:`TreeConfig.from_options`
reads them back in ``selfspec_setup``, and :meth:`TreeConfig.draft` drafts a
:func:`~selfspec._engine.drafting.drafttree.draft_tree` after the decode's pending token (after a
composition's earlier members' best path with ``tree_extend``), learning a
:class:`TreeCalibration` of its draft probabilities from each verdict.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from selfspec._engine.contract.options import Option
from selfspec._engine.contract.treecost import check_budget
from selfspec._engine.contract.types import DecodeState
from selfspec._engine.drafting.drafttree import DraftStep, DraftTree, draft_tree
from selfspec._engine.drafting.ngram import NgramIndex
from selfspec._engine.runner import Runner
from selfspec._engine.runner.costcurve import cost_curve

#: The host's default for ``tree``: drafters that declare the tree options draft trees, verified
#: in one tree pass; on a CPU a verification of a few extra rows costs about one one-token step,
#: so the extra candidates are nearly free (docs/performance.md, "Draft trees"). ``tree=0``
#: restores a plugin's paper chain.
DEFAULT_TREE = True
#: The host's default for ``tree_guess``: tokens of the context's n-gram continuation run after the
#: best frontier node in every draft pass (:func:`~selfspec._engine.drafting.drafttree.draft_tree`'s
#: ``guess``), as many as the learned rate of agreement and the draft pass's measured cost per width
#: pay for: a right guess saves whole passes, a wrong one costs a few rows of one pass
#: (docs/performance.md, "Guesses in the draft").
DEFAULT_GUESS = 8
#: Weight kept by the guess-agreement evidence per drafted tree (a memory of about 50 trees), so
#: the rate follows the text: high where the output copies the context, low elsewhere.
GUESS_DECAY = 0.98
#: Weight kept by the accepted-tokens-per-tree evidence of ``tree_pause`` per verified tree (a
#: memory of about 10 trees). The evidence starts as one virtual tree with ``PAUSE_PRIOR``
#: accepted tokens, which fades like a real tree's.
PAUSE_DECAY = 0.9
PAUSE_PRIOR = 1.0
#: Longest pause in drafting, in steps: a paused drafter probes again at least this often.
MAX_PAUSE = 32


def register_tree_options(
    register: Callable[[Option], None],
    *,
    topk: int = 4,
    tree: bool = DEFAULT_TREE,
    guess: int = DEFAULT_GUESS,
) -> None:
    """Declare, in ``selfspec_options``, the tree options every drafter shares: ``tree`` (bool,
    default ``tree``, the host's ``True`` unless a plugin measured otherwise: draft a tree
    instead of a chain; on a CPU a verification pass over a few extra rows costs about one
    one-token step, so a tree of candidates is nearly free; ``tree=0`` restores a plugin's
    paper chain), ``tree_budget`` (``auto``: sized by the machine's cost curve; ``N``: the
    ``N`` most probable nodes), ``tree_topk`` (children per node and nodes expanded per depth),
    ``tree_calibrate`` (bool, default on: score nodes by a :class:`TreeCalibration` learned
    online), ``tree_extend`` (bool, default on: in a composition, draft after the earlier
    members' best path, :attr:`selfspec.DecodeState.prior`), ``tree_guess`` (int, tokens,
    default ``guess``, the host's ``DEFAULT_GUESS`` unless a plugin measured otherwise; ``0`` is
    off: run up to that many tokens of the context's n-gram continuation after the best node of
    every draft pass, :func:`selfspec.draft_tree`'s ``guess``) and ``tree_pause`` (bool, default
    on: skip drafting for 1, 2, 4, ... steps, at most 32, each pause followed by one probing
    tree, while the accepted tokens per recent tree are below the first draft pass's cost in
    full forwards; :meth:`TreeConfig.paying`). Read them back with
    :meth:`TreeConfig.from_options`. selfsd, clasp, hispec and qspec use it."""
    register(
        Option(
            "tree",
            bool,
            tree,
            "draft a dynamic tree (top-k candidates at each depth, grown by "
            "cumulative draft probability) instead of a chain; verified in one tree pass",
        )
    )
    register(
        Option(
            "tree_budget",
            str,
            "auto",
            "most nodes of a tree draft: 'auto' (the size that maximises "
            "expected tokens per unit of cost, from this machine's measured "
            "cost-per-width curve) or N",
            check=check_budget,
        )
    )
    register(
        Option(
            "tree_topk",
            int,
            topk,
            "tree drafts: children kept per node and nodes expanded per depth",
            min=1,
            max=16,
        )
    )
    register(
        Option(
            "tree_calibrate",
            bool,
            True,
            "tree drafts: score nodes by how often nodes of their draft "
            "probability were accepted so far (learned online) instead of the raw probability",
        )
    )
    register(
        Option(
            "tree_extend",
            bool,
            True,
            "tree drafts in a composition: grow the tree after the best path "
            "the earlier members drafted (scored by this draft in its first pass) "
            "instead of beside it",
        )
    )
    register(
        Option(
            "tree_guess",
            int,
            guess,
            "tree drafts: each draft pass also runs up to this many "
            "tokens that followed the best node's last n-gram earlier in the context "
            "(prompt lookup inside the draft), so a right guess grows several depths in one pass; "
            "0: off",
            min=0,
            max=32,
        )
    )
    register(
        Option(
            "tree_pause",
            bool,
            True,
            "tree drafts: skip drafting for 1, 2, 4, ... steps (at most "
            f"{MAX_PAUSE}, then one probing tree) while recent trees had fewer tokens accepted "
            "than their first draft pass costs in full forwards",
        )
    )


class TreeCalibration:
    """How often a tree node is accepted, given its parent was, by its own draft probability.

    A layer-skipping draft's probabilities are typically underconfident for greedy
    verification (a top token at 0.3 may match the full model's argmax most of the time:
    SmolLM2-135M with selfsd's skip set accepted nodes at ``p`` 0.2-0.4 78 % of the time,
    ``lab/results/smollm2-135m-instruct/tree-calibration-*``), so sizing trees by them
    under-drafts. This learns the map online from verified trees: per bin
    of the raw probability ``p`` (``bins`` equal bins of ``[0, 1]``), ``(accepted + prior * p)
    / (seen + prior)``, the raw ``p`` until evidence accumulates. Call it as ``calibrate(p)``;
    :meth:`observe` ``(tree, accepted_nodes)`` counts a verified tree.
    """

    def __init__(self, bins: int = 10, prior: float = 4.0) -> None:
        self.bins, self.prior = bins, prior
        self.seen = [0] * bins
        self.accepted = [0] * bins

    def __call__(self, p: float) -> float:
        b = min(int(p * self.bins), self.bins - 1)
        return (self.accepted[b] + self.prior * p) / (self.seen[b] + self.prior)

    def observe(self, tree: DraftTree, accepted_nodes: Sequence[int]) -> None:
        """Count the nodes of a verified ``tree`` whose parent was accepted (or is the pending
        token): accepted or not, by their raw probability ``tree.local``."""
        on = set(accepted_nodes)
        for i, (parent, p) in enumerate(zip(tree.parents.tolist(), tree.local)):
            if parent < 0 or parent in on:
                b = min(int(p * self.bins), self.bins - 1)
                self.seen[b] += 1
                self.accepted[b] += i in on


@dataclass
class TreeConfig:
    """What the tree options ask for: ``enabled``; ``budget`` (``None`` = auto); ``topk``;
    ``curve``, the machine's cost curve (loaded or measured by :meth:`from_options` when the
    budget is auto, else ``None``); ``draft_curve``, the draft passes' curve on the draft weights
    given to :meth:`from_options` (``None`` without them or without ``curve``); ``calibration``, a
    :class:`TreeCalibration` learned from this plugin's verified trees (``None``: raw draft
    probabilities); ``pause`` (``tree_pause``: skip drafting while it does not pay,
    :meth:`paying`) and ``paused``, the steps it skipped; ``extend`` (``tree_extend``) and
    ``guess`` (``tree_guess``: tokens per guess, ``0`` off). One per plugin instance: it keeps
    the last tree (``last``) until :meth:`observe` sees its verdict.

    Built by :meth:`from_options` in ``selfspec_setup``; :meth:`draft` drafts (an empty tree
    while paused, which can never change the output), :meth:`pass_cost` is the ``draft_cost``
    to pass, and :meth:`observe` in ``selfspec_update_policy`` feeds its verdict to the
    calibration and the pause. A plugin's tree mode is then one call::

        step = selfspec.skip_layer_step(state.runner, state.cache, skip_mlp=self.skip)
        return self.tree.draft(step, state, max_depth=k, draft_cost=0.5).draft(owner=self)
    """

    enabled: bool = False
    budget: int | None = None
    topk: int = 4
    curve: Any = None
    calibration: TreeCalibration | None = None
    draft_curve: Any = None
    last: DraftTree | None = None
    extend: bool = True
    guess: int = DEFAULT_GUESS
    pause: bool = False
    paused: int = 0  # steps this config skipped drafting in (tree_pause), over its lifetime
    _index: NgramIndex | None = field(default=None, repr=False)
    _decode: Any = field(default=None, repr=False)  # a weak reference to the decode's state
    _guessed: list[float] = field(
        default_factory=lambda: [0.0, 0.0], repr=False
    )  # judged, agreed (decayed)
    _gain: list[float] = field(
        default_factory=lambda: [1.0, PAUSE_PRIOR], repr=False
    )  # trees, accepted (decayed)
    _skip: int = field(default=0, repr=False)  # steps left in the current pause
    _next_pause: int = field(default=1, repr=False)  # length of the next pause
    _probe: bool = field(
        default=False, repr=False
    )  # the step after a pause drafts, whatever the estimate

    @classmethod
    def from_options(
        cls, options: dict[str, Any], runner: Runner, *, weights: Any = None
    ) -> TreeConfig:
        """The config of :func:`register_tree_options`' options; call in ``selfspec_setup``.
        With ``tree`` on and an ``auto`` budget it fetches :func:`selfspec.provisional.cost_curve`
        (measured once per model shape and machine, then read from the cache) and, given the
        plugin's draft ``weights`` (:func:`selfspec.draft_weights`), the curve of draft passes on
        them (``draft_curve``: a pass on compressed weights grows with its width unlike a
        full one)."""
        enabled = bool(options.get("tree", False))
        spec = str(options.get("tree_budget", "auto")).strip().lower()
        budget = None if spec == "auto" else int(spec)
        curve = draft_curve = None
        if enabled and budget is None:
            curve = cost_curve(runner)
            draft_curve = None if weights is None else cost_curve(runner, weights=weights)
        calibration = TreeCalibration() if options.get("tree_calibrate", True) else None
        return cls(
            enabled,
            budget,
            int(options.get("tree_topk", 4)),
            curve,
            calibration,
            draft_curve=draft_curve,
            extend=bool(options.get("tree_extend", True)),
            guess=int(options.get("tree_guess", DEFAULT_GUESS)),
            pause=bool(options.get("tree_pause", False)),
        )

    def draft(
        self,
        step: DraftStep,
        state: DecodeState,
        *,
        max_depth: int,
        draft_cost: float,
        vocab: torch.Tensor | None = None,
        draft_curve: Callable[[int], float] | None = None,
    ) -> DraftTree:
        """:func:`draft_tree` after ``state``'s pending token, at its slot, within the cache's room.

        With ``extend`` in a composition (``state.prior`` set), the tree grows after the earlier
        members' best path (:meth:`selfspec.Draft.best_path`) as ``prefix``, cut by its node
        values (``prefix_probs``) where it stops paying for its rows, and ``max_depth``
        counts from its end (within ``state.max_draft_depth``). With ``guess`` on, every pass runs
        the context's guess (:meth:`guesser`) at the rate of agreement learned from earlier trees
        (:attr:`guess_rate`). ``draft_curve``: the draft pass's cost curve (``draft_tree``'s;
        default: the config's own :attr:`draft_curve`). With ``pause``, a step :meth:`paying`
        refuses gets an empty tree, counted in ``state.stats.extra["tree_paused"]``."""
        base = state.length - 1
        if self.pause and not self.paying(draft_cost):
            self.paused += 1
            extra = state.stats.extra  # the decode's count, in its stats: "tree_paused"
            extra["tree_paused"] = extra.get("tree_paused", 0) + 1
            self.last = DraftTree(
                state.tokens[:0], state.tokens[:0], torch.zeros(0, device=state.tokens.device)
            )
            return self.last
        prefix: list[int] = []
        values = None
        if self.extend and state.prior is not None:
            nodes, ids = state.prior.best_nodes(), state.prior.tokens.tolist()
            prefix = [ids[i] for i in nodes]
            if (
                state.prior.probs is not None
            ):  # the composition's node values: the prefix is cut where it stops paying
                probs = state.prior.probs.tolist()
                values = [probs[i] for i in nodes]
        if prefix:
            max_depth = min(max_depth + len(prefix), state.max_draft_depth)
        self.last = draft_tree(
            step,
            state.tokens[base : base + 1],
            base,
            max_depth=max_depth,
            topk=self.topk,
            budget=self.budget,
            cost=self.curve,
            draft_cost=draft_cost,
            room=state.cache.capacity - base - 1,
            vocab=vocab,
            calibrate=self.calibration,
            prefix=prefix,
            prefix_probs=values,
            guess=self.guesser(state),
            guess_rate=self.guess_rate,
            draft_curve=self.draft_curve if draft_curve is None else draft_curve,
        )
        g = self._guessed
        g[0], g[1] = g[0] * GUESS_DECAY + self.last.guessed, g[1] * GUESS_DECAY + self.last.agreed
        return self.last

    def pass_cost(self, share: float = 1.0, default: float | None = None) -> float:
        """A one-token draft pass's cost in one-token forwards of the full model, for
        :meth:`draft`'s ``draft_cost``: ``share`` (the fraction of the model's blocks the draft
        runs) times the measured :attr:`~selfspec.provisional.CostCurve.relative` of the draft
        passes' curve (a pass on the draft weights against a full forward, timed together: what
        a compressed copy saves, measured here). Without that measurement (no draft weights, a
        fixed budget): ``share`` times ``default`` (the plugin's estimate; 1.0 when ``None``: the
        model's own weights)."""
        relative = getattr(self.draft_curve, "relative", None)
        if relative is None:
            relative = 1.0 if default is None else default
        return max(0.0, float(share)) * float(relative)

    def paying(self, draft_cost: float) -> bool:
        """With ``pause``: whether to draft this step. A tree pays when the tokens it gets accepted
        (each saves a full forward) outweigh its first draft pass (``draft_cost`` full forwards;
        deeper passes are the tree sizing's to justify). The estimate is the accepted tokens per
        verified tree, each tree kept at :data:`PAUSE_DECAY`, from a virtual first tree with
        :data:`PAUSE_PRIOR` accepted.
        Below ``draft_cost`` the drafter pauses for 1, 2, 4, ... steps (at most
        :data:`MAX_PAUSE`), then drafts one probing tree; a tree that restores the estimate resets
        the pauses. Pausing only drafts nothing, so it can never change the output."""
        if self._skip > 0:  # within a pause
            self._skip -= 1
            return False
        if self._probe:  # a pause just ended: one tree to learn from
            self._probe = False
            return True
        trees, accepted = self._gain
        if accepted / trees >= draft_cost:
            self._next_pause = 1
            return True
        self._skip, self._probe = self._next_pause - 1, True  # this step is the pause's first
        self._next_pause = min(2 * self._next_pause, MAX_PAUSE)
        return False

    @property
    def guess_rate(self) -> float:
        """How often a guessed token was the draft's own first choice when the guessed tokens
        before it were: ``(agreed + 1) / (judged + 2)`` over this plugin's recent trees
        (weighted by :data:`GUESS_DECAY` per tree), one half before any evidence."""
        return (self._guessed[1] + 1.0) / (self._guessed[0] + 2.0)

    def guesser(self, state: DecodeState) -> Callable[[list[int]], Sequence[int]] | None:
        """``guess(path)`` for :func:`draft_tree`: up to ``guess`` tokens that followed the
        longest n-gram (3 down to 2 tokens) ending the committed tokens + ``path`` earlier in
        them (:meth:`selfspec.NgramIndex.lookup`); ``None`` when ``guess`` is 0. The index
        follows the decode: extended by the newly committed tokens each step, rebuilt for a new
        decode."""
        if self.guess <= 0:
            return None
        committed = state.length
        if (
            self._index is None
            or self._decode is None
            or self._decode() is not state
            or len(self._index) > committed
        ):
            self._index, self._decode = NgramIndex(3, 2), weakref.ref(state)
        if len(self._index) < committed:
            self._index.extend(state.tokens[len(self._index) : committed].tolist())
        index, k = self._index, self.guess
        return lambda path: index.lookup(path, k)

    def observe(self, verdict: Any) -> None:
        """Learn from the verdict of the last tree drafted (call in ``selfspec_update_policy``):
        its accepted tokens for :meth:`paying`, its nodes for the calibration. A no-op without a
        tree or when the host cut the tree."""
        tree, self.last = self.last, None
        if tree is None or not len(tree):
            return
        nodes = tuple(verdict.accepted_nodes)
        if any(n >= len(tree) for n in nodes):
            return
        gain = self._gain
        gain[0], gain[1] = gain[0] * PAUSE_DECAY + 1.0, gain[1] * PAUSE_DECAY + len(nodes)
        if self.calibration is not None:
            self.calibration.observe(tree, nodes)
