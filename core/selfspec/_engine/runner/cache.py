"""A preallocated, slot-indexed KV cache that knows each layer's valid length.

Layout (per layer): keys and values ``[1, kv_heads, capacity, head_dim]``, allocated on the
first write (so substitute layers with other shapes get their own buffers). Slot ``j`` holds
the token at position ``pos[j]``; after every committed step slots ``0..length-1`` hold the
committed prefix with ``pos[j] == j``. A rejected draft costs nothing: its slots are past the
valid length and the next write overwrites them (gpt-fast's ``KVCache``).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from typing import Any

import torch


class CacheError(RuntimeError):
    """An operation would read slots that no forward has written."""


class KVCache:
    """Per-layer preallocated key/value buffers with valid lengths.

    Operations: :meth:`crop` (per layer range), :meth:`keep` (gather kept slots, for a tree's
    accepted path), and, through :meth:`view`, append/overwrite at a slot or attend
    read-only without writing. A rejected draft's slots are simply overwritten by the next
    write.
    """

    def __init__(self, n_layers: int, capacity: int, device: torch.device | str = "cpu") -> None:
        if capacity <= 0:
            raise ValueError("cache capacity must be positive")
        self.n_layers = n_layers
        #: slots per layer (``Runner.new_cache(capacity)``)
        self.capacity = capacity
        self.device = torch.device(device)
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers
        #: each layer's valid length (:attr:`length` when they all agree)
        self.lengths: list[int] = [0] * n_layers
        # pos: [capacity] position id of the token in each slot (shared by all layers)
        self.pos = torch.zeros(capacity, dtype=torch.long, device=self.device)

    # ---------------------------------------------------------------- lengths
    @property
    def length(self) -> int:
        """The valid length when all layers agree (the state between decode steps)."""
        first = self.lengths[0]
        if any(n != first for n in self.lengths):
            raise CacheError(f"layers hold different lengths {sorted(set(self.lengths))}")
        return first

    def reset(self) -> None:
        """Forget every slot of every layer (valid lengths 0)."""
        self.lengths = [0] * self.n_layers

    def crop(self, length: int, layers: Iterable[int] | None = None) -> None:
        """Forget every slot from ``length`` on, in ``layers`` (default: all)."""
        if length < 0:
            raise ValueError("crop length must be >= 0")
        for i in range(self.n_layers) if layers is None else layers:
            self.lengths[i] = min(self.lengths[i], length)

    @torch.inference_mode()  # the buffers are inference tensors (allocated in Runner.forward)
    def keep(self, base: int, slots: Sequence[int], layers: Iterable[int] | None = None) -> None:
        """Keep slots ``base + s`` for ``s`` in ``slots`` as ``base, base+1, ...`` and drop
        the rest.

        ``slots`` must be increasing. A chain prefix (``0..n-1``) is a plain crop; anything else
        gathers keys, values and positions into place.
        """
        slots = list(slots)
        if any(b <= a for a, b in zip(slots, slots[1:])):
            raise ValueError(f"kept slots must be increasing, got {slots}")
        if slots and slots[0] < 0:
            raise ValueError("kept slots must be >= 0")
        new_len = base + len(slots)
        layer_ids = list(range(self.n_layers)) if layers is None else list(layers)
        if slots != list(range(len(slots))):
            src = torch.tensor(slots, dtype=torch.long, device=self.device) + base
            for i in layer_ids:
                need = base + slots[-1] + 1
                if self.lengths[i] < need:
                    raise CacheError(
                        f"layer {i}: keep needs {need} valid slots, has {self.lengths[i]}"
                    )
                k, v = self.keys[i], self.values[i]
                assert k is not None and v is not None
                k[:, :, base:new_len] = k.index_select(2, src)
                v[:, :, base:new_len] = v.index_select(2, src)
            self.pos[base:new_len] = self.pos.index_select(0, src)
        for i in layer_ids:
            if self.lengths[i] < new_len:
                raise CacheError(f"layer {i}: keep to {new_len} but only {self.lengths[i]} valid")
            self.lengths[i] = new_len

    def view(self, layer: int, start: int, write: bool = True) -> LayerView:
        """A one-layer cache view for one forward writing a block at ``start``."""
        if self.lengths[layer] < start:
            raise CacheError(
                f"layer {layer} holds {self.lengths[layer]} valid slots but the forward starts at "
                f"slot {start}: the slots between were never written (skipped block?)"
            )
        return LayerView(self, layer, start, write)

    def _ensure(self, layer: int, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        buf = self.keys[layer]
        if (
            buf is None
            or buf.shape[1] != k.shape[1]
            or buf.shape[3] != k.shape[3]
            or buf.dtype != k.dtype
        ):
            shape = (1, k.shape[1], self.capacity, k.shape[3])
            self.keys[layer] = torch.zeros(shape, dtype=k.dtype, device=k.device)
            self.values[layer] = torch.zeros(shape, dtype=k.dtype, device=k.device)
        return self.keys[layer], self.values[layer]  # type: ignore[return-value]


class LayerView:
    """The object handed to a Hugging Face attention module as ``past_key_values``.

    The module calls ``update(k, v, layer_idx)`` with the new block's keys/values
    ``[1, kv_heads, q, head_dim]`` and gets back the keys/values it should attend to:
    slots ``[0, start)`` followed by the block. With ``write=False`` (read-only) nothing is
    stored: the block is concatenated to a view of the prefix.
    """

    __slots__ = ("cache", "layer", "start", "write")

    def __init__(self, cache: KVCache, layer: int, start: int, write: bool) -> None:
        self.cache, self.layer, self.start, self.write = cache, layer, start, write

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int | None = None, *args, **kwargs
    ):
        c, i, s = self.cache, self.layer, self.start
        q = key.shape[2]
        if s + q > c.capacity:
            raise CacheError(
                f"cache capacity {c.capacity} exceeded (writing {q} tokens at slot {s})"
            )
        kbuf, vbuf = c._ensure(i, key)
        if not self.write:
            return torch.cat([kbuf[:, :, :s], key], 2), torch.cat([vbuf[:, :, :s], value], 2)
        kbuf[:, :, s : s + q] = key
        vbuf[:, :, s : s + q] = value
        c.lengths[i] = s + q
        return kbuf[:, :, : s + q], vbuf[:, :, : s + q]

    # Some attention modules ask these of their cache; answer like an HF Cache would.
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.start

    is_compileable = False


def cache_argument(forward: Any) -> str:
    """The name under which a Hugging Face ``forward`` (an attention module's or a causal LM's)
    takes its KV cache: ``cache`` where the installed transformers names it so, else
    ``past_key_values`` (the older name, deprecated with a ``FutureWarning`` where ``cache``
    exists). Resolved once per function."""
    func = getattr(forward, "__func__", forward)
    name = _CACHE_ARGUMENT.get(func)
    if name is None:
        try:
            params = inspect.signature(func).parameters
        except (TypeError, ValueError):
            params = {}
        name = _CACHE_ARGUMENT[func] = "cache" if "cache" in params else "past_key_values"
    return name


def output_cache(output: Any) -> Any:
    """The KV cache a Hugging Face model output returns: ``cache``, else ``past_key_values``."""
    fields = getattr(output, "__dataclass_fields__", None) or {}
    return output.cache if "cache" in fields else output.past_key_values


_CACHE_ARGUMENT: dict[Any, str] = {}
