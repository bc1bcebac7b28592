"""One conversation of a bench: its turns, each method's runs of them, and the records.

A sample is one user turn, or several (``meta["conversation"]``: Spec-Bench's two-turn MT-bench
questions). Every method runs the turns in order, as Spec-Bench does: turn ``k``'s prompt is
the chat of the user turns so far and the method's *own* answers to the earlier ones (decoded
text, special tokens skipped, stripped), through the chat template
(:func:`selfspec.app._models.format_conversation`), prefilled afresh: no KV cache is carried
from one turn to the next. Every turn is timed and counted on its own.

Losslessness, turn by turn: a method's turn is compared with the reference's run of the same
turn when their prompts are the same token ids (every earlier answer equal); when an earlier
answer differed (a near-tie or a divergence, reported on that turn), the method's turn is
compared with the reference method run, untimed, on the method's own prompt, so a difference in
one turn is never blamed on, nor hidden in, the next.

A run that raises (a plugin that cannot take a prompt: too long for its cache, a failure in a
hook) is recorded with ``error`` set and no output; the conversation's later turns are not run
for that method, and the bench goes on.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from selfspec.app._data import Sample


@dataclass
class Run:
    """One decode of one prompt by one method."""

    output_ids: list[int]
    wall_time: float
    forwards: float
    drafted: int | None = None
    accepted: int | None = None
    accept_lengths: list[int] | None = None
    phase_s: dict[str, float] = field(default_factory=dict)
    prefill_s: float | None = (
        None  # seconds of the prompt's forward within wall_time (None: not separable)
    )
    weight_layout: str | None = None  # the runner's layout (None for HF's own generate)
    weight_bytes: int | None = None  # bytes of weights the decode read (None for HF's own generate)
    choices: dict[str, Any] | None = None  # how the decode's "auto"s were decided
    extra: dict[str, float] = field(default_factory=dict)  # the plugin's own counters (Stats.extra)
    members: dict[str, dict[str, int]] = field(
        default_factory=dict
    )  # a composition's members' counters
    error: str | None = None  # the run raised: what (no output then; see .turns.safe_run)
    prefill_new_tokens: int = (
        0  # new tokens that forward already gave (HF's gives the first; the host's none)
    )


def conversation(sample: Sample, chat: bool) -> list[str]:
    """The user turns of ``sample``: ``meta["conversation"]`` if set, else its one prompt text."""
    turns = sample.meta.get("conversation")
    return list(turns) if turns else [sample.text(chat)]


def encode_turn(loaded: Any, sample: Sample, answers: list[str]) -> list[int]:
    """Token ids of the turn after ``answers`` (the method's earlier answers) of ``sample``."""
    from selfspec.app._models import format_conversation

    turns = conversation(sample, loaded.chat)
    return format_conversation(loaded, turns[: len(answers) + 1], answers)


def answer_text(tokenizer: Any, ids: list[int]) -> str:
    """An answer as the next turn's prompt holds it (and Spec-Bench's answer file): decoded,
    special tokens skipped, stripped."""
    if tokenizer is None:
        raise ValueError("a multi-turn sample needs the model's tokenizer")
    return tokenizer.decode(ids, skip_special_tokens=True).strip()


def safe_run(fn: Callable[..., Any], ids: list[int], max_new_tokens: int, eos: set[int]) -> Any:
    """``fn(ids, max_new_tokens, eos)``; on an exception, a :class:`Run` with no output
    and ``error`` set to the exception's type, message and last frame."""
    import time

    t0 = time.perf_counter()
    try:
        return fn(ids, max_new_tokens, eos)
    except Exception as exc:  # recorded per question: the bench goes on
        frame = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        where = f" ({frame[0].filename.rsplit('/', 1)[-1]}:{frame[0].lineno})" if frame else ""
        return Run([], time.perf_counter() - t0, 0.0, error=f"{type(exc).__name__}: {exc}{where}")


def make_record(
    sample: Sample,
    method: Any,
    run: Any,
    prompt_ids: list[int],
    cmp: Any,
    tokenizer: Any,
    index: int,
    order: int,
    checked: bool = True,
    turn: int = 1,
) -> dict[str, Any]:
    """One JSONL line: Spec-Bench's fields plus ours (see docs/benchmarks.md); ``lossless`` is
    None for an output nothing was compared with (``checked=False``: HF sampling, a failed run
    or a failed reference)."""
    n = len(run.output_ids)
    text = None
    if tokenizer is not None:
        try:
            text = tokenizer.decode(run.output_ids, skip_special_tokens=True)
        except Exception:  # a tokenizer that cannot decode some id: keep the ids only
            text = None
    failed = run.error is not None
    return {
        "question_id": sample.id,
        "task": sample.task,
        "turn": turn,
        "category": sample.meta.get("category"),
        "method": method.name,
        "plugin": method.plugin,
        "options": {k: v for k, v in method.options.items()},
        "new_tokens": n,
        "wall_time": run.wall_time,
        "accept_lengths": run.accept_lengths,
        "tokens_per_s": n / run.wall_time if run.wall_time > 0 else 0.0,
        "tau": n / run.forwards if run.forwards else None,
        "forwards": run.forwards,
        "drafted": run.drafted,
        "accepted": run.accepted,
        "acceptance": (run.accepted / run.drafted) if run.drafted else None,
        "phase_s": run.phase_s,
        "prefill_s": run.prefill_s,
        "prefill_new_tokens": run.prefill_new_tokens,
        "weight_layout": run.weight_layout,
        "weight_bytes": run.weight_bytes,
        "choices": run.choices,
        "extra": run.extra,
        **({"members": run.members} if run.members else {}),
        "prompt_tokens": len(prompt_ids),
        "lossless": (cmp is None or bool(cmp.equal)) if checked and not failed else None,
        "near_tie": bool(cmp is not None and cmp.near_tie),
        "margin": None if cmp is None else cmp.margin,
        "bound": None if cmp is None else cmp.bound,
        "diverged_at": None if cmp is None else cmp.index,
        "error": run.error,
        "sample_index": index,
        "order": order,
        "output_ids": list(run.output_ids),
        "output": text,
    }
