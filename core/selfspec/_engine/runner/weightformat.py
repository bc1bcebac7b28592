"""One way to hold the weights of a linear layer, as the weight-format registry
(:mod:`selfspec._engine.runner.formats`) keeps it: a layout verification runs, or a draft copy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn


def _runs_everywhere(device: torch.device, dtype: torch.dtype) -> str | None:
    return None


@dataclass(frozen=True)
class WeightFormat:
    """One registered way to hold a linear layer's weights (see the module doc).

    ``name``: what it is (``"int8"``, ``"fp16-weights"``), lower case. ``role``: ``"layout"``
    or ``"draft"``. ``summary``: one line for ``specdec plugins`` and the option help.
    ``build(weight, bias)``: a module computing ``x @ weight.T + bias`` for inputs ``[..., in]``
    of the caller's dtype, returning that dtype (``weight``: ``[out, in]``, the model's dtype;
    ``bias``: ``[out]`` or ``None``); ``None`` for the two formats that are the model's own
    weights (``model``, ``none``). ``unsupported(device, dtype)``: why it cannot run for a
    model on ``device`` in ``dtype`` (one clause, e.g. ``"it needs bitsandbytes"``), or
    ``None``. ``auto``: whether ``auto`` measures it where it runs. ``gated``: a draft copy so
    coarse (4-bit) that ``auto`` uses it only when its agreement with the model is worth its
    speed (:mod:`selfspec._engine.drafting.draftweights.agreement`). ``runs_on``: where it can run,
    in words, for the listing. ``memory``: a layout's bytes per byte of the model's weights it
    lays out (``auto`` measures a layout only where that copy fits in the memory available).
    ``owner``: the package that registered it (set by the registry).

    A frozen dataclass ([weight-formats.md](docs/weight-formats.md)): a format's ``name`` is never
    ``auto``; ``unsupported`` defaults to running everywhere, ``auto`` to ``True`` (``auto``
    measures it where it runs), ``gated`` to ``False`` (``auto`` runs it only through the agreement
    gate). :meth:`WeightFormat.why_not` is ``unsupported`` with a failure inside it reported as the
    reason.
    """

    name: str
    role: str
    summary: str
    build: Callable[[torch.Tensor, torch.Tensor | None], nn.Module] | None
    unsupported: Callable[[torch.device, torch.dtype], str | None] = _runs_everywhere
    auto: bool = True
    gated: bool = False
    runs_on: str = "any device, any dtype"
    memory: float = 1.0
    owner: str = field(default="", compare=False)

    def why_not(self, device: torch.device | str, dtype: torch.dtype) -> str | None:
        """:attr:`unsupported`, with a failure inside it reported as the reason."""
        try:
            return self.unsupported(torch.device(device), dtype)
        except Exception as exc:  # a third-party check that breaks must not break the host
            return f"its check failed ({type(exc).__name__}: {exc})"
