"""Which draft weights ``auto`` builds on a CPU: the fastest per draft token, measured here on
a sample of the model's own products (:func:`selfspec._engine.runner.layout_choice.sample`)
and timed by :func:`selfspec._engine.tuning.calibration.choose`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from selfspec._engine.drafting.draftweights.layers import (
    compress_linear,
    compressed_layer,
    reused_buffer,
)
from selfspec._engine.runner.layout_choice import sample, shape_key
from selfspec._engine.tuning import calibration
from selfspec._engine.tuning.artefacts import ArtefactStore
from selfspec._engine.tuning.calibration import Build, Choice, Measure


def choose_draft_weights(
    runner: Any,
    *,
    static: str,
    candidates: Sequence[str],
    measure: Measure | None = None,
    refresh: bool = False,
    store: ArtefactStore | None = None,
) -> Choice:
    """The draft weights ``"auto"`` builds for this model here: the fastest of ``candidates``
    per draft token (``"none"``: the model's own weights in the runner's layout; the others:
    compressed copies of the sample), at 1 token and at a tree's few tokens per depth."""
    if len(candidates) < 2:
        return Choice("draft_weights", static, "static: the only draft weights that run here")

    def prepare() -> tuple[Build, tuple[float, float]]:
        own = list(runner._run_layers)  # the layers in the runner's layout (what "none" reads)
        layers, head, scale_layers, scale_head = sample(own, runner.adapter.lm_head)
        model_layers, model_head, _, _ = sample(list(runner.layers), runner.lm_head)

        def build(kind: str) -> list[nn.Module]:
            if kind == "none":
                return [*layers, head]
            with torch.inference_mode(False), torch.no_grad(), reused_buffer():
                return [
                    *(compressed_layer(m, kind) for m in model_layers),
                    compress_linear(model_head, kind),
                ]

        return build, (scale_layers, scale_head)

    key = shape_key(
        "draft_weights",
        runner.model,
        runner.layers,
        runner.lm_head,
        f"{runner.weight_layout}-{calibration.candidates_key(candidates)}",
    )
    return calibration.choose(
        "draft_weights",
        key,
        candidates,
        static,
        prepare,
        (1, 4),
        measure=measure,
        refresh=refresh,
        store=store,
    )
