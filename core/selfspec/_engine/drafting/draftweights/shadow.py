"""The draft weights of a model: compressed copies of its decoder layers and LM head that
only draft passes read, built once per model and process and shared by every runner and
plugin over the model.

``runner.forward(..., weights=dw)`` runs ``dw``'s layers in place of the model's and
projects through ``dw``'s head; verification never passes ``weights``, so it reads the
model's own weights and the output stays exactly greedy decoding. A draft vocabulary (a
subset of token ids, see :mod:`.vocab`) restricts the head to those rows: the logits are
still ``[..., V]`` with ``-inf`` outside the subset, so argmax, probabilities and the draft
exit work unchanged and a token outside it can never be drafted.

The embedding is not copied: a forward reads only the rows of its ``q`` tokens, so a
compressed table would cost memory and save nothing. Except on a model accelerate dispatched
with its embedding offloaded (on disk, :mod:`selfspec._engine.runner.placement`): there every
forward would load the whole table, so the draft weights keep one copy of it in memory
(``embedding``, in the model's dtype, counted in ``nbytes``) and a draft pass embeds through
it. Offloaded layers and head are read one module at a time through accelerate's hooks to
build their compressed copies, which then live in memory: a draft pass with compressed
weights never reads the disk.
"""

from __future__ import annotations

import copy
import hashlib
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from selfspec._engine.drafting.draftweights.agreement import (
    gate,
    gate_terms,
    gated,
    measure_agreement,
)
from selfspec._engine.drafting.draftweights.choice import choose_draft_weights
from selfspec._engine.drafting.draftweights.layers import (
    compress_linear,
    compressed_layer,
    layer_nbytes,
    reused_buffer,
)
from selfspec._engine.runner.formats import (
    FormatChoices,
    WeightFormatError,
    candidates,
    weight_format,
)
from selfspec._engine.runner.linears import CompressedLinear, bnb_module
from selfspec._engine.runner.placement import (
    detach_hooks,
    is_dispatched,
    is_offloaded,
    loaded,
    own_tensors,
    share_hooks,
    tensor_key,
)
from selfspec._engine.tuning.calibration import Choice

#: Names of the draft weights: ``auto`` and every registered draft format
#: (:mod:`selfspec._engine.runner.formats`), read from the registry when used.
BACKENDS: FormatChoices = FormatChoices("draft")


class DraftWeightsError(WeightFormatError):
    """A backend this device, dtype or installation cannot run, or a bad draft vocabulary
    (empty, out of range, repeated ids)."""


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype = torch.float32) -> str:
    """The backend that runs for ``backend`` on ``device`` for a model in ``dtype``.

    ``auto``: ``int8`` on CPU where its kernel runs, else ``int8-intmm`` (``auto`` then
    measures the candidates, :func:`measured_backend`), ``bnb-int8`` on CUDA with bitsandbytes
    installed, else ``none``. An explicit registered format that cannot run here (its
    ``unsupported`` gives a reason) raises :class:`DraftWeightsError` with that reason; an
    unknown name raises it listing the registered ones.
    """
    device = torch.device(device)
    if backend == "auto":
        if device.type == "cpu":
            return next(
                (
                    b
                    for b in ("int8", "int8-intmm", "int8-weights")
                    if weight_format(b, "draft").why_not(device, dtype) is None
                ),
                "none",
            )
        if device.type == "cuda" and bnb_module() is not None:
            return "bnb-int8"
        return "none"
    try:
        fmt = weight_format(backend, "draft")
    except WeightFormatError as exc:
        raise DraftWeightsError(str(exc)) from None
    why = fmt.why_not(device, dtype)
    if why:
        raise DraftWeightsError(
            f"draft weights {backend!r} cannot run here: {why}; "
            f"use 'auto' or one of {', '.join(candidates('draft', device, dtype, every=True))}"
        )
    return backend


class RowHead(nn.Module):
    """The LM head restricted to the rows ``ids`` ``[V']``, in the model's dtype: ``[..., H]``
    -> ``[..., V']`` (the ``none`` backend's head over a draft vocabulary)."""

    def __init__(self, head: nn.Module, ids: torch.Tensor) -> None:
        super().__init__()
        w = head.weight  # an adopted (packed) head unpacks once here
        self.register_buffer("weight", w.detach().index_select(0, ids.to(w.device)).contiguous())
        b = getattr(head, "bias", None)
        self.register_buffer(
            "bias", None if b is None else b.detach().index_select(0, ids.to(b.device)).clone()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight, self.bias)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers())


class _RowsOf(nn.Module):
    """Rows ``ids`` of another module's weight/bias (what :func:`compress_linear` reads)."""

    def __init__(self, head: nn.Module, ids: torch.Tensor) -> None:
        super().__init__()
        w = head.weight
        self.weight = w.detach().index_select(0, ids.to(w.device))
        b = getattr(head, "bias", None)
        self.bias = None if b is None else b.detach().index_select(0, ids.to(b.device))


@dataclass(eq=False)
class DraftWeights:
    """Compressed layers and head of one model for draft passes (:func:`draft_weights` builds
    them).

    ``backend``: the resolved backend. ``layers``: ``{layer: module}`` substitutes for the
    runner (empty for ``none``: the model's own layers run). ``head_module``: ``[..., H]`` ->
    ``[..., V']`` (``None``: the model's own head, over the whole vocabulary). ``vocab``:
    ``[V']`` int64 token ids the head projects onto, or ``None`` for all ``vocab_size``.
    ``embedding``: an in-memory copy of an offloaded embedding (else ``None``: the model's
    own). ``nbytes``: the memory these copies add to the model's (``layer_bytes`` +
    ``head_bytes`` + ``embedding_bytes``). :meth:`head` ``(runner, hidden) -> [..., V]``: the
    model's final norm, the draft head, soft-capping; ``-inf`` outside the vocabulary.
    """

    backend: str
    vocab_size: int
    layers: dict[int, nn.Module] = field(default_factory=dict)
    head_module: nn.Module | None = None
    vocab: torch.Tensor | None = None
    layer_bytes: int = 0
    head_bytes: int = 0
    embedding: nn.Module | None = None
    embedding_bytes: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes these copies add to the model's: ``layer_bytes + head_bytes + embedding_bytes``."""
        return self.layer_bytes + self.head_bytes + self.embedding_bytes

    def head(self, runner, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm (the model's) + the draft head (+ soft-capping): ``[..., H]`` -> ``[..., V]``;
        with a draft vocabulary, ``-inf`` at every token outside it."""
        if self.head_module is None:
            return runner.head(hidden)
        sub = runner.head(hidden, lm_head=self.head_module)  # sub: [..., V']
        if self.vocab is None:
            return sub
        full = sub.new_full((*sub.shape[:-1], self.vocab_size), float("-inf"))  # [..., V]
        full[..., self.vocab] = sub
        return full


# Draft weights already built, per model: layers per backend, heads per (backend, vocabulary).
_LAYERS: weakref.WeakKeyDictionary[nn.Module, dict[tuple, tuple[dict[int, nn.Module], int]]] = (
    weakref.WeakKeyDictionary()
)
_HEADS: weakref.WeakKeyDictionary[nn.Module, dict[tuple, tuple[nn.Module | None, int]]] = (
    weakref.WeakKeyDictionary()
)
_EMBEDDINGS: weakref.WeakKeyDictionary[nn.Module, dict[tuple, tuple[nn.Module, int]]] = (
    weakref.WeakKeyDictionary()
)


def _weights_key(runner) -> tuple:
    ps = [p for layer in runner.layers for p in layer.parameters()]
    ps += (
        list(runner.lm_head.parameters())
        + list(runner.lm_head.buffers())
        + list(runner.embedding.parameters())
    )
    return tuple(tensor_key(p) for p in ps)


def _vocab_key(vocab: torch.Tensor | None) -> str:
    if vocab is None:
        return "all"
    return hashlib.sha256(vocab.detach().to("cpu", torch.int64).numpy().tobytes()).hexdigest()[:16]


def draft_weights(
    runner, backend: str = "auto", vocab: torch.Tensor | None = None, *, layers: bool = True
) -> DraftWeights:
    """The :class:`DraftWeights` of ``runner``'s model with ``backend`` and draft vocabulary
    ``vocab``: compressed copies of the model's decoder layers and LM head that only draft
    passes read (``runner.forward(..., weights=dw)``, ``skip_layer_draft(..., weights=dw)``);
    verification never passes them, so it reads the model's own weights and the output is
    unchanged.

    Built on first use, one layer (and then the head) at a time, so no float32 temporary of the
    whole model is made (a weight is quantized a few thousand rows at a time); later calls for
    the same model, backend and vocabulary (from any runner or plugin) return the same copies:
    every runner and plugin over the model that asks for the same backend gets the same layer
    copies (and per vocabulary, the same head). They are rebuilt if the model's weights were
    replaced since (the key holds each weight's storage pointer and version). The embedding is
    not copied (a forward reads only its tokens' rows), except when accelerate offloaded it to
    disk: then the draft weights keep one in-memory copy (``embedding``), so a draft never reads
    the disk. Offloaded layers and head are read one module at a time through accelerate's
    hooks to build their copies. ``layers=False``: the head only (``layers`` empty, nothing
    built for them), for a drafter that runs the model's own layers and compresses only its
    projection onto the vocabulary (as hispec's exits do).

    ``backend`` (:data:`selfspec.DRAFT_WEIGHTS`): ``none`` (the model's own weights; a draft
    vocabulary still cuts the head to its rows), ``auto``, or any registered draft format
    ([weight-formats.md](docs/weight-formats.md) lists the host's; ``specdec plugins`` lists
    them with where each runs here). ``auto``: on CPU, the fastest per draft token of ``none``
    and every registered format with ``auto=True`` that runs here, *measured on this machine*
    at the model's first use; ``int8`` when the measurement cannot tell them apart; a
    ``gated`` winner (a 4-bit copy) must also pass the agreement gate: its agreement with the
    model and the fastest other copy's, measured once per model on the model's own text,
    weighed against their measured costs (a chain draft's committed tokens per second), else
    the other copy runs ([performance.md](docs/performance.md), "Measured choices"; recorded in
    ``runner.choices["draft_weights"]`` and ``Stats.choices``); ``bnb-int8`` on CUDA when
    installed, else ``none``. An explicit backend that cannot run here raises
    :class:`DraftWeightsError` naming why.

    ``vocab``: a draft vocabulary, ``[V']`` distinct token ids (from :func:`draft_vocab`), or
    ``None`` for the whole vocabulary. The head then projects onto those rows only; the logits
    stay ``[n, V]`` with ``-inf`` outside, so argmax, probabilities and draft exits work
    unchanged and a token outside is never drafted. ``specdec bench --memory`` records the
    bytes built (``draft_weights_bytes``).
    """
    kind = resolve_backend(backend, runner.device, runner.dtype)
    if backend == "auto" and runner.device.type == "cpu":
        kind = measured_backend(runner)
    V = int(runner.vocab_size)
    if vocab is not None:
        vocab = torch.as_tensor(vocab, dtype=torch.long, device=runner.device).reshape(-1)
        if vocab.numel() == 0 or int(vocab.min()) < 0 or int(vocab.max()) >= V:
            raise DraftWeightsError(f"a draft vocabulary needs 1..{V} token ids in [0, {V})")
        if int(vocab.unique().numel()) != int(vocab.numel()):
            raise DraftWeightsError("the draft vocabulary has repeated token ids")
        if vocab.numel() == V:
            vocab = None
    model = runner.model
    wkey = _weights_key(runner)
    # the head first: its build's temporaries then sit beside the model alone, not the layers too
    heads = _HEADS.setdefault(model, {})
    hkey = (kind, _vocab_key(vocab), wkey)
    if hkey not in heads:
        for k in [k for k in heads if k[2] != wkey]:
            del heads[k]
        heads[hkey] = _build_head(runner, kind, vocab)
    head_module, head_bytes = heads[hkey]
    per_model = _LAYERS.setdefault(model, {})
    if not layers:
        built: tuple[dict[int, nn.Module], int] = ({}, 0)
    elif (kind, wkey) not in per_model:
        for k in [k for k in per_model if k[1] != wkey]:
            del per_model[k]  # stale: the weights changed
        per_model[(kind, wkey)] = built = _build_layers(runner, kind)
    else:
        built = per_model[(kind, wkey)]
    subs, layer_bytes = built
    embedding, embedding_bytes = None, 0
    if kind != "none" and is_offloaded(
        runner.embedding
    ):  # drafts must not read the table from disk
        embeds = _EMBEDDINGS.setdefault(model, {})
        if wkey not in embeds:
            embeds.clear()
            embeds[wkey] = _build_embedding(runner)
        embedding, embedding_bytes = embeds[wkey]
    return DraftWeights(
        kind, V, subs, head_module, vocab, layer_bytes, head_bytes, embedding, embedding_bytes
    )


def measured_backend(runner, *, measure_agreement=None) -> str:
    """``auto`` on a CPU: the draft weights fastest per draft token here, measured once per
    machine and model shape among ``none`` (the model's own weights in the runner's layout)
    and every registered draft format with ``auto=True`` that runs here (see
    :mod:`.choice`); the static choice (:func:`resolve_backend`) when the
    measurement cannot tell. A ``gated`` winner (a 4-bit copy) runs only if it passes the
    agreement gate (:mod:`.agreement`: its lower agreement with the model must cost less than
    its cheaper draft tokens save) against the fastest of the others, which runs otherwise
    (``measure_agreement`` replaces the gate's measurement, for tests). The choice is recorded
    in ``runner.choices["draft_weights"]``."""
    if "draft_weights" in getattr(runner, "choices", {}):
        return runner.choices["draft_weights"].chosen
    static = resolve_backend("auto", runner.device, runner.dtype)
    if is_dispatched(runner.model):  # offloaded layers are not in memory to time
        choice = Choice("draft_weights", static, "static: a model accelerate dispatched")
        runner.choices["draft_weights"] = choice
        return choice.chosen

    if runner.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        found = [static]  # float64: the static rule
    else:
        found = candidates("draft", runner.device, runner.dtype)
    choice = choose_draft_weights(runner, static=static, candidates=found)
    if gated(choice.chosen):
        fallback, draft_s, verify_s = gate_terms(choice.seconds, static)
        before = _built_keys(runner.model)
        verdict = gate(
            runner,
            choice.chosen,
            fallback,
            draft_s,
            verify_s,
            measure=measure_agreement or agreement_measure(runner),
            remember=measure_agreement is None,
            report=not choice.how.startswith("cached"),
        )
        chosen = choice.chosen if verdict.admitted else fallback
        choice = Choice(
            "draft_weights", chosen, f"{choice.how}; {verdict.note()}", choice.seconds, choice.key
        )
        _drop_built(runner.model, chosen, before)
    if hasattr(runner, "choices"):
        runner.choices["draft_weights"] = choice
    return choice.chosen


def agreement_measure(runner) -> Callable[..., dict[str, float]]:
    """The agreement gate's measurement for ``runner``'s model
    (:func:`.agreement.measure_agreement`; ``tokens``/``positions`` passed on), building each
    copy through :func:`draft_weights` and freeing the ones built for it."""

    def copy(backend: str) -> tuple[DraftWeights, Callable[[], None]]:
        before = _built_keys(runner.model)
        return draft_weights(runner, backend), lambda: _drop_built(runner.model, None, before)

    return lambda r, backends, **kw: measure_agreement(r, backends, copy, **kw)


def _built_keys(model: nn.Module) -> set:
    return {("layers", k) for k in _LAYERS.get(model, {})} | {
        ("head", k) for k in _HEADS.get(model, {})
    }


def _drop_built(model: nn.Module, keep: str | None, before: set) -> None:
    """Free the copies built since ``before`` (:func:`_built_keys`; the agreement gate's) of
    backends other than ``keep`` (``None``: all of them)."""
    for kind, cache in (("layers", _LAYERS.get(model, {})), ("head", _HEADS.get(model, {}))):
        for k in [k for k in cache if (kind, k) not in before and k[0] != keep]:
            del cache[k]


def built_nbytes(model: nn.Module) -> int:
    """Bytes of every draft weight built so far for ``model`` (the bench's memory figure)."""
    total = sum(b for _, b in _LAYERS.get(model, {}).values())
    total += sum(b for _, b in _EMBEDDINGS.get(model, {}).values())
    return total + sum(b for _, b in _HEADS.get(model, {}).values())


def _build_embedding(runner) -> tuple[nn.Module, int]:
    """An in-memory copy of an offloaded embedding module (its own forward: any scale kept)."""
    emb = runner.embedding
    with torch.inference_mode(False), torch.no_grad(), loaded(emb):
        twin = copy.deepcopy(emb, share_hooks(emb, {}))
    own_tensors(detach_hooks(twin))
    return twin, sum(t.numel() * t.element_size() for t in [*twin.parameters(), *twin.buffers()])


def _build_layers(runner, kind: str) -> tuple[dict[int, nn.Module], int]:
    if kind == "none":
        return {}, 0
    layers: dict[int, nn.Module] = {}
    with torch.inference_mode(False), torch.no_grad(), reused_buffer():
        for i, layer in enumerate(runner.layers):
            # an offloaded layer: its weights read from the disk for this build only, the copy
            # keeps what it needs in memory, so drafts never read the disk
            offloaded = is_offloaded(layer)
            with loaded(layer):
                layers[i] = compressed_layer(layer, kind, own=offloaded)
    return layers, sum(layer_nbytes(m) for m in layers.values())


def _build_head(runner, kind: str, vocab: torch.Tensor | None) -> tuple[nn.Module | None, int]:
    head = runner.lm_head
    with torch.inference_mode(False), torch.no_grad(), loaded(head), reused_buffer():
        if kind == "none":
            if vocab is None:
                return None, 0
            rows = RowHead(head, vocab)
            return rows, rows.nbytes()
        source = head if vocab is None else _RowsOf(head, vocab)
        lin = compress_linear(source, kind)
    assert isinstance(lin, CompressedLinear)
    return lin, lin.nbytes()
