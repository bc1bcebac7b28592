"""The machine's cost-per-width curve: what verifying a block of ``w`` tokens costs.

On a CPU a forward is bound by the bytes of weights it reads, so a block of 8 tokens costs
little more than one, up to a width where the arithmetic takes over; on a GPU the knee sits
elsewhere. Draft trees (:func:`selfspec.draft_tree`) size themselves with this curve, so it is
measured, not assumed: :func:`measure_cost_curve` times full-model forwards of blocks of
several widths over a cached prefix, the widths interleaved within each repeat (drift and other
processes' load hit every width alike), and keeps each width's fastest time (other processes
only ever add time, so the minimum is the least disturbed estimate) divided by the one-token
time. :func:`cost_curve` measures once per model *shape* (architecture, depth,
width, vocabulary, dtype, weight layout) and machine (CPU model, instruction-set level,
threads, device) and keeps the result as a JSON artefact in ``<cache dir>/drafttree/``, with
the raw timings and the machine it came from; later processes read it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from selfspec._engine.runner import Runner
from selfspec._engine.tuning import calibration, machine
from selfspec._engine.tuning.artefacts import ArtefactStore

#: Where measured curves are kept: ``<selfspec cache dir>/drafttree/``.
STORE = ArtefactStore("drafttree")
#: Block widths measured by default (a verified tree holds the pending token plus its nodes).
WIDTHS = (1, 2, 4, 8, 16, 32)
CURVE_VERSION = 3

_MEMO: dict[str, CostCurve] = {}


@dataclass(frozen=True)
class CostCurve:
    """Cost of a forward over a block of ``w`` tokens, in one-token forwards (``cost(1) == 1``).

    ``widths``: increasing, starting at 1; ``costs``: the same length, non-decreasing, ``costs[0]
    == 1``. Between widths the cost is interpolated linearly, beyond the last it grows with the
    last segment's slope. Called as ``curve(w)``. ``meta``: how it was made (machine, raw
    seconds, the command); a draft pass's curve also holds ``relative``, :attr:`relative`.
    :meth:`from_times` builds one from measured seconds; :meth:`as_dict` and :meth:`from_dict`
    are its JSON form.
    """

    widths: tuple[int, ...]
    costs: tuple[float, ...]
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.widths or self.widths[0] != 1 or len(self.widths) != len(self.costs):
            raise ValueError("a cost curve needs widths starting at 1 and one cost per width")
        if any(b <= a for a, b in zip(self.widths, self.widths[1:])):
            raise ValueError("cost curve widths must increase")

    def __call__(self, width: int) -> float:
        w, c = self.widths, self.costs
        if width <= w[0]:
            return c[0]
        for i in range(1, len(w)):
            if width <= w[i]:
                return c[i - 1] + (c[i] - c[i - 1]) * (width - w[i - 1]) / (w[i] - w[i - 1])
        if len(w) == 1:
            return c[0] * width
        slope = (c[-1] - c[-2]) / (w[-1] - w[-2])
        return c[-1] + slope * (width - w[-1])

    @classmethod
    def from_times(cls, widths: Sequence[int], seconds: Sequence[float], **meta: Any) -> CostCurve:
        """A curve from per-width times: each divided by the one-token time, then made
        non-decreasing (a wider block never costs less than a narrower one; a lower time is
        measurement noise)."""
        base = float(seconds[0])
        costs: list[float] = []
        for s in seconds:
            costs.append(max(float(s) / base, costs[-1] if costs else 1.0))
        return cls(tuple(int(w) for w in widths), tuple(costs), dict(meta))

    @property
    def relative(self) -> float | None:
        """A curve of draft passes (``cost_curve(runner, weights=...)``): a one-token draft pass's
        time over a one-token forward of the full model, timed in the same rounds (``None`` for
        the model's own curve). A draft pass of width ``w`` then costs ``relative * self(w)``
        one-token forwards."""
        value = self.meta.get("relative")
        return None if value is None else float(value)

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (what the store keeps)."""
        return {
            "version": CURVE_VERSION,
            "widths": list(self.widths),
            "costs": list(self.costs),
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, blob: dict[str, Any]) -> CostCurve:
        """The curve of :meth:`as_dict`'s JSON form."""
        return cls(
            tuple(int(w) for w in blob["widths"]),
            tuple(float(c) for c in blob["costs"]),
            dict(blob.get("meta") or {}),
        )


def measure_cost_curve(
    runner: Runner,
    widths: Sequence[int] = WIDTHS,
    *,
    prefix: int = 128,
    repeats: int = 5,
    weights: Any = None,
) -> CostCurve:
    """Time full-model forwards of blocks of each width (with all their logits, as a tree's
    verification computes them) at slot ``prefix`` of a cache holding ``prefix`` tokens; the
    widths interleaved within each of ``repeats`` rounds, after one warm-up round; each width's
    fastest time counts (load from other processes only adds time), divided by the one-token
    time, made non-decreasing. ``weights``: time draft passes on these draft weights
    (:func:`selfspec.draft_weights`) instead: the curve of a draft pass's cost by width, and a
    one-token full forward in every round too, for :attr:`CostCurve.relative`."""
    widths = sorted(set(int(w) for w in widths) | {1})
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, runner.vocab_size, (prefix + max(widths),), generator=gen).to(
        runner.device
    )
    cache = runner.new_cache(prefix + max(widths))
    runner.forward(ids[:prefix], cache=cache, start=0, logits=None)
    times: dict[int, list[float]] = {w: [] for w in widths}
    full: list[float] = []  # one-token forwards of the full model (with draft weights only)
    for r in range(repeats + 1):
        for w in [*widths, *([0] if weights is not None else [])]:  # 0: the full model's one token
            t0 = time.perf_counter()
            runner.forward(
                ids[prefix : prefix + max(w, 1)],
                cache=cache,
                start=prefix,
                weights=weights if w else None,
            )
            _sync(runner.device)
            if r:  # round 0 warms up
                (times[w] if w else full).append(time.perf_counter() - t0)
    seconds = [min(times[w]) for w in widths]
    extra = {"relative": seconds[0] / min(full), "full_seconds": min(full)} if full else {}
    return CostCurve.from_times(
        widths,
        seconds,
        seconds_per_width=seconds,
        prefix=prefix,
        repeats=repeats,
        machine=_machine(runner),
        **extra,
    )


def cost_curve(
    runner: Runner,
    *,
    store: ArtefactStore | None = None,
    refresh: bool = False,
    widths: Sequence[int] = WIDTHS,
    weights: Any = None,
) -> CostCurve:
    """This model shape's cost curve on this machine: from the process, else from the store
    (``<cache dir>/drafttree/costcurve-<key>.json``, with its raw timings and machine), else
    measured now (36 forwards, a few seconds at 1.5B) and saved.
    The key names the architecture, depth, width, vocabulary, dtype, weight layout and a hash of
    the CPU model, instruction-set level, threads, device and torch's version, so a new torch's
    kernels are measured again. ``refresh=True`` measures again (do it on a quiet machine: the
    curve is only as good as the timings). ``widths``: the block widths measured (a tree of
    ``n`` nodes verifies ``n + 1`` tokens). ``weights``: the curve of draft passes on these
    draft weights (:func:`selfspec.draft_weights`; its backend, compressed layers and draft
    vocabulary join the key), for :func:`selfspec.draft_tree`'s ``draft_curve``: a compressed
    copy's kernels grow with the width unlike the full model's (the int8 copy of a 1.5B model
    on a Zen 4: 1.48 at 8 rows against the full model's 1.22), so a drafter passes it to
    ``draft_tree``; qspec, selfsd and clasp do. The model's own curve when they compress nothing
    (``none``)."""
    store = store or STORE
    if weights is not None and not weights.layers and weights.head_module is None:
        weights = None  # the model's own layers and head: its own curve
    key = curve_key(runner) + ("" if weights is None else f"-draft-{_weights_key(weights)}")
    path = store.path(f"costcurve-{key}.json")
    memo = f"{path}"
    refresh = refresh or (calibration.again() and memo not in _MEMO)
    if not refresh and memo in _MEMO:
        return _MEMO[memo]
    curve = None if refresh else _load(path)
    if curve is None:
        curve = measure_cost_curve(runner, widths, weights=weights)
        store.save_text(path, json.dumps({**curve.as_dict(), "key": key}, indent=1) + "\n")
    _MEMO[memo] = curve
    return curve


def curve_key(runner: Runner) -> str:
    """The file-name key of a cost curve: model shape, dtype, layout and a hash of the machine
    (torch's version among its facts: a new kernel is measured again)."""
    m = _machine(runner)
    shape = (
        f"{getattr(runner.config, 'model_type', 'model')}-"
        f"{runner.n_layers}x{runner.hidden_size}x{runner.vocab_size}"
    )
    dtype = str(runner.dtype).removeprefix("torch.")
    digest = hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest()[:10]
    return f"{shape}-{dtype}-{runner.weight_layout}-{digest}"


# ------------------------------------------------------------------------------ helpers
def _weights_key(weights: Any) -> str:
    """Draft weights in a curve's key: backend, compressed layers, vocabulary."""
    vocab = (
        "all"
        if weights.vocab is None
        else hashlib.sha256(
            weights.vocab.detach().to("cpu", torch.int64).numpy().tobytes()
        ).hexdigest()[:8]
    )
    return f"{weights.backend}-{len(weights.layers)}-{vocab}"


def _machine(runner: Runner) -> dict[str, Any]:
    """What the curve depends on besides the model's shape."""
    info: dict[str, Any] = {
        "device": str(runner.device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    if runner.device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(runner.device)
    else:
        info["cpu"] = machine.cpu_model()
        info["cpu_capability"] = machine.cpu_capability().label
    return info


def _load(path: Path) -> CostCurve | None:
    if not path.is_file():
        return None
    try:
        blob = json.loads(path.read_text(encoding="utf-8"))
        if blob.get("version") != CURVE_VERSION:
            return None
        return CostCurve.from_dict(blob)
    except (ValueError, KeyError, TypeError):
        return None  # unreadable or from another version: measure again


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
