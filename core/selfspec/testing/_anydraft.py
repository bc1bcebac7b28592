"""Verifiers tested on drafts their drafters never make: kit-made chains and trees on a real decode.

A plugin's ``selfspec_verify`` is called with whatever draft the step has, so it must be right
for every shape, not only for its own drafter's habits. :func:`check_any_drafts` decodes a
prompt with the plugin in audit mode, but at every step the plugin's own proposal (still made,
so its state moves as in a real decode) is replaced by a kit-made draft of a drawn
:class:`DraftShape`: empty, a chain (right, or wrong from some depth), a wide first level,
siblings at every depth (the right node among wrong ones, which carry subtrees of their own),
or a deep chain. The drafts are built from the reference continuation, so each is partly
right. The audit checks every committed token and kept KV slot, and :class:`KitDrafts` checks
that the verdict commits exactly what the host's own verification commits for that draft
(the longest right path, then the model's next token). With ``eos_at`` the decode has two EOS
ids and the kit drafts the one the reference does not end with where it ends: a verifier that
takes one EOS id for another commits it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st

from selfspec._engine.contract.audit import AuditError
from selfspec._engine.contract.markers import hookimpl
from selfspec._engine.contract.types import DecodeState, Draft, Verdict

#: The kinds of :class:`DraftShape`.
KINDS: tuple[str, ...] = ("empty", "chain", "wide", "siblings", "deep")
#: Most nodes in a kit-made tree.
MAX_NODES = 48


@dataclass(frozen=True)
class DraftShape:
    """How to build one step's draft from the right continuation ``truth``.

    ``kind``: one of :data:`KINDS`; ``depth``: how deep; ``width``: nodes per sibling group;
    ``right_at``: where the right node sits among its siblings (clipped to the group);
    ``wrong_from``: a chain's first wrong depth (``None``: right throughout); ``breadth_first``:
    a tree's nodes depth by depth, else each subtree after its root."""

    kind: str
    depth: int = 1
    width: int = 1
    right_at: int = 0
    wrong_from: int | None = None
    breadth_first: bool = True

    def build(self, truth: Sequence[int], vocab: int, device: torch.device | str) -> Draft:
        """The draft; ``truth[d]`` is the right token at depth ``d + 1``."""
        depth = max(0, min(self.depth, len(truth)))
        if self.kind == "empty" or depth == 0:
            return Draft.empty(device)
        if self.kind in ("chain", "deep"):
            ids = list(truth[:depth])
            if self.wrong_from is not None and self.wrong_from < depth:
                ids[self.wrong_from] = _wrong(ids[self.wrong_from], 0, vocab)
            return Draft.chain(ids, device)
        nodes: list[tuple[int, int]] = []  # (parent node, token), parents before children
        queue = [(-1, 0, True)]  # (node, its depth, whether it is on the right path)
        while queue and len(nodes) < MAX_NODES:
            parent, d, on_path = queue.pop(0) if self.breadth_first else queue.pop()
            if d >= depth:
                continue
            right = truth[d]
            if not on_path or (self.kind == "wide" and d >= 1):  # one node: the next right token
                group = [right]
            else:  # a sibling group: wrong tokens, the right one at right_at
                group = [_wrong(right, j, vocab) for j in range(max(1, self.width) - 1)]
                group.insert(min(self.right_at, len(group)), right)
            children = []
            for tok in group:
                nodes.append((parent, tok))
                right_child = on_path and tok == right
                # the right path goes on; on "siblings", a wrong node gets a level of its own
                if right_child or (self.kind == "siblings" and on_path):
                    children.append((len(nodes) - 1, d + 1, right_child))
            queue.extend(children if self.breadth_first else reversed(children))
        return Draft(
            torch.tensor([t for _, t in nodes], dtype=torch.long, device=device),
            torch.tensor([p for p, _ in nodes], dtype=torch.long, device=device),
        )


def _wrong(token: int, j: int, vocab: int) -> int:
    """The ``j``-th token other than ``token``."""
    t = (token + 1 + 7 * j) % vocab
    return t if t != token else (token + 2) % vocab


def draft_shapes() -> st.SearchStrategy[DraftShape]:
    """Any :class:`DraftShape`: depths up to 12 (deep chains up to 16), widths up to 5."""
    return st.one_of(
        st.just(DraftShape("empty")),
        st.builds(
            DraftShape,
            st.just("chain"),
            st.integers(1, 8),
            st.just(1),
            st.just(0),
            st.one_of(st.none(), st.integers(0, 7)),
        ),
        st.builds(
            DraftShape, st.just("wide"), st.integers(1, 4), st.integers(2, 8), st.integers(0, 7)
        ),
        st.builds(
            DraftShape,
            st.just("siblings"),
            st.integers(2, 5),
            st.integers(2, 3),
            st.integers(0, 2),
            st.none(),
            st.booleans(),
        ),
        st.builds(DraftShape, st.just("deep"), st.integers(9, 16)),
    )


#: One of each kind, with the right node after a wrong sibling at every depth: run first.
EVERY_SHAPE: tuple[DraftShape, ...] = (
    DraftShape("siblings", depth=4, width=2, right_at=1, breadth_first=True),
    DraftShape("empty"),
    DraftShape("chain", depth=5, wrong_from=2),
    DraftShape("wide", depth=3, width=6, right_at=4),
    DraftShape("siblings", depth=4, width=3, right_at=2, breadth_first=False),
    DraftShape("deep", depth=14),
    DraftShape("siblings", depth=3, width=3, right_at=0, breadth_first=True),
)


class KitDrafts:
    """Registered beside the plugin under test: swaps each step's proposal for a kit draft and
    checks each verdict against the host's verification of that draft.

    ``truth``: the reference output of the decode (greedy, or sampled under its seed);
    ``swap``: ``{token: other}``, every ``token`` of a kit draft replaced by ``other`` (the
    reference's EOS id by another EOS id of the decode: one EOS drafted where the model
    predicts another)."""

    def __init__(
        self,
        plugin_name: str,
        truth: Sequence[int],
        shapes: Sequence[DraftShape],
        swap: dict[int, int] | None = None,
    ) -> None:
        self.plugin_name = plugin_name
        self.truth = list(truth)
        self.shapes = list(shapes)
        self.swap = dict(swap or {})
        self.draft: Draft | None = None
        self.shape: DraftShape | None = None

    @hookimpl(wrapper=True)
    def selfspec_propose(self, state: DecodeState) -> Any:
        yield  # the plugin's own proposal runs (its state moves on as in a real decode), unused
        self.shape = self.shapes[state.step % len(self.shapes)]
        truth = self.truth[state.generated :]
        draft = self.shape.build(truth, state.runner.vocab_size, state.runner.device)
        if not self.swap or not len(draft):
            return draft
        ids = torch.tensor(
            [self.swap.get(t, t) for t in draft.tokens.tolist()],
            dtype=torch.long,
            device=draft.tokens.device,
        )
        return Draft(ids, draft.parents)

    @hookimpl(wrapper=True)
    def selfspec_verify(self, state: DecodeState, draft: Draft) -> Any:
        self.draft = draft  # the draft as the host handed it over (maybe cut)
        return (yield)

    @hookimpl(tryfirst=True)
    def selfspec_cache(self, state: DecodeState, verdict: Verdict) -> None:
        # after the audit passed every committed token: were as many committed as the host would?
        draft = self.draft
        assert draft is not None
        truth = self.truth[state.generated :]
        tokens = draft.tokens.tolist()
        parents = (
            draft.parents.tolist() if draft.parents is not None else list(range(-1, len(draft) - 1))
        )
        cur, n = -1, 0
        while n < len(truth) - 1:
            nxt = next(
                (i for i, p in enumerate(parents) if p == cur and tokens[i] == truth[n]), None
            )
            if nxt is None:
                break
            cur, n = nxt, n + 1
        want = tuple(truth[: n + 1])
        if tuple(verdict.committed) != want:
            kind = "tree" if draft.is_tree else "chain"
            raise AuditError(
                self.plugin_name,
                (
                    f"selfspec_verify is wrong at step {state.step} on a kit-made {kind} "
                    f"({self.shape}): it commits {list(verdict.committed)}, the host's "
                    f"verification of that draft commits {list(want)}; draft tokens {tokens}, "
                    f"parents {parents if draft.is_tree else None}"
                ),
            )


def check_any_drafts(
    model: Any,
    plugin: str,
    plugin_object: Any,
    options: dict[str, Any],
    prompt: Sequence[int],
    max_new_tokens: int,
    shapes: Sequence[DraftShape],
    sampling: Any = None,
    eos_at: int | None = None,
) -> None:
    """Decode ``prompt`` with the plugin in audit mode, every step's draft replaced by the kit's
    (:class:`KitDrafts`); a wrong verdict raises
    :class:`~selfspec._engine.contract.audit.AuditError`.

    ``eos_at``: the decode has two EOS ids, the reference's token at that index (where it
    stops) and another id it does not hold, which the kit drafts in the first one's place."""
    from selfspec._engine.contract.loop import Decoder
    from selfspec._engine.contract.sampling import reference_sample
    from selfspec.testing._lossless import assert_lossless, greedy_reference

    if sampling is None:
        truth = greedy_reference(model, prompt, max_new_tokens)
    else:
        truth = reference_sample(model, prompt, max_new_tokens, (), sampling)
    eos: tuple[int, ...] = ()
    swap: dict[int, int] = {}
    if eos_at is not None and truth:
        stop = truth[min(eos_at, len(truth) - 1)]
        truth = truth[: truth.index(stop) + 1]  # the reference ends at its EOS
        other = next(
            t
            for j in range(int(model.config.vocab_size))
            if (t := _wrong(stop, j, int(model.config.vocab_size))) not in truth
        )
        eos, swap = (stop, other), {stop: other}
    decoder = Decoder(model, plugin, options, plugin_object=plugin_object, audit=True)
    decoder.pm.register(KitDrafts(plugin, truth, shapes, swap), name="selfspec-kit-drafts")
    assert_lossless(model, decoder, prompt, max_new_tokens, eos_token_ids=eos, sampling=sampling)
