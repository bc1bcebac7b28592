"""The agreement gate: a 4-bit draft copy that ``auto`` measured fastest runs only if it drafts
(nearly) as well as the copy that would run otherwise.

``auto`` times every draft-weights candidate on the model's shapes
(:func:`selfspec._engine.drafting.draftweights.choice.choose_draft_weights`). The 4-bit
copies (the formats registered ``gated=True``: ``int4``, ``bnb-nf4``; :func:`gated`) read half the
bytes of the 8-bit ones and are often the fastest, but they round the weights more coarsely: on one
model that costs a point of agreement with the model, on another many, and a draft that agrees less
has fewer of its tokens accepted. Speed alone cannot see that, so a gated candidate that wins on
speed must also pass this gate, on the model's own weights:

* **The text.** :data:`TOKENS` tokens the model writes itself, through the fallback copy (the
  copy that runs if the gate refuses): from its BOS token (else EOS, else token 0), each next
  token drawn from the :data:`TOP_K` most likely at :data:`TEMPERATURE` by a generator seeded
  with :data:`SEED`, never one that would repeat a 3-gram of the text. Drafts predict the
  model's own continuations, so its own text is their distribution; sampling and the 3-gram
  rule keep it out of the loops a small model falls into from a bare BOS (a loop every copy
  predicts says nothing).
* **The reference.** The model's own argmax at every position, one full-model pass over the text.
* **Agreement.** At each of the text's last :data:`POSITIONS` positions, a read-only one-token
  forward of the copy over the model's own cache of the text before it (as a draft token runs:
  one row, so a dynamically quantized copy rounds as in a decode): does the model's token rank
  among the copy's :data:`RANKS` most likely? The drafters draft trees, whose branches accept
  the model's token where it is the copy's second choice; counting the first choice only
  overstated the 4-bit copies' loss in a decode (a τ 3.5 % lower where the first choice agreed
  8 points less).
* **The rule.** Each copy's agreement ``a`` stands for the chance that a draft token is
  accepted, its measured seconds per draft pass ``c`` (the mean of the one-row and tree-width
  passes timed) for its cost, and the model's own forward of a few tokens ``v`` (the ``none``
  candidate's time) for a verification. A chain of
  ``k`` draft tokens then commits ``(1 - a**(k+1)) / (1 - a)`` tokens on average for
  ``k * c + v`` seconds; a copy's score is the best of those rates over ``k`` up to
  :data:`DEPTH`. The gated copy runs when its score is at least the fallback's: a point of
  agreement is worth losing for a copy enough cheaper, and not for one barely cheaper.

The agreements are kept per weights (a hash of the embedding's and the norms' values, which no
layout re-lays, not of the model's shape: two models of one shape share a timing, not an
agreement), backend pair and machine, beside the timings in
``<cache dir>/calibration/``. It takes seconds once (a 1.5B model: about 15 s on 2 cores, and
building the gated copy). ``SELFSPEC_CALIBRATE=0`` never measures, and never picks a gated copy.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from selfspec._engine.runner.formats import weight_formats
from selfspec._engine.tuning import calibration, progress
from selfspec._engine.tuning.progress import MEASURING


#: The backends ``auto`` may pick only through this gate.
def gated(backend: str) -> bool:
    """Whether ``auto`` runs the draft format ``backend`` only through this gate (registered
    ``gated=True``)."""
    fmt = weight_formats("draft").get(backend)
    return fmt is not None and fmt.gated


#: Tokens of the model's own text.
TOKENS = 112
#: Positions (the text's last) at which agreement is counted.
POSITIONS = 96
#: Sampling: the most likely tokens each next token is drawn from, its temperature, and the
#: generator's seed.
TOP_K = 20
TEMPERATURE = 0.7
SEED = 0
#: A position agrees when the model's token ranks among the copy's this many most likely.
RANKS = 2
#: The longest draft chain the rule weighs.
DEPTH = 8
VERSION = 2

#: ``(runner, backends) -> {backend: agreement}``: the measuring function (the real one:
#: :func:`measure_agreement` over the draft weights' copies), replaceable in tests.
MeasureAgreement = Callable[[Any, Sequence[str]], dict[str, float]]

_MEMO: dict[str, tuple[dict[str, float], int, str]] = {}


@dataclass(frozen=True)
class Verdict:
    """The gate's verdict on ``gated`` against ``fallback``: ``admitted``; each one's
    ``agreement`` with the model over ``positions`` positions (``how``: ``"measured"`` or
    ``"cached"``) and ``rate``, the rule's committed tokens per second of a chain draft."""

    gated: str
    fallback: str
    admitted: bool
    agreement: dict[str, float]
    rate: dict[str, float]
    positions: int
    how: str = "measured"

    def note(self) -> str:
        """``int4 agrees 0.948 with the model, int8 0.979 (96 positions, measured; 29.1
        against 25.6 tokens/s by the rule): admitted``."""
        a, r = self.agreement, self.rate
        verdict = "admitted" if self.admitted else "refused"
        return (
            f"{self.gated} agrees {a[self.gated]:.3f} with the model, {self.fallback} "
            f"{a[self.fallback]:.3f} ({self.positions} positions, {self.how}; {r[self.gated]:.1f} "
            f"against {r[self.fallback]:.1f} tokens/s by the rule): {verdict}"
        )


def rate(agreement: float, draft_s: float, verify_s: float, depth: int = DEPTH) -> float:
    """Committed tokens per second of a chain draft by the rule (module doc): the best over
    ``k = 1..depth`` of ``(1 - a**(k+1)) / (1 - a)`` tokens per ``k * draft_s + verify_s``
    seconds (``a`` the agreement, at most just below 1)."""
    a = min(max(agreement, 0.0), 1 - 1e-9)
    return max((1 - a ** (k + 1)) / (1 - a) / (k * draft_s + verify_s) for k in range(1, depth + 1))


def gate_terms(
    seconds: dict[str, dict[int, float]], static: str = "int8"
) -> tuple[str, dict[str, float], float]:
    """``(fallback, draft_s, verify_s)`` from ``auto``'s draft-weights timings
    (``{copy: {width: seconds}}``, :attr:`selfspec._engine.tuning.calibration.Choice.seconds`): the
    fastest ungated copy (``static`` when too close to call), each copy's mean pass over the widths
    timed (chains' and trees' passes), and the model's own (``none``) forward at the widest block
    timed."""
    fallback = calibration.decide({c: s for c, s in seconds.items() if not gated(c)}, {}, static)[0]
    draft_s = {c: sum(s.values()) / len(s) for c, s in seconds.items()}
    return fallback, draft_s, max(seconds["none"].items())[1]


def gate(
    runner: Any,
    gated: str,
    fallback: str,
    draft_s: dict[str, float],
    verify_s: float,
    *,
    measure: MeasureAgreement,
    remember: bool = True,
    store: Any = None,
    report: bool = False,
) -> Verdict:
    """The :class:`Verdict` on draft weights ``gated`` against ``fallback`` for ``runner``'s
    model, given each one's seconds per draft pass ``draft_s`` and a verification's
    ``verify_s``. ``measure(runner, (gated, fallback))`` measures the agreements (the draft
    weights' own: :func:`selfspec._engine.drafting.draftweights.shadow.agreement_measure`). With
    ``remember``, they are measured once per weights and backend pair and then
    read from the store (``False``: measured every call, nothing kept; for tests). The verdict
    is printed once per process where the agreements were measured now, or with ``report``
    (the timings were: their progress line named the gated copy, which may not run)."""
    key = _key(runner, gated, fallback) if remember else ""
    fresh = remember and key not in _MEMO
    found = _remembered(runner, key, gated, fallback, measure, store) if remember else None
    agreement, positions, how = found or (measure(runner, (gated, fallback)), POSITIONS, "measured")
    rates = {b: rate(agreement[b], draft_s[b], verify_s) for b in (gated, fallback)}
    verdict = Verdict(
        gated, fallback, rates[gated] >= rates[fallback], agreement, rates, positions, how
    )
    if fresh and (how == "measured" or report):
        progress.say(verdict.note(), headline=MEASURING)
    return verdict


def cached_agreements(store: Any = None) -> list[str]:
    """One line per agreement measured here so far (``specdec plugins`` lists them):
    ``qwen2 28x1536 (Qwen2.5-Coder-1.5B): int4 1.000, int8 1.000 (96 positions)``. Which
    copy runs also depends on the timings, which the rule weighs at each use."""
    store = store or calibration.STORE
    lines = []
    for path in sorted(store.path("x").parent.glob("agreement-*.json")):
        try:
            blob = json.loads(path.read_text(encoding="utf-8"))
            if blob.get("version") != VERSION:
                continue
            a = blob["agreement"]
            lines.append(
                f"{blob.get('model', '?')}: {blob['gated']} {a[blob['gated']]:.3f}, "
                f"{blob['fallback']} {a[blob['fallback']]:.3f} ({blob['positions']} positions)"
            )
        except (ValueError, KeyError, TypeError, OSError):
            continue
    return lines


@torch.inference_mode()
def measure_agreement(
    runner: Any,
    backends: Sequence[str],
    copy: Callable[[str], tuple[Any, Callable[[], None]]],
    *,
    tokens: int = TOKENS,
    positions: int = POSITIONS,
) -> dict[str, float]:
    """``{backend: agreement}``: how often each backend's draft weights (whole vocabulary, every
    layer) rank the model's own argmax among their :data:`RANKS` most likely, on the model's
    own text (see the module doc; the
    text is written through ``backends[-1]``, the fallback). ``copy(backend)`` gives the draft
    weights and a function that frees them if they were built for this. One copy at a time,
    last first, each freed once measured except the first backend's (the gated one, which
    ``auto`` then usually runs; the caller frees it if not): at most one copy built here is in
    memory at once."""
    if not 0 < positions < tokens:
        raise ValueError(f"agreement needs 0 < positions < tokens, got {positions} and {tokens}")
    out: dict[str, float] = {}
    text = ref = cache = None
    for i, b in reversed(list(enumerate(backends))):
        dw, release = copy(b)
        if text is None:
            text = _own_text(runner, dw, tokens)  # [tokens]
            cache = runner.new_cache(tokens)
            ref = runner.forward(text, cache=cache, start=0).logits.argmax(
                -1
            )  # [tokens]: the model's next tokens
        hits = 0
        for t in range(tokens - positions, tokens):
            logits = runner.forward(
                text[t : t + 1], cache=cache, start=t, write=False, weights=dw
            ).logits
            hits += int(bool((logits[-1].topk(RANKS).indices == ref[t]).any()))
        out[b] = hits / positions
        del dw
        if i:
            release()
    return {b: out[b] for b in backends}


# ------------------------------------------------------------------------------ helpers
def _key(runner: Any, gated: str, fallback: str) -> str:
    """The pair's name in the store: the weights' hash and both backends."""
    return f"agreement-{_weights_digest(runner)}-{gated}-{fallback}"


def _remembered(
    runner: Any, key: str, gated: str, fallback: str, measure: MeasureAgreement, store: Any
) -> tuple[dict[str, float], int, str]:
    """``(agreement, positions, how)`` for the pair on this model (``key``: :func:`_key`): this
    process's, else the store's, else measured now (a progress line on stderr) and saved."""
    if key in _MEMO:
        return _MEMO[key]
    path = (store or calibration.STORE).path(f"{key}.json")
    if path.is_file():
        try:
            blob = json.loads(path.read_text(encoding="utf-8"))
            if blob.get("version") == VERSION:
                agreement = {str(k): float(v) for k, v in blob["agreement"].items()}
                _MEMO[key] = (agreement, int(blob["positions"]), "cached")
                return _MEMO[key]
        except (ValueError, KeyError, TypeError):
            pass  # unreadable: measure again
    progress.say(
        f"measuring how often {gated} and {fallback} draft weights agree with the model "
        f"(once per model and machine)...",
        headline=MEASURING,
    )
    agreement = measure(runner, (gated, fallback))
    (store or calibration.STORE).save_text(
        path,
        json.dumps(
            {
                "version": VERSION,
                "gated": gated,
                "fallback": fallback,
                "agreement": agreement,
                "positions": POSITIONS,
                "model": _model_label(runner),
                "machine": calibration.machine_facts(),
            },
            indent=1,
        )
        + "\n",
    )
    _MEMO[key] = (agreement, POSITIONS, "measured")
    return _MEMO[key]


def _own_text(runner: Any, weights: Any, tokens: int) -> torch.Tensor:
    """``[tokens]`` int64: the model's own text through ``weights`` (module doc), seeded."""
    cfg = getattr(runner.model, "config", None)
    first = next(
        (
            t
            for t in (getattr(cfg, "bos_token_id", None), getattr(cfg, "eos_token_id", None))
            if t is not None
        ),
        0,
    )
    first = int(first[0] if isinstance(first, (list, tuple)) else first)
    gen = torch.Generator().manual_seed(SEED)
    ids = [first]
    cache = runner.new_cache(tokens)
    for t in range(tokens - 1):
        logits = (
            runner.forward(
                torch.tensor(ids[-1:], device=runner.device),
                cache=cache,
                start=t,
                weights=weights,
                logits="last",
            )
            .logits[-1]
            .float()
            .cpu()
        )  # [V]
        repeats = [
            ids[i + 2] for i in range(len(ids) - 2) if ids[i] == ids[-2] and ids[i + 1] == ids[-1]
        ]
        if repeats:  # never a 3-gram twice
            logits[torch.tensor(repeats)] = float("-inf")
        top = logits.topk(min(TOP_K, logits.numel()))
        probs = torch.softmax(top.values / TEMPERATURE, -1)
        ids.append(int(top.indices[int(torch.multinomial(probs, 1, generator=gen))]))
    return torch.tensor(ids, dtype=torch.long, device=runner.device)


def _model_label(runner: Any) -> str:
    """``qwen2 28x1536 (Qwen2.5-Coder-1.5B-Instruct)``: the model's type, layers x width, and
    the name it was loaded from where it has one."""
    cfg = getattr(runner.model, "config", None)
    name = str(getattr(cfg, "_name_or_path", "") or "").rstrip("/").rsplit("/", 1)[-1]
    label = (
        f"{getattr(cfg, 'model_type', 'model')} "
        f"{len(runner.layers)}x{runner.embedding.weight.shape[1]}"
    )
    return f"{label} ({name})" if name else label


def _weights_digest(runner: Any) -> str:
    """Sixteen hex digits from the values of the model's weights that no weight layout
    re-lays (a strided sample of the embedding and every decoder layer's norm weights), its
    layer count, shapes and dtype: the same in a runner of any layout."""
    h = hashlib.sha256()
    tensors = [runner.embedding.weight]
    tensors += [
        p for layer in runner.layers for name, p in layer.named_parameters() if "norm" in name
    ]
    for t in tensors:
        flat = t.detach().reshape(-1)
        step = max(1, flat.numel() // 4096)
        h.update(f"{tuple(t.shape)}{t.dtype}".encode())
        h.update(flat[::step].to("cpu", torch.float64).numpy().tobytes())
    h.update(f"{len(runner.layers)}".encode())
    return h.hexdigest()[:16]
