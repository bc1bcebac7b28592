"""What of a model stays resident: tensors that are views of a memory-mapped file.

Transformers loads safetensors weights as views of the file's mapping, which stays mapped (its
pages resident) while any tensor of the file lives. After a layout replaced the linears
(:func:`selfspec._engine.runner.layout.adopt_layout`), the few tensors left would keep the whole
file resident beside the laid-out copies; :func:`own_file_backed` copies them into the process's
own memory so the mapping is released. While the layout is built, each weight is read through
:func:`unmapped_copy` (a plain read of the file, into the page cache and a transient buffer)
instead of through the mapping, so the mapped pages are never touched and the peak holds one
weight beside the copies, not the whole file.
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
                    owned[id(t)] = (
                        nn.Parameter(copy_, requires_grad=False)
                        if isinstance(t, nn.Parameter)
                        else copy_
                    )
                store[name] = owned[id(t)]
    return len(owned)


def unmapped_copy(
    t: torch.Tensor, files: list[tuple[int, int, int, str]] | None = None
) -> torch.Tensor:
    """``t``'s values read from its file when ``t`` is a contiguous CPU view of a memory-mapped
    file (a plain read: the pages go to the page cache, not to this process's resident set), else
    ``t`` itself. A read that comes up short also gives ``t``. ``files``: :func:`mapped_files`,
    read once by a caller that copies many tensors (default: read now)."""
    if (
        t.device.type != "cpu"
        or t.layout != torch.strided
        or not t.is_contiguous()
        or t.numel() == 0
    ):
        return t
    ptr, n = t.data_ptr(), t.numel() * t.element_size()
    for lo, hi, offset, path in mapped_files() if files is None else files:
        if lo <= ptr and ptr + n <= hi:
            buf = bytearray(n)
            try:
                with open(path, "rb", buffering=0) as fh:
                    fh.seek(offset + ptr - lo)
                    view, got = memoryview(buf), 0
                    while got < n:
                        k = fh.readinto(view[got:])
                        if not k:
                            return t
                        got += k
            except OSError:
                return t
            return torch.frombuffer(buf, dtype=t.dtype).view(t.shape)
    return t


def _file_mappings() -> list[tuple[int, int]]:
    """``[(start, end)]`` of this process's file-backed memory mappings (Linux; else ``[]``)."""
    return [(lo, hi) for lo, hi, _, _ in mapped_files()]


def mapped_files() -> list[tuple[int, int, int, str]]:
    """``[(start, end, file offset, path)]`` of this process's file-backed mappings (Linux)."""
    found = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[4] != "0" and not parts[5].startswith("["):
                    lo, hi = parts[0].split("-")
                    found.append(
                        (int(lo, 16), int(hi, 16), int(parts[2], 16), parts[5].rstrip("\n"))
                    )
    except OSError:
        return []
    return found
