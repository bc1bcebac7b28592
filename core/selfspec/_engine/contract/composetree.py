"""The arithmetic of a composed draft: the merged trie, its budget, and the cheap-first rule.

Pure functions and small records, no model: :mod:`selfspec._engine.contract.compose` calls them
each step.

* :class:`Trie` merges the members' drafts (chains or trees) into one tree: a node is a path
  from the pending token, so a shared prefix is one node and a token two members propose at
  the same place is one node that remembers both (``owners``).
* :class:`MemberStats` keeps a member's running statistics: how often its drafts reach and pass
  each depth, its accepted-length histogram, its proposing cost, its draft size. Exponentially
  weighted (``DECAY`` per observed step), so they follow the text.
* :func:`node_values` scores every merged node by the probability that verification accepts it
  (from the proposing members' per-depth acceptance); :func:`cut` keeps the nodes that
  maximise expected committed tokens per unit of cost on the machine's cost-per-width curve
  (the same rule as ``draft_tree``'s ``choose_size``).
* :func:`worth_calling` is the cheap-first rule's prediction: call a member only when its
  expected extra accepted tokens pay for its proposing cost and its nodes' verify cost.
  :class:`CallOutcomes` then measures the rule's two choices: tokens committed per forward of
  the steps in which the member was called after a cheaper draft, and of those in which it
  was skipped, or would have been (:func:`without_member`: a step that called it, less its
  nodes and its proposing time). Once both are measured the faster one decides (the member's
  own statistics are gathered only on the steps it is called, which the rule picks: they
  cannot say what it would have given on the steps it skipped).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from selfspec._engine.contract.treecost import choose_size

#: Weight kept by a member's statistics per step in which it proposed: an effective memory of
#: ``1 / (1 - DECAY)`` = 50 of its steps. A step in which it was skipped ages its
#: accepted-length histogram by the same factor (:meth:`MemberStats.skipped`).
DECAY = 0.98
#: Decayed steps of evidence each of :class:`CallOutcomes`' two choices needs before the
#: measured rates decide; a choice whose evidence aged below it is taken again (explored).
MIN_OUTCOMES = 2.0
#: Pseudo-steps of the optimistic prior in :meth:`MemberStats.expected_gain`: beside a member's
#: observed accepted lengths, one step in which it reached its deepest accepted length so far.
#: Negligible while the member is called (about 1 in 50), it takes over as skipped steps age
#: the evidence, so a member skipped for long is called again and its statistics follow the text.
OPTIMISM = 1.0


@dataclass
class Trie:
    """Merged draft: ``tokens[i]``, ``parents[i]`` (``-1`` = the pending token, ``parents[i] <
    i``), ``owners[i]`` the members (by index) that proposed node ``i``, ``probs[i]`` the
    acceptance probabilities those members gave it (``{member: p}``, only members whose draft
    carried ``probs``)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    owners: list[set[int]] = field(default_factory=list)
    probs: list[dict[int, float]] = field(default_factory=list)
    _index: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)

    def add(
        self,
        tokens: Sequence[int],
        parents: Sequence[int] | None,
        owner: int,
        probs: Sequence[float] | None = None,
    ) -> list[int]:
        """Merge one member's draft (``parents`` None: a chain; ``probs``: its own estimate of
        each node's acceptance probability, or None); returns the merged node of each of its
        nodes."""
        where: list[int] = []
        for i, tok in enumerate(tokens):
            p = (i - 1) if parents is None else parents[i]
            parent = -1 if p < 0 else where[p]
            key = (parent, int(tok))
            node = self._index.get(key)
            if node is None:
                node = self._index[key] = len(self.tokens)
                self.tokens.append(int(tok))
                self.parents.append(parent)
                self.owners.append(set())
                self.probs.append({})
            self.owners[node].add(owner)
            if probs is not None:
                self.probs[node][owner] = float(probs[i])
            where.append(node)
        return where

    def __len__(self) -> int:
        return len(self.tokens)

    def depths(self) -> list[int]:
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return out

    def subtree(self, keep: Sequence[int]) -> tuple[list[int], list[int], dict[int, int]]:
        """``(tokens, parents, old -> new)`` of the nodes ``keep`` (closed under ancestors),
        in their merged order."""
        keep = sorted(keep)
        remap = {old: new for new, old in enumerate(keep)}
        parents = [-1 if self.parents[i] < 0 else remap[self.parents[i]] for i in keep]
        return [self.tokens[i] for i in keep], parents, remap


@dataclass
class MemberStats:
    """One member's running statistics (exponentially weighted by :data:`DECAY`).

    ``reach[d - 1]`` / ``passed[d - 1]``: weight of its steps whose (kept) draft had a node at
    depth ``d`` / whose accepted length was at least ``d``; ``lengths[a]``: weight of its steps
    with accepted length ``a``; ``cost``: its proposing time in one-token full forwards;
    ``size``: its kept draft's nodes; ``weight``: total weight of its observed steps."""

    reach: list[float] = field(default_factory=list)
    passed: list[float] = field(default_factory=list)
    lengths: list[float] = field(default_factory=list)
    cost: float = 0.0
    size: float = 0.0
    weight: float = 0.0
    costed: float = 0.0

    def observe(self, depth: int, accepted: int, size: int) -> None:
        """One verified step: the member's kept draft was ``depth`` deep with ``size`` nodes, and
        ``accepted`` of its tokens were accepted."""
        n = max(depth, accepted + 1, len(self.reach))
        for xs in (self.reach, self.passed):
            xs.extend([0.0] * (n - len(xs)))
            xs[:] = [x * DECAY for x in xs]
        self.lengths.extend([0.0] * (accepted + 1 - len(self.lengths)))
        self.lengths[:] = [x * DECAY for x in self.lengths]
        for d in range(depth):
            self.reach[d] += 1.0
        for d in range(accepted):
            self.passed[d] += 1.0
        self.lengths[accepted] += 1.0
        self.size = self.size * DECAY + size
        self.weight = self.weight * DECAY + 1.0

    def skipped(self) -> None:
        """A step in which the cheap-first rule did not call the member: its accepted-length
        evidence ages by :data:`DECAY` (nothing is observed)."""
        self.lengths[:] = [x * DECAY for x in self.lengths]
        self.weight *= DECAY
        self.size *= DECAY

    def observe_cost(self, forwards: float) -> None:
        """The member's proposing time this step, in one-token full forwards."""
        self.cost = self.cost * DECAY + forwards
        self.costed = self.costed * DECAY + 1.0

    def depth_rate(self, depth: int) -> float:
        """P(accepted length >= depth | its draft reached depth): (passed + 1) / (reach + 2),
        one half before any evidence."""
        if depth <= len(self.reach):
            return (self.passed[depth - 1] + 1.0) / (self.reach[depth - 1] + 2.0)
        return 0.5

    def mean_cost(self) -> float | None:
        return self.cost / self.costed if self.costed else None

    def mean_size(self) -> float:
        return self.size / self.weight if self.weight else 0.0

    def expected_gain(self, covered: float) -> float | None:
        """Expected accepted tokens this member adds beyond ``covered`` (the current draft's
        expected accepted tokens): ``sum_a P(a) * max(0, a - covered)`` over its accepted-length
        histogram and :data:`OPTIMISM` pseudo-steps at its deepest accepted length so far;
        None before it was observed."""
        if not self.weight:
            return None
        deepest = max((a for a, w in enumerate(self.lengths) if w > 0), default=0)
        seen = sum(w * max(0.0, a - covered) for a, w in enumerate(self.lengths))
        return (seen + OPTIMISM * max(0.0, deepest - covered)) / (self.weight + OPTIMISM)


def node_values(trie: Trie, stats: Sequence[MemberStats]) -> list[float]:
    """Each merged node's probability of acceptance: per proposing member, the probability its
    draft gave the node (``Draft.probs``), else its depth rate (:meth:`MemberStats.depth_rate`:
    how often its drafts that reached this depth had it accepted) shared among that member's
    nodes at the same depth (a tree's siblings are alternatives: at most one is accepted); the
    highest over the node's members; never above its parent's value (so the best nodes are
    closed under ancestors)."""
    depths = trie.depths()
    width: dict[tuple[int, int], int] = {}
    for i, owners in enumerate(trie.owners):
        for m in owners:
            width[(m, depths[i])] = width.get((m, depths[i]), 0) + 1
    values: list[float] = []
    for i, owners in enumerate(trie.owners):
        d = depths[i]
        best = 0.0
        given = trie.probs[i]
        for m in owners:
            best = max(best, given[m] if m in given else stats[m].depth_rate(d) / width[(m, d)])
        p = trie.parents[i]
        values.append(best if p < 0 else min(best, values[p]))
    return values


def cut(
    values: Sequence[float],
    cost: Callable[[int], float] | None,
    spent: float,
    limit: int | None = None,
) -> list[int]:
    """The merged nodes to verify: the ``n`` most valuable (ties: merged order, so parents
    first), ``n`` maximising ``(1 + sum of their values) / (spent + cost(n + 1))`` (``spent``:
    what proposing cost this step, in one-token forwards); every node when ``cost`` is None;
    at most ``limit``."""
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))
    if limit is not None:
        order = order[:limit]
    if cost is None:
        return sorted(order)
    n, _, _ = choose_size([values[i] for i in order], cost, spent)
    return sorted(order[:n])


def worth_calling(
    stats: MemberStats, covered: float, nodes: int, spent: float, cost: Callable[[int], float]
) -> bool:
    """The cheap-first rule: whether calling a member pays, given the draft so far (``nodes``
    merged nodes, ``covered`` expected accepted tokens, ``spent`` forwards of proposing).

    Without the member a step commits ``1 + covered`` tokens for ``spent + cost(nodes + 1)``;
    with it, ``gain`` more (:meth:`MemberStats.expected_gain`) for its proposing cost and its
    mean draft size more verified nodes. Call it when the second ratio is at least the first,
    and always while its cost or acceptance has not been observed yet. The caller reports a
    skip with :meth:`MemberStats.skipped`, so evidence ages while the member is not called."""
    gain = stats.expected_gain(covered)
    own = stats.mean_cost()
    if gain is None or own is None:
        return True
    without = (1.0 + covered) / (spent + cost(nodes + 1))
    with_it = (1.0 + covered + gain) / (spent + own + cost(nodes + 1 + round(stats.mean_size())))
    return with_it >= without


@dataclass
class CallOutcomes:
    """What the cheap-first choice gave for one member in one decode, measured: per choice
    (``True``: called after a cheaper member's draft, ``False``: skipped), the tokens committed and
    the step's time in one-token forwards (propose to commit), exponentially weighted by
    :data:`DECAY` per judged step of either choice, so the choice not taken ages."""

    tokens: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})
    forwards: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})
    weight: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})

    def observe(
        self, called: bool, tokens: int, forwards: float, skipped: tuple[int, float] | None = None
    ) -> None:
        """One judged step: the member was ``called`` or not; the step committed ``tokens`` in
        ``forwards``. ``skipped``: for a step that called it, ``(tokens, forwards)`` the same step
        would have given without it (:func:`without_member`), measured for the skip choice in
        the same step."""
        for xs in (self.tokens, self.forwards, self.weight):
            for k in xs:
                xs[k] *= DECAY
        self.tokens[called] += tokens
        self.forwards[called] += forwards
        self.weight[called] += 1.0
        if called and skipped is not None:
            self.tokens[False] += skipped[0]
            self.forwards[False] += skipped[1]
            self.weight[False] += 1.0

    def rate(self, called: bool) -> float | None:
        """Tokens per forward of the steps with that choice; None below :data:`MIN_OUTCOMES`."""
        if self.weight[called] < MIN_OUTCOMES or self.forwards[called] <= 0:
            return None
        return self.tokens[called] / self.forwards[called]

    def choose(self, predicted: bool) -> bool:
        """Call the member or not: ``predicted`` (:func:`worth_calling`) while neither choice
        is measured; the unmeasured (or aged) choice while one is; then the faster one."""
        call, skip = self.rate(True), self.rate(False)
        if call is None and skip is None:
            return predicted
        if call is None or skip is None:
            return call is None
        return call >= skip


def without_member(
    committed: Sequence[int],
    tokens: Sequence[int],
    parents: Sequence[int],
    owners: Sequence[set[int]],
    member: int,
) -> tuple[int, int]:
    """What a verified step would have committed without ``member``'s draft: ``(tokens,
    width)``, the committed path's longest prefix among the verified nodes (``tokens``,
    ``parents``, ``owners`` of the merged draft as verified) that another member proposed, plus
    its bonus token, and the verified block's width (the pending token and those nodes).

    ``committed`` is the step's committed tokens (its accepted path, then the bonus). A step
    without the member verifies the same tree less the nodes only it proposed, so the same
    verification accepts the same path as far as it runs through the others' nodes (the
    drafts the others would have made without it as ``state.prior`` are not known: they are
    taken to be the ones they made)."""
    children: dict[int, dict[int, int]] = {}
    others = 0
    for i, tok in enumerate(tokens):
        if owners[i] - {member}:
            children.setdefault(parents[i], {})[int(tok)] = i
            others += 1
    return len(committed_path(children, committed)) + 1, others + 1


def committed_path(children: dict[int, dict[int, int]], committed: Sequence[int]) -> list[int]:
    """The nodes of the committed path's longest prefix in a draft given as ``children``
    (``{parent: {token: node}}``, ``-1`` the pending token), never past the step's accepted
    tokens (``committed`` ends with the bonus)."""
    path: list[int] = []
    cur = -1
    for tok in committed[:-1]:
        nxt = children.get(cur, {}).get(int(tok))
        if nxt is None:
            break
        path.append(nxt)
        cur = nxt
    return path
