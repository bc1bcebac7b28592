"""Models that accelerate dispatched: where each part runs, and reading weights kept on disk.

``from_pretrained(..., device_map=..., max_memory=..., offload_folder=...)`` (and
``accelerate.dispatch_model``) place a model's modules on devices, in CPU memory and on disk.
Every placed module gets an ``AlignDevicesHook`` (``module._hf_hook``, possibly inside a
``SequentialHook``) that wraps its ``forward``: it moves the inputs to the hook's
``execution_device`` and, for an *offloaded* module (on disk, or in CPU memory when the main
device is a GPU), loads the module's weights from the hook's ``weights_map`` before the
forward and puts them back on the ``meta`` device after. Between forwards an offloaded
module's parameters are meta tensors: they have a shape and a dtype but no values.

The runner calls a decoder layer's sub-modules (norms, attention, MLP) rather than the layer
itself; each of those sub-modules carries its own hook, so calling it loads exactly what it
needs. What the runner adds (see :class:`selfspec.Runner`): activations moved to each layer's
execution device, a weight layout applied only to modules whose weights are resident, and the
KV cache of a layer allocated where its keys come from. This module holds the pieces: which
modules are offloaded, where a module runs, :func:`loaded` (an offloaded module's weights
read through its own hooks for the length of a block, one module at a time), and the
placement in words for the command line and the statistics.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


class PlacementError(RuntimeError):
    """A module's weights are on the meta device with no accelerate hook that can load them."""


def hooks_of(module: nn.Module) -> list[Any]:
    """The accelerate hooks attached to ``module`` itself (``SequentialHook`` unwrapped)."""
    hook = module.__dict__.get("_hf_hook")
    if hook is None:
        return []
    inner = getattr(hook, "hooks", None)
    return list(inner) if inner is not None else [hook]


def is_dispatched(model: nn.Module) -> bool:
    """Whether accelerate attached hooks to any module of ``model``."""
    return any("_hf_hook" in m.__dict__ for m in model.modules())


def _on_meta(t: torch.Tensor | None) -> bool:
    return t is not None and t.device.type == "meta"


def is_offloaded(module: nn.Module) -> bool:
    """Whether any parameter or buffer of ``module`` (recursively) is on the meta device."""
    return any(_on_meta(t) for t in [*module.parameters(), *module.buffers()])


def execution_device(module: nn.Module, default: torch.device | None = None) -> torch.device:
    """Where ``module`` runs: the first accelerate hook's ``execution_device`` found on it or a
    sub-module, else the device of its first resident parameter, else ``default`` (CPU)."""
    for sub in module.modules():
        for hook in hooks_of(sub):
            dev = getattr(hook, "execution_device", None)
            if dev is not None:
                return torch.device(f"cuda:{dev}" if isinstance(dev, int) else dev)
    for p in module.parameters():
        if not _on_meta(p):
            return p.device
    return default if default is not None else torch.device("cpu")


def model_device(model: nn.Module) -> torch.device:
    """The device a model's inputs go to: the top-level hook's execution device for a
    dispatched model (accelerate's "main" device), else the first resident parameter's."""
    for hook in hooks_of(model):
        dev = getattr(hook, "execution_device", None)
        if dev is not None:
            return torch.device(f"cuda:{dev}" if isinstance(dev, int) else dev)
    embed = getattr(model, "get_input_embeddings", lambda: None)()
    if embed is not None:
        return execution_device(embed)
    return execution_device(model)


def _offload_hooks(module: nn.Module) -> list[tuple[nn.Module, Any]]:
    return [
        (sub, hook)
        for sub in module.modules()
        for hook in hooks_of(sub)
        if getattr(hook, "offload", False)
    ]


@contextlib.contextmanager
def loaded(module: nn.Module) -> Iterator[nn.Module]:
    """``module`` with every offloaded weight in it loaded, for the length of the block.

    Called:
        Around code that reads an offloaded module's weights (compressing a layer, copying
        rows of the LM head, fingerprinting). A module with no meta tensor is yielded as it is.

    Returns:
        ``module`` itself: inside the block its parameters hold values (on each hook's
        execution device); after it they are meta tensors again, as accelerate leaves them
        between forwards. A tensor read inside the block and kept stays valid after it.

    Notes:
        The weights come through the module's own hooks (``pre_forward`` / ``post_forward``
        of each offloading ``AlignDevicesHook``, the calls a forward makes), so tied weights,
        prefixes and the offload format are accelerate's business. Only ``module``'s own
        weights are read: one layer at a time, never the whole model. Raises
        :class:`PlacementError` when a meta tensor has no hook to load it.
    """
    if not is_offloaded(module):
        yield module
        return
    hooked = _offload_hooks(module)
    done: list[tuple[nn.Module, Any]] = []
    try:
        for sub, hook in hooked:
            hook.pre_forward(sub)
            done.append((sub, hook))
        missing = [
            name for name, t in [*module.named_parameters(), *module.named_buffers()] if _on_meta(t)
        ]
        if missing:
            raise PlacementError(
                f"{type(module).__name__}: {', '.join(missing[:3])}"
                f"{' ...' if len(missing) > 3 else ''} "
                "on the meta device with no accelerate offload hook to load them "
                "(a model loaded with device_map='meta' or init_empty_weights "
                "and never dispatched?)"
            )
        yield module
    finally:
        for sub, hook in reversed(done):
            hook.post_forward(sub, None)


def share_hooks(module: nn.Module, memo: dict[int, object]) -> dict[int, object]:
    """Add ``module``'s accelerate hook objects to a ``deepcopy`` memo, so a copy shares them
    (a hook's weights map can index the whole offloaded model: never copied)."""
    for sub in module.modules():
        hook = sub.__dict__.get("_hf_hook")
        if hook is not None:
            memo[id(hook)] = hook
    return memo


def detach_hooks(module: nn.Module) -> nn.Module:
    """Strip accelerate's hooks from a *copy* (made with :func:`share_hooks`): each sub-module
    runs its class's own ``forward`` again, and nothing is loaded or moved for it. The
    original module's hooks are untouched. Returns ``module``."""
    for sub in module.modules():
        for attr in ("_hf_hook", "_old_forward", "forward"):
            sub.__dict__.pop(attr, None)
    return module


def own_tensors(module: nn.Module, skip: tuple[type, ...] = ()) -> nn.Module:
    """Give ``module`` its own copy of every parameter and buffer (in place), except those held
    directly by sub-modules of the ``skip`` types: a copy built from weights loaded by
    :func:`loaded` then shares nothing with a file mapping or with the model. Returns ``module``."""
    with torch.no_grad():
        for sub in module.modules():
            if skip and isinstance(sub, skip):
                continue
            for name, p in list(sub._parameters.items()):
                if p is not None:
                    sub._parameters[name] = nn.Parameter(p.detach().clone(), requires_grad=False)
            for name, b in list(sub._buffers.items()):
                if b is not None:
                    sub._buffers[name] = b.detach().clone()
    return module


def tensor_key(t: torch.Tensor) -> tuple:
    """``(storage pointer, version, dtype, device)`` of a weight, for caches that must notice
    a replaced or rewritten weight. A meta tensor (offloaded: accelerate replaces it on every
    forward) and an inference tensor (no version counter) count as unchanged."""
    if t.device.type == "meta":
        return (0, -1, t.dtype, t.device)
    try:
        ptr = t.data_ptr()
    except (
        RuntimeError
    ):  # an opaque (oneDNN-packed) tensor has no storage: the object stands for it
        ptr = id(t)
    version = -1 if t.is_inference() else t._version
    return (ptr, version, t.dtype, t.device)


# ---------------------------------------------------------------------------- in words
_LAYER = re.compile(r"^(.*\.layers)\.(\d+)$")


def device_map(model: nn.Module) -> dict[str, str] | None:
    """accelerate's map ``{module name: device}`` (``model.hf_device_map``), or ``None`` for a
    model that was not dispatched."""
    m = getattr(model, "hf_device_map", None)
    if not m or not is_dispatched(model):
        return None
    return {str(k): _device_name(v) for k, v in m.items()}


def _device_name(dev: Any) -> str:
    if isinstance(dev, int):
        return f"cuda:{dev}"
    return str(dev)


def describe(model: nn.Module) -> dict[str, Any] | None:
    """The placement of a dispatched model as a small JSON-ready dict, or ``None``.

    ``{"devices": {device: number of decoder layers}, "layers": "0-13 cpu, 14-27 disk",
    "other": {"lm_head": "cpu", ...}, "offloaded_layers": n}``: each decoder layer's device
    (the map's entry for it or for the module holding it), as runs of consecutive indices;
    every map entry that is not a single layer, by name.
    """
    dm = device_map(model)
    if dm is None:
        return None
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    names = {id(m): name for name, m in model.named_modules()}
    layer_dev: dict[int, str] = {}
    if layers is not None:
        for i, layer in enumerate(layers):
            dev = _entry_for(names.get(id(layer), ""), dm)
            if dev is not None:
                layer_dev[i] = dev
    other = {name or "(model)": dev for name, dev in dm.items() if not _LAYER.match(name)}
    counts: dict[str, int] = {}
    for dev in layer_dev.values():
        counts[dev] = counts.get(dev, 0) + 1
    offloaded = sum(1 for layer in layers if is_offloaded(layer)) if layers is not None else 0
    return {
        "devices": counts,
        "layers": runs(layer_dev),
        "other": other,
        "offloaded_layers": offloaded,
    }


def _entry_for(name: str, dm: dict[str, str]) -> str | None:
    """The device of module ``name``: the map's longest entry that is it or holds it."""
    best: tuple[int, str] | None = None
    for key, dev in dm.items():
        if key == "" or key == name or name.startswith(key + "."):
            if best is None or len(key) > best[0]:
                best = (len(key), dev)
    return best[1] if best else None


def runs(layer_dev: dict[int, str]) -> str:
    """``{0: cpu, 1: cpu, 2: disk}`` -> ``"0-1 cpu, 2 disk"``."""
    out: list[str] = []
    items = sorted(layer_dev.items())
    i = 0
    while i < len(items):
        j = i
        while (
            j + 1 < len(items)
            and items[j + 1][1] == items[i][1]
            and items[j + 1][0] == items[j][0] + 1
        ):
            j += 1
        a, b = items[i][0], items[j][0]
        out.append(f"{a}-{b} {items[i][1]}" if b > a else f"{a} {items[i][1]}")
        i = j + 1
    return ", ".join(out)


def summary(model: nn.Module) -> str | None:
    """One line for stderr: ``placement: layers 0-13 cpu, 14-27 disk; embed_tokens cpu, ...``."""
    d = describe(model)
    if d is None:
        return None
    other = ", ".join(f"{name.rsplit('.', 1)[-1]} {dev}" for name, dev in d["other"].items())
    layers = f"layers {d['layers']}" if d["layers"] else "whole model"
    return f"placement: {layers}" + (f"; {other}" if other else "")
