"""Which layout ``auto`` runs, and in how many rows a packed one-token product is computed:
the fastest measured here on a sample of the model's own products.

The sample (:func:`sample`) is the middle decoder layers holding at least
:data:`SAMPLE_BYTES` of product weights and at most :data:`HEAD_BYTES` of the LM head's rows,
so the timing streams from memory as a decode does. Each candidate builds its own copy of the
sample; :func:`selfspec._engine.tuning.calibration.choose` times them and keeps the verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn

from selfspec._engine.runner.formats import weight_format
from selfspec._engine.runner.layout import layout_copy, set_one_row_width, weight_rows, weight_spec
from selfspec._engine.runner.traffic import product_bytes
from selfspec._engine.tuning import calibration
from selfspec._engine.tuning.artefacts import ArtefactStore
from selfspec._engine.tuning.calibration import BLOCK, Build, Choice, Measure

#: Weight bytes of the sampled decoder layers (at least; all layers of a smaller model).
SAMPLE_BYTES = 256 * 2**20
#: Weight bytes of the LM head rows sampled (at most; the whole head of a smaller model).
HEAD_BYTES = 64 * 2**20
#: The widths a packed one-token product may be computed in (the first is the static choice).
ONE_ROW_WIDTHS = ("1", "4")


def choose_weight_layout(
    model: nn.Module,
    layers: Sequence[nn.Module],
    lm_head: nn.Module,
    *,
    static: str,
    candidates: Sequence[str],
    measure: Measure | None = None,
    refresh: bool = False,
    store: ArtefactStore | None = None,
) -> Choice:
    """The weight layout ``"auto"`` runs for this model here: the fastest of ``candidates``
    (layouts that can run on this device and dtype; ``static`` is the capability rule's
    choice, the fallback). One candidate: that one, unmeasured."""
    if len(candidates) < 2:
        return Choice("weight_layout", static, "static: the only layout that runs here")

    def copies(layout: str, modules: list[nn.Module]) -> list[nn.Module]:
        return [layout_copy(m, weight_format(layout, "layout")) for m in modules]

    key = shape_key("weight_layout", model, layers, lm_head, calibration.candidates_key(candidates))
    return calibration.choose(
        "weight_layout",
        key,
        candidates,
        static,
        sampled(layers, lm_head, copies),
        (1, BLOCK),
        measure=measure,
        refresh=refresh,
        store=store,
    )


def choose_one_row_width(
    model: nn.Module,
    layers: Sequence[nn.Module],
    lm_head: nn.Module,
    *,
    measure: Measure | None = None,
    refresh: bool = False,
    store: ArtefactStore | None = None,
) -> Choice:
    """How many rows the packed layout computes a one-token product in: ``"1"``, or ``"4"``
    (the row and three zero rows, the first row kept), whichever is faster here on the
    model's shapes; ``"1"`` (static) when the measurement cannot tell them apart. oneDNN's
    kernel for a single row can be the slower one."""

    def copies(width: str, modules: list[nn.Module]) -> list[nn.Module]:
        packed = [layout_copy(m, "packed") for m in modules]  # each width its own copy
        set_one_row_width(packed, int(width))
        return packed

    key = shape_key("one_row_width", model, layers, lm_head, "packed")
    return calibration.choose(
        "one_row_width",
        key,
        list(ONE_ROW_WIDTHS),
        ONE_ROW_WIDTHS[0],
        sampled(layers, lm_head, copies),
        (1,),
        measure=measure,
        refresh=refresh,
        store=store,
    )


def sampled(
    layers: Sequence[nn.Module],
    lm_head: nn.Module,
    copies: Callable[[str, list[nn.Module]], list[nn.Module]],
) -> Callable[[], tuple[Build, tuple[float, float]]]:
    """The ``prepare`` of :func:`selfspec._engine.tuning.calibration.choose`: it samples the
    model (:func:`sample`) and builds a candidate as ``copies(candidate, sampled layers + head
    rows)``, with the sample's scale factors."""

    def prepare() -> tuple[Build, tuple[float, float]]:
        picked, head, scale_layers, scale_head = sample(layers, lm_head)
        return (lambda candidate: copies(candidate, [*picked, head])), (scale_layers, scale_head)

    return prepare


def sample(
    layers: Sequence[nn.Module], lm_head: nn.Module
) -> tuple[list[nn.Module], nn.Module, float, float]:
    """``(middle layers, head rows, layer scale, head scale)``: the middle decoder layers
    holding at least :data:`SAMPLE_BYTES` of product weights (all layers if fewer), a linear
    over at most :data:`HEAD_BYTES` of the head's rows, and the factors that turn the sample's
    time into the whole model's (layers in the model / in the sample; head rows / sampled rows).
    Any layout: packed weights are buffers, and :func:`product_bytes` counts them."""
    per_layer = [product_bytes(layer) for layer in layers]
    n = len(layers)
    take, total, lo = 0, 0, n // 2
    while take < n and total < SAMPLE_BYTES:
        total += per_layer[(lo + take) % n]
        take += 1
    picked = [layers[(lo + i) % n] for i in range(take)]
    (out_f, in_f), dtype, device = weight_spec(lm_head)
    rows = max(1, min(out_f, HEAD_BYTES // max(1, in_f * dtype.itemsize)))
    head = nn.Linear(
        in_f, rows, bias=getattr(lm_head, "bias", None) is not None, device="meta", dtype=dtype
    )
    head.weight = nn.Parameter(weight_rows(lm_head, rows).to(device).clone(), requires_grad=False)
    if head.bias is not None:
        head.bias = nn.Parameter(
            lm_head.bias.detach()[:rows].to(device).clone(), requires_grad=False
        )
    return picked, head, n / take, out_f / rows


def shape_key(
    what: str, model: nn.Module, layers: Sequence[nn.Module], lm_head: nn.Module, extra: str
) -> str:
    """The cache key of a choice for this model's shape, dtype and device
    (:func:`selfspec._engine.tuning.calibration.choice_key`)."""
    (rows, cols), dtype, device = weight_spec(lm_head)
    cfg = getattr(model, "config", None)
    shape = f"{getattr(cfg, 'model_type', 'model')}-{len(layers)}x{cols}x{rows}"
    return calibration.choice_key(what, shape, dtype, extra, device)
