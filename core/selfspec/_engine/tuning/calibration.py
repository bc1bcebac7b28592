"""Measured choices: which weight layout, draft weights and one-token width are fastest *here*.

This module times candidates it is handed and keeps the verdicts; it knows no layout, format
or model. The choosers above it (:mod:`selfspec._engine.runner.layout_choice` for layouts and
the one-token width, :mod:`selfspec._engine.drafting.draftweights.choice` for draft weights)
sample the model and pass each candidate as a callable that builds its copies of the sample.

Which kernels win depends on the machine, not on its instruction set alone: float32 products
run on MKL in the model's own layout and on oneDNN when prepacked, MKL is fast on Intel and
slow on AMD, and the int8 kernels' speed depends on VNNI and the vendor as well. So ``auto``
(``weight_layout="auto"``, ``draft_weights="auto"``) is decided by timing the candidates on
the model's own shapes, once per machine, model shape, dtype and thread count (and, for the
packed layout, whether a one-token product runs faster as 4 rows, :func:`choose_one_row_width`):

* the products of a sample of the model's decoder layers (the middle ones, at least
  :data:`SAMPLE_BYTES` of weights, so the timing streams from memory as a decode does, not from
  the caches) and a slice of the LM head's rows, each candidate holding its own copy of that
  sample only, for a block of 1 token and of :data:`BLOCK` tokens (a verification);
* the candidates interleaved within each of a few rounds after a warm-up round (drift and
  other processes' load hit them alike), each candidate's fastest time counting;
* a candidate's score: its estimated full-model product time at 1 token plus at
  :data:`BLOCK` tokens (every decode runs both kinds of forward); the lowest score wins.

When the two best are closer than the measurement's own spread (a busy machine), the choice is
the *static* rule (the one used before anything is measured: :func:`selfspec._engine.runner.
layout.choose_layout`'s capability rule, ``int8`` draft weights on CPU) and the record says
why. ``SELFSPEC_CALIBRATE=0`` skips measuring and takes the static rule too. The result, with
every candidate's seconds, is a JSON artefact in ``<cache dir>/calibration/``; later processes
read it (``refresh=True`` or ``SELFSPEC_CALIBRATE=again`` measures again; a choice measured on a
busy machine is measured again by the first process that finds it quiet). An explicit layout or
backend is never overridden.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from selfspec._engine.tuning import machine, progress
from selfspec._engine.tuning.artefacts import ArtefactStore

#: Where measured choices are kept: ``<selfspec cache dir>/calibration/``.
STORE = ArtefactStore("calibration")
#: The block width standing for a verification forward.
BLOCK = 8
#: Timed rounds after the warm-up round.
ROUNDS = 5
#: Two scores closer than this fraction are a tie even on a quiet machine.
MIN_MARGIN = 0.03
#: Set to ``0`` to take the static rule without measuring.
ENV = "SELFSPEC_CALIBRATE"
VERSION = 1

_MEMO: dict[str, Choice] = {}

#: ``{candidate: callable(width)}`` -> ``{candidate: {width: [seconds per round]}}``; the
#: measuring function, replaceable in tests (:func:`measure_candidates` is the real one).
Measure = Callable[
    [Mapping[str, Callable[[int], float]], Sequence[int]], dict[str, dict[int, list[float]]]
]
#: Builds one candidate's copies of the sample (sampled layers, then the head rows).
Build = Callable[[str], list[nn.Module]]


@dataclass(frozen=True)
class Choice:
    """One measured choice. ``what``: ``"weight_layout"`` or ``"draft_weights"``; ``chosen``:
    the candidate that runs; ``how``: ``"measured"``, ``"cached"`` (measured by an earlier
    process), or ``"static: <why>"`` (not measured, or too close to call); ``seconds``:
    ``{candidate: {width: seconds}}``, each candidate's fastest time for its products over the
    whole model (estimated from the sample); ``key``: the artefact's key."""

    what: str
    chosen: str
    how: str
    seconds: dict[str, dict[int, float]] = field(default_factory=dict)
    key: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "chosen": self.chosen,
            "how": self.how,
            "key": self.key,
            "seconds": {c: {str(w): s for w, s in ws.items()} for c, ws in self.seconds.items()},
        }

    @classmethod
    def from_dict(cls, blob: Mapping[str, Any]) -> Choice:
        seconds = {
            c: {int(w): float(s) for w, s in ws.items()}
            for c, ws in blob.get("seconds", {}).items()
        }
        return cls(
            str(blob["what"]),
            str(blob["chosen"]),
            str(blob["how"]),
            seconds,
            str(blob.get("key", "")),
        )

    def note(self) -> str:
        """One line for stderr and tables: ``weight layout packed (measured: packed 21.0/30.1 ms,
        model 35.2/38.0 ms at 1/8 tokens)``."""
        what = self.what.replace("_", " ")
        if not self.seconds:
            return f"{what} {self.chosen} ({self.how})"
        widths = sorted({w for ws in self.seconds.values() for w in ws})
        parts = ", ".join(
            f"{c} " + "/".join(f"{ws[w] * 1e3:.1f}" for w in widths if w in ws)
            for c, ws in self.seconds.items()
        )
        return (
            f"{what} {self.chosen} ({self.how}: {parts} ms at {'/'.join(map(str, widths))} tokens)"
        )


# ------------------------------------------------------------------------------ choosing
def decide(
    seconds: Mapping[str, Mapping[int, float]], spread: Mapping[str, float], static: str
) -> tuple[str, str]:
    """``(chosen, how)`` from each candidate's seconds per width (its fastest round) and the
    relative spread of its score (the sum over widths of its median rounds over the sum of its
    fastest, minus one). The lowest sum over widths wins over ``static`` when it beats
    ``static``'s fastest by more than :data:`MIN_MARGIN` and by more than its own spread (so
    even its median rounds are faster: a noisy ``static`` only makes its fastest round an
    optimistic figure); otherwise ``static`` (``how`` says by how much and why)."""
    scores = {c: sum(ws.values()) for c, ws in seconds.items()}
    ranked = sorted(scores, key=scores.__getitem__)
    best = ranked[0]
    if len(ranked) == 1 or best == static:
        return best, "measured"
    tol = max(MIN_MARGIN, spread.get(best, 0.0))
    if static in scores and scores[static] <= scores[best] * (1 + tol):
        gap = scores[static] / scores[best] - 1
        return (
            static,
            f"static: {best} was {gap:.0%} faster, within the measurement's spread ({tol:.0%})",
        )
    return best, "measured"


def measure_candidates(
    candidates: Mapping[str, Callable[[int], float]], widths: Sequence[int], *, rounds: int = ROUNDS
) -> dict[str, dict[int, list[float]]]:
    """``{candidate: {width: [seconds per round]}}``: ``candidates[c](w)`` (which times itself
    and returns seconds) for every candidate and width, one warm-up round then ``rounds``
    rounds, candidates and widths interleaved within each."""
    times: dict[str, dict[int, list[float]]] = {c: {w: [] for w in widths} for c in candidates}
    for r in range(rounds + 1):
        for c, run in candidates.items():
            for w in widths:
                seconds = run(w)
                if r:
                    times[c][w].append(seconds)
    return times


def cached_choices(store: ArtefactStore | None = None) -> list[tuple[str, Choice]]:
    """``[(key, choice)]`` of every choice measured on this machine with this process's threads
    (``specdec plugins`` lists them): what ``auto`` will run for each model shape seen so far."""
    store = store or STORE
    digest = _digest("cpu")
    out = []
    for path in sorted(store.path("x").parent.glob("*.json")):
        try:
            blob = json.loads(path.read_text(encoding="utf-8"))
            if blob.get("version") == VERSION and str(blob.get("key", "")).endswith(digest):
                out.append((str(blob["key"]), Choice.from_dict(blob)))
        except (ValueError, KeyError, TypeError, OSError):
            continue
    return out


def enabled() -> bool:
    """Whether ``auto`` measures (``SELFSPEC_CALIBRATE`` is not ``0``)."""
    return os.environ.get(ENV, "1").strip() not in ("0", "false", "no")


def again() -> bool:
    """Whether this process measures every choice again, not reading the cache (``=again``)."""
    return os.environ.get(ENV, "").strip().lower() == "again"


def choose(
    what: str,
    key: str,
    candidates: Sequence[str],
    static: str,
    prepare: Callable[[], tuple[Build, tuple[float, float]]],
    widths: Sequence[int],
    *,
    measure: Measure | None = None,
    refresh: bool = False,
    store: ArtefactStore | None = None,
) -> Choice:
    """The choice ``what`` among ``candidates`` cached under ``key``, else measured.

    ``prepare()`` runs only to measure: it samples the model and returns ``(build, scales)``,
    ``build(candidate)`` making that candidate's copies of the sample (sampled layers, then the
    head rows) and ``scales`` the factors from the sample's time to the whole model's (layers,
    head). Each candidate's products are timed at ``widths`` rows (:func:`measure_candidates`,
    or ``measure`` in tests); :func:`decide` picks; the verdict is cached in ``store``.
    """
    if not enabled():
        return Choice(what, static, f"static: {ENV}=0")
    store = store or STORE
    path = store.path(f"{key}.json")
    refresh = refresh or (again() and key not in _MEMO)
    if not refresh and key in _MEMO:
        return _MEMO[key]
    if not refresh and measure is None and path.is_file():
        try:
            blob = json.loads(path.read_text(encoding="utf-8"))
            if blob.get("version") == VERSION and blob["chosen"] in candidates:
                if blob.get("busy_load") is None or _busy_load() is not None:
                    choice = Choice.from_dict({**blob, "how": f"cached, {blob['how']}"})
                    _MEMO[key] = choice
                    when = blob.get("measured_at") or "earlier"
                    progress.say(
                        f"{choice.note()} (measured {when}; {ENV}=again measures it again)",
                        headline="using this machine's kernel measurements from the cache "
                        f"({ENV}=again measures them again, under this run's load)",
                    )
                    return choice
                progress.say(
                    f"the cached {what.replace('_', ' ')} was measured on a busy machine "
                    f"(load {blob['busy_load']:.1f}); the machine is quiet now",
                    headline=progress.MEASURING,
                )
        except (ValueError, KeyError, TypeError):
            pass  # unreadable: measure again
    busy = _busy_load() if measure is None else None
    progress.say(
        f"measuring which {what.replace('_', ' ')} is fastest here "
        f"({', '.join(candidates)}; once per model shape and machine)...",
        headline=progress.MEASURING,
    )
    build, scales = prepare()
    runs = {c: _runner_of(build(c), scales) for c in candidates}
    raw = (measure or measure_candidates)(runs, widths)
    seconds = {c: {w: min(ts) for w, ts in raw[c].items()} for c in candidates}
    spread = {
        c: sum(statistics.median(ts) for ts in raw[c].values()) / sum(seconds[c].values()) - 1
        for c in candidates
    }
    chosen, how = decide(seconds, spread, static)
    if busy is not None:
        how += f"; on a busy machine (load {busy:.1f}): measured again once it is quiet"
    choice = Choice(what, chosen, how, seconds, key)
    if measure is None:
        store.save_text(
            path,
            json.dumps(
                {
                    **choice.as_dict(),
                    "version": VERSION,
                    "spread": spread,
                    "machine": machine_facts(),
                    "busy_load": busy,
                    "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                },
                indent=1,
            )
            + "\n",
        )
    _MEMO[key] = choice
    progress.say(choice.note(), headline=progress.MEASURING)
    return choice


def choice_key(
    what: str, shape: str, dtype: torch.dtype, extra: str, device: torch.device | str
) -> str:
    """File-name key of one choice: what, the model's shape, dtype, the extra (the candidates;
    draft weights: the runner's layout too) and a hash of the machine (CPU, capability,
    threads, forced ISA, device)."""
    return "-".join(
        p
        for p in (what, shape, str(dtype).removeprefix("torch."), extra, _digest(str(device)))
        if p
    )


def candidates_key(candidates: Sequence[str]) -> str:
    """The candidates, sorted, for a key (a new candidate is measured again)."""
    return ",".join(sorted(candidates))


def machine_facts() -> dict[str, Any]:
    """What a measured choice depends on besides the model: CPU, capability, forced ISA,
    threads, torch's version."""
    return {
        "cpu": machine.cpu_model(),
        "cpu_capability": machine.cpu_capability().label,
        "forced_isa": machine.forced_isa(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }


# ------------------------------------------------------------------------------ helpers
def _runner_of(modules: list[nn.Module], scales: tuple[float, float]) -> Callable[[int], float]:
    """A callable that runs every product of ``modules`` (sampled layers, then the head rows)
    on a block of ``w`` rows and returns the seconds it took, scaled to the whole model
    (layers' time times ``scales[0]``, the head's times ``scales[1]``)."""
    layer_products = [p for m in modules[:-1] for p in _products(m)]
    head_products = _products(modules[-1])
    ref = next(
        (t for m in modules for t in [*m.parameters(), *m.buffers()] if t.is_floating_point()), None
    )
    dtype = ref.dtype if ref is not None else torch.float32
    device = ref.device if ref is not None else torch.device("cpu")
    gen = torch.Generator().manual_seed(0)
    inputs: dict[tuple[int, int], torch.Tensor] = {}

    def x_for(p: nn.Module, w: int) -> torch.Tensor:
        if (p.in_features, w) not in inputs:
            inputs[(p.in_features, w)] = torch.randn(1, w, p.in_features, generator=gen).to(
                device, dtype
            )
        return inputs[(p.in_features, w)]  # one tensor per width: fused products compute once

    @torch.inference_mode()
    def run(w: int) -> float:
        spent = []
        for group, scale in ((layer_products, scales[0]), (head_products, scales[1])):
            t0 = time.perf_counter()
            for p in group:
                p(x_for(p, w))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            spent.append((time.perf_counter() - t0) * scale)
        return sum(spent)

    return run


def _products(module: nn.Module) -> list[nn.Module]:
    """The modules of ``module`` that compute a product (leaves with ``in_features``), in
    order; a bare product module is its own list."""
    return [
        m
        for m in module.modules()
        if hasattr(m, "in_features") and not any(hasattr(c, "in_features") for c in m.children())
    ]


def _busy_load() -> float | None:
    """The load average when the machine is busy (:func:`selfspec._engine.tuning.machine.is_busy`),
    else ``None``. A choice measured while busy is cached, and measured again by the first process
    that finds the machine quiet."""
    load = machine.load_average()
    return load if machine.is_busy(load, machine.physical_cores()) else None


def _digest(device: str) -> str:
    """Ten hex digits naming this machine (CPU, capability, forced ISA, threads) and device."""
    return hashlib.sha256(
        json.dumps({**machine_facts(), "device": device}, sort_keys=True).encode()
    ).hexdigest()[:10]
