"""Small typed values that cross the host/plugin boundary.

Plugins return :class:`Draft` from ``selfspec_propose`` and :class:`Verdict` from
``selfspec_verify``; the loop hands every hook the same :class:`DecodeState`, and a decode ends
with one :class:`Result` holding tokens and :class:`Stats`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from selfspec._engine.contract.reference import greedy
from selfspec._engine.contract.stats import Stats

if TYPE_CHECKING:  # pragma: no cover
    from selfspec._engine.contract.sampling import Sampler
    from selfspec._engine.runner import KVCache, Runner


@dataclass(frozen=True)
class Draft:
    """Tokens a plugin proposes for the positions after the pending token.

    Called:
        Returned by ``selfspec_propose``; the host checks it, may cut it, and hands it to
        ``selfspec_verify``. Built with ``Draft.chain(ids, device, owner=self, **meta)``,
        ``Draft.empty(device, owner=self, **meta)`` (a plain greedy step; ``selfspec_verify``
        is still called with it) or ``Draft(tokens, parents)`` for a tree.

    Args:
        tokens: ``[k]`` int64 on the model's device, the draft's token ids in node order.
        parents: ``None`` for a chain (node i follows node i-1, node 0 the pending token), or
            ``[k]`` int64 for a tree: ``parents[i]`` is node i's parent, ``-1`` = the pending
            token, always ``parents[i] < i``.
        meta: free for the proposing plugin (e.g. hidden states its verifier reuses); the host
            never reads it.
        owner: the proposing plugin instance (``owner=self``), for :meth:`is_from`.
        probs: optional ``[k]`` float, the proposer's estimate of each node's probability of
            being accepted (its whole path from the pending token, so never above its
            parent's). The verifier ignores it; a composition values the node by it
            ([composition.md](docs/composition.md)) instead of the member's running acceptance
            rate at that depth. :func:`selfspec.draft_tree`'s trees carry their calibrated
            ``probs``.

    Returns:
        ``len(draft)`` nodes; :attr:`is_tree`; :meth:`depths` (1 = a child of the pending
        token); :meth:`is_from` (``owner`` by identity); :meth:`best_path` (the most probable
        path's tokens).

    Host enforces:
        1-D int64 ``tokens`` on the model's device with ids in ``[0, vocab)``; ``parents``
        int64 shaped like ``tokens`` with ``-1 <= parents[i] < i``; ``probs`` a floating
        tensor shaped like ``tokens`` with values in ``[0, 1]``; else a ``PluginError``.
        Nodes past ``state.max_draft_depth`` or the cache's spare room are cut (with their
        ``probs``), keeping ``owner`` and ``meta`` (so ``meta`` describes the draft as
        proposed: compare lengths).

    Notes:
        A plugin that leaves data in ``meta`` for its own ``selfspec_verify`` proposes with
        ``owner=self``, and its verifier returns None unless ``draft.is_from(self)``.

        A tree is built with the constructor, ``Draft(tokens, parents)``
        ([tree-drafts.md](docs/tree-drafts.md)); an empty draft still reaches ``selfspec_verify``
        ([empty drafts](docs/faq.md#is-selfspec_verify-called-for-an-empty-draft)).
        :meth:`Draft.best_nodes` gives the node indices of :meth:`Draft.best_path`. The convention
        for "this draft is mine": a plugin that leaves data in ``meta`` for its own
        ``selfspec_verify`` proposes with ``owner=self`` and its verifier starts with ``if not
        draft.is_from(self): return None``; the host keeps ``owner`` and ``meta`` when it cuts a
        draft past the depth or cache limits, so compare ``len(draft)`` with what was proposed when
        it matters.
    """

    tokens: torch.Tensor
    parents: torch.Tensor | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    owner: Any = field(default=None, compare=False, repr=False)
    probs: torch.Tensor | None = field(default=None, compare=False, repr=False)

    @classmethod
    def chain(
        cls,
        tokens: Sequence[int] | torch.Tensor,
        device: torch.device | str = "cpu",
        *,
        owner: Any = None,
        **meta: Any,
    ) -> Draft:
        """A chain draft from a list of token ids (``meta`` keywords go to :attr:`meta`)."""
        t = torch.as_tensor(tokens, dtype=torch.long, device=device).reshape(-1)
        return cls(t, None, dict(meta), owner)

    def is_from(self, plugin: Any) -> bool:
        """Whether ``plugin`` (an instance, compared by identity) proposed this draft."""
        return self.owner is not None and self.owner is plugin

    @classmethod
    def empty(cls, device: torch.device | str = "cpu", *, owner: Any = None, **meta: Any) -> Draft:
        """No draft tokens: a plain step (``selfspec_verify`` is still called with it, and the
        verdict is the bonus alone). ``owner``/``meta`` as for :meth:`chain`, so a verifier that
        answers only its own drafts (``is_from``) also sees its empty ones."""
        return cls(torch.empty(0, dtype=torch.long, device=device), None, dict(meta), owner)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def is_tree(self) -> bool:
        """Whether the draft is a tree (``parents`` given) rather than a chain."""
        return self.parents is not None

    def best_path(self) -> list[int]:
        """The token ids of the draft's most probable path from the pending token: a chain's
        tokens; in a tree, the child with the highest ``probs`` at each node, down to a leaf
        (ties and a tree without ``probs``: the first child)."""
        ids = self.tokens.tolist()
        return [ids[i] for i in self.best_nodes()]

    def best_nodes(self) -> list[int]:
        """The node indices of :meth:`best_path` (``probs[best_nodes()]`` are its values)."""
        if self.parents is None:
            return list(range(len(self)))
        probs = self.probs.tolist() if self.probs is not None else [0.0] * len(self)
        best: dict[int, int] = {}
        for i, p in enumerate(self.parents.tolist()):
            if p not in best or probs[i] > probs[best[p]]:
                best[p] = i
        path: list[int] = []
        node = best.get(-1)
        while node is not None:
            path.append(node)
            node = best.get(node)
        return path

    def depths(self) -> list[int]:
        """Depth of every node (1 = child of the pending token)."""
        if self.parents is None:
            return list(range(1, len(self) + 1))
        depth: list[int] = []
        for p in self.parents.tolist():
            depth.append(1 if p < 0 else depth[p] + 1)
        return depth


@dataclass(frozen=True)
class Verdict:
    """What verification decided.

    Called:
        Returned by ``selfspec_verify``; the host checks it, ``selfspec_cache`` keeps its
        ``kv_slots``, the host commits :attr:`committed`, and ``selfspec_update_policy`` reads
        it. The loop drops it when the step ends.

    Args:
        accepted: the accepted draft token ids, in order (a path from the pending token).
        bonus: the model's own next token after the last accepted one; the new pending token.
        accepted_nodes: the accepted tokens' node indices in the draft (default for a chain:
            ``0..len(accepted)-1``).
        kv_slots: cache slots, relative to the pending token's slot (0), holding the keys and
            values of ``[pending, accepted...]`` after the verifying forward; ``None`` =
            ``0..len(accepted)``, the chain layout (:meth:`slots` resolves it).
        forwards: full-model forward passes this verification cost (for tau).
        hidden: states captured at the committed positions when ``state.capture_layers``
            asked, ``{layer: [len(accepted) + 1, H]}`` (layer 0 = embeddings, layer i = the
            output of decoder layer i-1).
        meta: free for the verifier.
        logits: the verifying forward's logits ``[1 + len(draft), V]`` in the model's dtype,
            in node order (row 0 after the pending token, row ``i + 1`` after node ``i`` on
            its own path), a reference to the forward's block (never a copy); ``None`` from a
            verifier that gives none.

    Returns:
        :attr:`committed` ``(*accepted, bonus)``; :attr:`logit_rows` (the committed positions'
        rows of ``logits``); :meth:`top_k` ``(values, ids)``, each ``[1 + len(draft), k]``,
        small copies safe to keep.

    Host enforces:
        Ids in ``[0, vocab)``; ``accepted_nodes`` a path of the draft whose tokens are
        ``accepted``; one kv slot per committed position, increasing and inside the slots
        the forward wrote unless a plugin implements ``selfspec_cache``; else a
        ``PluginError`` naming the plugin and the step.

    Notes:
        Keep what you learn from ``logits`` (``top_k``, a few rows ``.clone()``d), never the
        verdict or the tensor: holding it keeps the forward's block alive.

        Every host verifier fills ``logits`` (:func:`verify_greedy`, :func:`verify_tree`, which
        leaves out its extra rows, :func:`verify_from_layer`,
        :func:`selfspec.provisional.chain_verdict`); it is ``None`` when a plugin's own verifier
        builds a ``Verdict`` without it. ``greedy(verdict.logits[list(verdict.logit_rows)])`` is
        ``verdict.committed``; :meth:`Verdict.slots` is ``kv_slots``, or ``0..len(accepted)`` when
        ``None``. A plugin that learns from the full model's predictions reads the logits in
        ``selfspec_update_policy``, with no need to override ``selfspec_verify`` ([a plugin that
        learns from them](docs/faq.md#a-plugin-that-learns-from-verification)). They cost nothing
        when nobody reads them: a reference to the block the forward made anyway (no copy, no extra
        LM-head rows), freed before the next forward because the loop drops the verdict when the
        step ends, after ``selfspec_update_policy`` (``tests/test_author_faq_learner.py`` checks
        both).
    """

    accepted: tuple[int, ...]
    bonus: int
    accepted_nodes: tuple[int, ...] = ()
    kv_slots: tuple[int, ...] | None = None
    forwards: float = 1.0
    hidden: dict[int, torch.Tensor] | None = field(default=None, compare=False)
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    logits: torch.Tensor | None = field(default=None, compare=False, repr=False)

    @property
    def committed(self) -> tuple[int, ...]:
        """All tokens this step commits: the accepted drafts and the bonus token."""
        return (*self.accepted, self.bonus)

    @property
    def logit_rows(self) -> tuple[int, ...]:
        """Rows of :attr:`logits` at the committed positions: ``(0, node + 1, ...)`` for the
        pending token and each accepted node; ``logits[logit_rows[j]]`` is the model's
        prediction of ``committed[j]`` (its argmax, greedily)."""
        nodes = self.accepted_nodes or tuple(range(len(self.accepted)))
        return (0, *(n + 1 for n in nodes))

    def top_k(self, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(values, ids)``, each ``[1 + len(draft), k]``: the ``k`` largest logits of every
        row of :attr:`logits` and their token ids, largest first (``None`` without logits).
        Small copies: safe to keep past the step."""
        if self.logits is None:
            return None
        values, ids = torch.topk(self.logits, min(k, int(self.logits.shape[-1])), dim=-1)
        return values, ids

    def slots(self) -> tuple[int, ...]:
        return self.kv_slots if self.kv_slots is not None else tuple(range(len(self.accepted) + 1))


@dataclass
class DecodeState:
    """Everything a hook may look at during one decode.

    Called:
        Built by ``Decoder.generate`` after prefill and handed to every hook of that decode,
        the same object from ``selfspec_start`` to ``selfspec_end``.

    Args:
        runner: the :class:`selfspec.Runner` over the model.
        cache: the decode's :class:`selfspec.KVCache`; it holds exactly ``length - 1``
            positions at the start of a step (every committed token but the pending one).
        tokens: ``[capacity]`` int64 buffer; ``tokens[:length]`` are committed, prompt first.
        length: committed tokens, prompt included; ``committed`` is ``tokens[:length]`` and
            ``pending`` the last of them (not yet in the cache).
        prompt_length: the prompt's length ``T``.
        max_new_tokens: the decode's budget; ``budget`` is what is left of it, ``generated``
            what was used.
        eos_token_ids: the ids that end the decode (the host's rule).
        stats: the decode's :class:`selfspec.Stats`, filled by the host.
        plugin_name: the selected plugin's name.
        options: the validated options of the decoder.
        step: the step number, from 0.
        capture_layers: set by a plugin to ask the verifier for hidden states of the
            committed positions (``Verdict.hidden``).
        scratch: free per-decode storage for plugins.
        finished: set by the host on EOS or at the budget.
        sampler: the decode's sampler, ``None`` when greedy (``sampling_on`` says which).
        prior: in a composed decode, while a member proposes: the merged :class:`Draft` of
            the members that proposed before it this step (``probs``: the composition's value
            of each node), which a drafter may extend (:func:`selfspec.draft_tree`'s
            ``prefix``; ``tree_extend``); ``None`` otherwise.

    Returns:
        :meth:`pick` ``(logits [n, V] or [V], positions [n], vocab=None) -> ids``: the
        decode's one token choice (argmax when greedy, position-keyed Gumbel sampling
        otherwise); :meth:`timed` ``(phase)``: a context manager timing part of a hook under
        its own key of ``stats.phase_s``.

    Host enforces:
        Plugins write only ``capture_layers`` and ``scratch``; the host owns ``tokens``,
        ``length``, ``step``, ``finished``, ``prior`` and checks the cache length after every
        step.

    Notes:
        Every token a verifier commits and every token a drafter takes from model logits goes
        through :meth:`pick`, which couples drafts with the target under sampling
        (``docs/losslessness.md``).

        A position is an index in prompt + output: in :meth:`DecodeState.pick` the row of the token
        at position ``p`` predicts position ``p + 1``. Every host verifier picks with it; a drafter
        that takes tokens from model logits picks with it too (``pick=state.pick`` for
        :func:`skip_layer_draft`); drafts from text need nothing. Thanks to :meth:`timed` a plugin
        never corrects the host's bookkeeping (``timed_s`` is the host's total of the decode's timed
        blocks). ``generated`` counts the tokens committed after the prompt; ``prior`` is how a
        composition's later members extend the earlier ones' draft
        ([composition.md](docs/composition.md), "Extending").
    """

    runner: Runner
    cache: KVCache
    tokens: torch.Tensor
    length: int
    prompt_length: int
    max_new_tokens: int
    eos_token_ids: frozenset[int]
    stats: Stats
    plugin_name: str
    options: dict[str, Any] = field(default_factory=dict)
    step: int = 0
    capture_layers: tuple[int, ...] | None = None
    scratch: dict[str, Any] = field(default_factory=dict)
    finished: bool = False
    sampler: Sampler | None = None
    prior: Draft | None = None
    timed_s: float = field(default=0.0, repr=False)  # total of every `timed` block, this decode

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Time a part of a hook (``with state.timed("layer_search"): ...``) under its own key
        of ``stats.phase_s``. The built-in phase timer leaves that time out of the enclosing
        hook's phase, so ``phase_s`` still partitions the step time. Waits for the GPU."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.runner.device.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            self.stats.phase_s[phase] = self.stats.phase_s.get(phase, 0.0) + dt
            self.timed_s += dt

    def pick(
        self,
        logits: torch.Tensor,
        positions: torch.Tensor | Sequence[int],
        vocab: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The decode's token choice: ``[n, V]`` (or ``[V]``) logits whose rows predict the tokens
        at absolute positions ``positions`` ``[n]`` -> ``[n]`` (or ``[]``) int64 ids.

        The argmax (:func:`selfspec.greedy`) when the decode is greedy; else the argmax of the
        warped logits plus the Gumbel noise of each position
        (:mod:`selfspec._engine.contract.sampling`). ``vocab`` ``[V']``: the logits' columns are
        these token ids (a vocabulary subset); the ids returned are vocabulary ids. A draft picked
        this way is coupled to the target."""
        if self.sampler is None:
            ids = greedy(logits)
            return (
                ids if vocab is None else vocab.index_select(0, ids.reshape(-1)).reshape(ids.shape)
            )
        return self.sampler.pick(logits, positions, vocab)

    @property
    def sampling_on(self) -> bool:
        """Whether this decode samples (temperature > 0) rather than decoding greedily."""
        return self.sampler is not None and not self.sampler.greedy

    @property
    def committed(self) -> torch.Tensor:
        """``[length]`` committed ids (prompt + output)."""
        return self.tokens[: self.length]

    @property
    def pending(self) -> int:
        """The last committed token: in the output, not yet in the KV cache."""
        return int(self.tokens[self.length - 1])

    @property
    def generated(self) -> int:
        return self.length - self.prompt_length

    @property
    def budget(self) -> int:
        """How many more tokens may be committed."""
        return self.max_new_tokens - self.generated

    @property
    def max_draft_depth(self) -> int:
        """Deepest draft the host keeps: the bonus token also needs room in the budget.

        Uses ``length - 1`` (what the cache holds at the start of every step), not the cache's
        current lengths: a proposer that ran the model with skipped blocks leaves its layers
        holding different lengths until verification, and the host still cuts its draft."""
        return max(0, min(self.budget - 1, self.cache.capacity - (self.length - 1) - 1))


@dataclass
class Result:
    """One decode: prompt and new token ids, decoded text (when a tokenizer is known), stats.

    ``prompt_ids``; ``output_ids``, the new tokens only; ``stats``, a :class:`Stats`; ``text``
    (needs a tokenizer); ``near_ties``, set by the kit's ``assert_lossless``: 1 when a float32/bf16
    output left the reference at a near-tie.
    """

    prompt_ids: list[int]
    output_ids: list[int]
    stats: Stats
    text: str | None = None
    near_ties: int = 0


#: Receives each step's committed ids; a true return value ends the decode after that block.
StreamCallback = Callable[[list[int]], "bool | None"]
