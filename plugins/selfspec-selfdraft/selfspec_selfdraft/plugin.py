"""The ``selfdraft`` hooks: propose candidates from two n-gram caches, verify them in one
forward together with the draft branches, keep exactly the accepted path in the KV cache.

One step (paper Algorithm 1): the candidates for the pending token (context cache by the
pending token, corpus cache by the longest matching suffix, and, beyond the paper, the
history source: prompt lookup over the prompt and output with the host's ``NgramIndex``) form
a trie ``Draft``; the verifier runs ``[pending, trie..., branches...]`` in one forward (the host's
``verify_tree`` with the branches as extra rows, layout in :mod:`.layout`), accepts the longest
trie path the model agrees with plus the bonus token, and hands the
branches' predictions to the update hook, which fills the context cache and advances every
branch by its last prediction. Before the output has ``branch_len`` tokens a step proposes no
candidates (the first arm): the branches only grow.
"""

from __future__ import annotations

import random
from itertools import zip_longest
from typing import Any

import torch

import selfspec
from selfspec import Draft, NgramIndex, Option, Verdict, verify_tree

from . import layout
from .context import ContextCache
from .corpus import CorpusCache


class SelfDraft:
    """One instance per decoder: the corpus cache is loaded once; branches and the context
    cache are reset at every decode's start."""

    #: Joins compositions: its verifier returns None for any draft not its own, and its policy
    #: does without it (``self._step`` stays None). In a composition its lookahead branches, which
    #: ride in its own verifying pass, do not run: it drafts from the history and corpus sources.
    composable = True

    def __init__(self) -> None:
        self.opts: dict[str, Any] = {}
        self.corpus: CorpusCache | None = None
        self.context = ContextCache()
        self.branches: list[list[int]] = []
        # prompt + committed tokens (the history index's own list when it runs)
        self.history: list[int] = []
        self.hist: NgramIndex | None = None  # the history source's index (history=true)
        self.rng = random.Random(0)
        self._step: dict[str, Any] | None = None  # what verify left for the update hook

    # ------------------------------------------------------------------ lifecycle
    @selfspec.hookimpl
    def selfspec_options(self, register) -> None:
        register(Option("branches", int, 1, "draft branches N (paper: 6)", min=0, max=64))
        register(
            Option(
                "branch_len",
                int,
                3,
                "longest draft branch L, also the output length "
                "before candidates are proposed (paper: 6)",
                min=1,
                max=32,
            )
        )
        register(
            Option(
                "gram",
                int,
                4,
                "gram length G of the context cache (candidates have G-1 tokens)",
                min=2,
                max=16,
            )
        )
        register(
            Option("max_candidates", int, 2, "most candidates verified per step", min=0, max=64)
        )
        register(
            Option(
                "context_size",
                int,
                8,
                "grams kept per key token in the context cache (LRU)",
                min=1,
                max=1024,
            )
        )
        register(
            Option("context", bool, True, "use the context cache (off: no branches run either)")
        )
        register(
            Option(
                "corpus",
                str,
                "default",
                "corpus cache: 'default' (built on first use from "
                "the benchmark's dev texts; needs a tokenizer), 'off', or a .npz path",
            )
        )
        register(
            Option(
                "corpus_tokens",
                int,
                3_000_000,
                "tokens of dev text the default corpus cache is built from",
                min=1000,
            )
        )
        register(
            Option(
                "corpus_prefix", int, 3, "longest suffix matched in the corpus cache", min=1, max=8
            )
        )
        register(
            Option(
                "corpus_min_prefix",
                int,
                1,
                "shortest suffix matched in the corpus cache "
                "(2 drops the many weak one-token matches)",
                min=1,
                max=8,
            )
        )
        register(
            Option(
                "history",
                bool,
                True,
                "also propose what followed the output's last n-gram "
                "earlier in the prompt and output (prompt lookup; not in the paper)",
            )
        )
        register(
            Option("history_len", int, 16, "most tokens of the history candidate", min=1, max=32)
        )
        register(
            Option(
                "history_halving",
                bool,
                True,
                "halve the history candidate's length for each "
                "token its match is shorter than history_ngram",
            )
        )
        register(
            Option(
                "history_ngram",
                int,
                3,
                "longest suffix matched by the history source",
                min=1,
                max=8,
            )
        )
        register(
            Option(
                "history_min_ngram",
                int,
                1,
                "shortest suffix matched by the history source",
                min=1,
                max=8,
            )
        )
        register(
            Option(
                "init",
                str,
                "prompt",
                "random initial branch tokens drawn from the prompt or the whole vocabulary",
                choices=("prompt", "vocab"),
            )
        )
        register(Option("seed", int, 0, "seed of the random branch initialisation"))

    @selfspec.hookimpl
    def selfspec_commands(self, register) -> None:
        from .commands import build_corpus

        register(build_corpus)

    @selfspec.hookimpl
    def selfspec_setup(
        self, runner: selfspec.Runner, options: dict[str, Any], tokenizer: Any
    ) -> None:
        self.opts = dict(options)
        self.corpus = load_corpus(options, tokenizer, runner.vocab_size)
        if options["corpus_min_prefix"] > options["corpus_prefix"]:
            raise ValueError("corpus_min_prefix must not exceed corpus_prefix")
        if (
            options["context"]
            and options["branches"] > 0
            and options["branch_len"] < options["gram"] - 1
        ):
            raise ValueError(
                f"branch_len ({options['branch_len']}) must be at least gram - 1 "
                f"({options['gram'] - 1}): a shorter branch yields no grams for the context cache "
                "(raise branch_len, lower gram, or set branches=0)"
            )
        if options["history_min_ngram"] > options["history_ngram"]:
            raise ValueError("history_min_ngram must not exceed history_ngram")
        if not options["context"] and self.corpus is None and not options["history"]:
            raise ValueError(
                "context=false and history=false need a corpus cache (corpus='default' with a "
                "tokenizer, or a path): with no source there is nothing to draft"
            )
        self.vocab_size = runner.vocab_size
        self.context = ContextCache(options["context_size"])

    @selfspec.hookimpl
    def selfspec_start(self, state: selfspec.DecodeState) -> None:
        o = self.opts
        self.hist = NgramIndex(o["history_ngram"], o["history_min_ngram"]) if o["history"] else None
        # one list, never two copies
        self.history = self.hist.tokens if self.hist is not None else []
        self._extend(state.committed.tolist())
        self.context.clear()
        self.rng = random.Random(o["seed"])
        n = o["branches"] if o["context"] else 0
        pool = self.history if o["init"] == "prompt" else range(state.runner.vocab_size)
        self.branches = [[self.rng.choice(pool)] for _ in range(n)]
        self._step = None

    # ------------------------------------------------------------------ the step
    @selfspec.hookimpl
    def selfspec_propose(self, state: selfspec.DecodeState) -> Draft:
        o = self.opts
        depth = min(o["gram"] - 1, state.max_draft_depth)
        cands: list[tuple[int, ...]] = []
        if state.generated >= o["branch_len"] and depth > 0 and o["max_candidates"] > 0:
            cands = self.candidates(depth, min(o["history_len"], state.max_draft_depth))
        tokens, parents = layout.trie(cands)
        dev = state.runner.device
        return Draft(
            torch.tensor(tokens, dtype=torch.long, device=dev),
            torch.tensor(parents, dtype=torch.long, device=dev),
            owner=self,
        )

    @selfspec.hookimpl
    def selfspec_verify(self, state: selfspec.DecodeState, draft: Draft) -> Verdict | None:
        if not draft.is_from(self):
            return None  # not our draft: let the greedy verifier decide
        base = state.length - 1
        second_arm = state.generated >= self.opts["branch_len"]
        branches = self.branches
        room = state.cache.capacity - base - 1 - len(draft)
        if sum(len(b) for b in branches) > room:
            branches = []  # no room left for the branches this step (only near the capacity)
        limit = state.runner.max_positions  # branch token j sits at position base + 1 + j
        if limit is not None and base + max((len(b) for b in branches), default=0) >= limit:
            branches = []  # the branches would run past the model's last position (only near it)
        first_row = self.opts["gram"] - 2 if second_arm else 1 << 30
        laid = layout.branches(branches, base, first_row, state.runner.device)
        verdict, pred = verify_tree(state, draft, laid.extra)
        # per branch, the model's token after each of its (logit) positions
        preds, i = [], 0
        for local in laid.branch_rows:
            preds.append(dict(zip(local, pred[i : i + len(local)])))
            i += len(local)
        self._step = {"branches": branches, "preds": preds, "second_arm": second_arm}
        return verdict

    @selfspec.hookimpl
    def selfspec_update_policy(self, state: selfspec.DecodeState, verdict: Verdict) -> None:
        self._extend(state.tokens[len(self.history) : state.length].tolist())
        step, self._step = self._step, None
        if step is None or not step["branches"]:
            return
        self.advance(step["branches"], step["preds"], step["second_arm"])

    # ------------------------------------------------------------------ helpers
    def _extend(self, tokens: list[int]) -> None:
        """Append committed tokens to the history (indexing them when the history source runs)."""
        if self.hist is not None:
            self.hist.extend(tokens)
        else:
            self.history.extend(tokens)

    def advance(self, branches: list[list[int]], preds: list[dict[int, int]], grams: bool) -> None:
        """Fill the context cache from the branches (second arm only), then append each
        branch's last prediction and drop its oldest token past ``branch_len``."""
        g, cap = self.opts["gram"], self.opts["branch_len"]
        for b, p in zip(branches, preds):
            if grams:
                for j in range(g - 2, len(b)):
                    if j in p:
                        self.context.put((*b[j - g + 2 : j + 1], p[j]))
            b.append(p[len(b) - 1])
            del b[: max(0, len(b) - cap)]

    def candidates(self, depth: int, history_depth: int = 0) -> list[tuple[int, ...]]:
        """Up to ``max_candidates`` continuations of the pending token: first the history
        source's (``history_depth`` tokens at most), then the context cache's (most recent
        first) and the corpus cache's (longest prefix, then most frequent) taken in turn,
        ``depth`` tokens at most, duplicates and prefixes of a kept candidate dropped."""
        o = self.opts
        limit = o["max_candidates"]
        ctx = self.context.get(self.history[-1], limit) if o["context"] else []
        corp = (
            self.corpus.lookup(self.history, limit, o["corpus_prefix"], o["corpus_min_prefix"])
            if self.corpus is not None
            else []
        )
        out: list[tuple[int, ...]] = []
        seen: set[tuple[int, ...]] = set()
        hist = (
            self.hist.continuation(history_depth, o["history_halving"])
            if self.hist is not None and history_depth > 0
            else ()
        )
        if hist and max(hist) < self.vocab_size:
            out.append(hist)
            # its prefixes are in the trie already
            seen.update(hist[:n] for n in range(1, len(hist) + 1))
        for pair in zip_longest(ctx, corp):
            for c in pair:
                if len(out) >= limit:
                    return out
                if c is None:
                    continue
                c = c[:depth]
                if c and c not in seen and max(c) < self.vocab_size:
                    seen.add(c)
                    out.append(c)
        return out


def load_corpus(options: dict[str, Any], tokenizer: Any, vocab_size: int) -> CorpusCache | None:
    """The corpus cache the options ask for (None: off, or 'default' without a tokenizer)."""
    choice = options["corpus"]
    if choice == "off":
        return None
    if choice == "default":
        if tokenizer is None:
            return None  # no text without a tokenizer: the context cache alone
        from .build import default_corpus

        return default_corpus(tokenizer, options["corpus_tokens"])
    from pathlib import Path

    if not Path(choice).is_file():
        raise ValueError(
            f"corpus {choice!r}: no such file (use 'default', 'off' or a path to a .npz "
            "built by 'specdec --plugin selfdraft build-corpus')"
        )
    cache = CorpusCache.load(choice)
    if tokenizer is not None and cache.meta.get("tokenizer") not in (None, _key(tokenizer)):
        raise ValueError(f"corpus {choice!r} was built with another tokenizer than this model's")
    return cache


def _key(tokenizer: Any) -> str:
    from .corpus import tokenizer_key

    return tokenizer_key(tokenizer)
