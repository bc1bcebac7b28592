"""What of a model stays resident: tensors that are views of a memory-mapped file.

Transformers loads safetensors weights as views of the file's mapping, which stays mapped (its
pages resident) while any tensor of the file lives. After a layout replaced the linears
(:func:`selfspec._engine.runner.layout.adopt_layout`), the few tensors left would keep the whole
file resident beside the laid-out copies; :func:`own_file_backed` copies them into the process's
own memory so the mapping is released.
"""

from __future__ import annotations

import torch
from torch import nn


def own_file_backed(model: nn.Module) -> int:
    """Copy into the process's own memory every CPU parameter and buffer of ``model`` that is a
    view of a memory-mapped file; returns how many. Transformers loads safetensors weights as
    views of the file's mapping, which stays mapped (its pages resident) while any tensor of the
    file lives: after :func:`adopt_layout` replaced the linears, the few tensors left (embedding,
    norms, biases) would keep the whole file resident beside the laid-out copies. Once they are
    copied, the mapping is released. Tensors shared between modules stay shared. Linux only (the
    mappings come from ``/proc/self/maps``); elsewhere nothing is done."""
    mapped = _file_mappings()
    if not mapped:
        return 0
    owned: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for store in (module._parameters, module._buffers):
            for name, t in list(store.items()):
                if t is None or t.device.type != "cpu" or t.layout != torch.strided:
                    continue
                if id(t) not in owned:
                    ptr = t.untyped_storage().data_ptr()
                    if not any(lo <= ptr < hi for lo, hi in mapped):
                        continue
                    copy_ = t.detach().clone()
                    owned[id(t)] = nn.Parameter(copy_, requires_grad=False) if isinstance(t, nn.Parameter) else copy_
                store[name] = owned[id(t)]
    return len(owned)


def _file_mappings() -> list[tuple[int, int]]:
    """``[(start, end)]`` of this process's file-backed memory mappings (Linux; else ``[]``)."""
    ranges = []
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 6 and parts[4] != "0" and not parts[5].startswith("["):
                    lo, hi = parts[0].split("-")
                    ranges.append((int(lo, 16), int(hi, 16)))
    except OSError:
        return []
    return ranges
