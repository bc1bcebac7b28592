"""The layer-level runner: executes a Hugging Face causal LM one sub-block at a time.

One call of :meth:`Runner.forward` runs a block of ``q`` new tokens through layers
``[a, b)`` of the model, over the KV cache's prefix, with everything the method plugins need:
skipped attention/MLP blocks, an early exit (``layers=(0, b)`` then :meth:`Runner.head`),
a start from given hidden states at layer ``a``, explicit positions and any block mask (causal, a
tree's ancestors, or one a plugin builds), read-only attention (``write=False``), hidden-state
capture, and substitute layer modules or a model's compressed draft weights. A full forward equals
the model's own forward (tested in float64); with ``weight_layout="transposed"`` or ``"packed"`` it
runs faster on CPU and equals it up to rounding (see :mod:`.layout`).

A model that accelerate dispatched over devices, CPU memory and disk (:mod:`.placement`) runs
as placed: each layer's sub-modules are called through their own hooks (an offloaded layer's
weights are loaded for its forward and dropped after), the block's activations move to each
layer's execution device, its keys and values are cached there, and the logits come back on
the runner's device (the embedding's).
"""

from __future__ import annotations

import weakref
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from selfspec._engine.runner import exact_attention, formats, masks, placement
from selfspec._engine.runner.adapters import Adapter, adapter_for
from selfspec._engine.runner.cache import KVCache
from selfspec._engine.runner.exact import exact_copy
from selfspec._engine.runner.exact_attention import position_mask
from selfspec._engine.runner.layout import adopt_layout, set_one_row_width, shared_layout_copies
from selfspec._engine.runner.layout_choice import choose_one_row_width, choose_weight_layout
from selfspec._engine.runner.lean import LeanBlocks
from selfspec._engine.runner.traffic import block_bytes, product_bytes
from selfspec._engine.tuning import machine
from selfspec._engine.tuning.calibration import Choice


class DraftCopy(Protocol):
    """What a draft pass's ``weights=`` gives :meth:`Runner.forward` (``selfspec.DraftWeights``
    is one): layers to run in place of the model's, a head, and an embedding or ``None``."""

    embedding: nn.Module | None
    layers: Mapping[int, nn.Module]

    def head(self, runner: Runner, rows: torch.Tensor) -> torch.Tensor: ...


@dataclass
class ForwardOut:
    """``hidden``: ``[1, q, H]`` after the last layer run (before the final norm: after a full run
    ``runner.head(out.hidden[0])`` equals ``logits``). ``logits``: ``[n, V]`` for the requested
    rows, or ``None`` (``logits=None``, or a run that stopped before the last layer). ``captured``:
    ``{layer: [q, H]}``, layer 0 = the input of layer 0, layer i = the output of layer i-1."""

    hidden: torch.Tensor
    logits: torch.Tensor | None = None
    captured: dict[int, torch.Tensor] = field(default_factory=dict)


class Runner:
    """Drives ``model`` layer by layer through its :class:`Adapter`. Batch size 1.

    ``weight_layout``: ``"auto"`` (default: the fastest layout measured here, see
    :meth:`_measured_layout`), ``"model"`` (bitwise the model's own forward), or
    ``"transposed"`` / ``"packed"`` / ``"packed-mkl"`` or a registered layout (runner-side copies of
    the linear weights laid out for faster CPU products: equal up to rounding, one extra copy of
    those weights; see :mod:`.layout`). ``layers`` stays the model's own modules whatever
    the layout.
    ``adopt=True`` applies the layout to the model in place instead of to copies
    (:func:`.layout.adopt_layout`): one copy of each weight in memory, and the model's own
    forward then runs the new layout too. On a model accelerate dispatched, the layout applies
    to the resident layers and head only; offloaded ones run the ``"model"`` layout through
    their hooks (:attr:`layer_layouts` says which; see :mod:`.layout`).

    For plugins that build their own variants of :meth:`Runner.head` and :meth:`Runner.embed` (exit
    heads, compressed copies, a draft vocabulary), their parts: :attr:`Runner.final_norm` and
    :meth:`Runner.norm`, :attr:`Runner.lm_head`, :attr:`Runner.logit_softcap` and
    :meth:`Runner.softcap`, :attr:`Runner.embedding`; ``head(h) == softcap(lm_head(norm(h)))``. Read
    them, never modify them; a plugin never reads ``runner.adapter``: its shape is the host's
    business and may change. Plain attributes: ``model``, ``config``, ``layers`` (the model's own
    decoder layers), ``n_layers``, ``hidden_size`` (``H``), ``vocab_size`` (``V``), ``windows``
    (each layer's sliding-window size, ``None`` for full attention), ``weight_layout`` (what
    ``auto`` resolved to: ``"packed"``, ``"model"``, ...), ``exact`` (``Runner(model, exact=True)``:
    every row of a forward bitwise that row's one-token forward;
    [losslessness.md](docs/losslessness.md)); ``lean_drafts`` (default ``True``) runs draft weights'
    layers of Llama, Mistral, Qwen2 and Qwen3 models as lean blocks, the modules' own tensor
    operations without their calls, bitwise the same logits (``False``: through the modules;
    [architecture.md](docs/architecture.md)).

    A model accelerate dispatched over devices, CPU memory and disk runs as placed:
    :attr:`Runner.placement` says where its layers went (a plugin that cannot support a placement
    reads it at setup and raises a ``PluginError`` saying so), ``layer_devices`` and
    ``layer_layouts`` where each layer runs and how, and :meth:`Runner.loaded` gives an offloaded
    module's weights values while a plugin reads them at setup. What :meth:`Runner.forward` returns
    and what ``start`` means, with code: [the FAQ](docs/faq.md#what-runnerforward-returns).
    """

    def __init__(
        self,
        model: nn.Module,
        adapter: Adapter | None = None,
        *,
        weight_layout: str = "auto",
        adopt: bool = False,
        exact: bool = False,
    ) -> None:
        self.model = model.eval()
        self.adapter = adapter or adapter_for(model)
        self.config = model.config
        self.layers = self.adapter.layers
        self.weight_layout = formats.check_layout(weight_layout, self.device, self.dtype)
        #: how each ``auto`` of this runner was decided (``{"weight_layout": Choice, ...}``;
        #: :mod:`selfspec._engine.tuning.calibration`); the draft weights add theirs when built
        self.choices: dict[str, Any] = {}
        if weight_layout == "auto":
            self.weight_layout = self._measured_layout(model)
        if adopt:
            self.adapter.lm_head = adopt_layout(
                model, list(self.layers), self.adapter.lm_head, self._layout()
            )
        # the modules forward() executes: the model's own, or copies with another weight layout
        # (shared by every runner over this model: copies are stateless and made once)
        self._run_layers, self.adapter.lm_head = shared_layout_copies(  # the runner's own adapter
            model, list(self.layers), self.adapter.lm_head, "model" if adopt else self._layout()
        )
        if self.weight_layout == "packed" and not placement.is_dispatched(model):
            self._measured_one_row_width()
        #: exact mode (:mod:`.exact`): every row of a forward bitwise its one-token forward's
        self.exact = exact
        if exact:
            exact_attention.register()
            self._run_layers = [exact_copy(layer) for layer in self._run_layers]
            self.adapter.lm_head = exact_copy(self.adapter.lm_head)
        self.n_layers = len(self.layers)
        #: run draft weights' layers as :class:`.lean.LeanBlocks` where the adapter recognises
        #: them (:meth:`Adapter.lean`): the same blocks without the modules' call overhead
        self.lean_drafts = True
        self._lean: weakref.WeakKeyDictionary[nn.Module, LeanBlocks | None] = (
            weakref.WeakKeyDictionary()
        )
        #: bytes of product weights read by every forward so far (:mod:`.traffic`)
        self.weight_bytes = 0
        self._head_cache: dict[int, tuple[nn.Module, int]] = {}
        #: where each layer runs (its accelerate hook's execution device, else its weights')
        self.layer_devices = [
            placement.execution_device(layer, self.device) for layer in self.layers
        ]
        #: the layout each layer runs: the runner's, or ``"model"`` for an offloaded layer
        self.layer_layouts = [
            "model" if placement.is_offloaded(layer) else self.weight_layout
            for layer in self.layers
        ]
        self.windows = self.adapter.windows
        self._rope_keys = self.adapter.rope_keys()
        emb = self.embedding
        self.vocab_size = int(getattr(self.config, "vocab_size", emb.num_embeddings))
        self.hidden_size = int(emb.embedding_dim)
        limit = getattr(self.config, "max_position_embeddings", None)
        #: Positions the model holds (``max_position_embeddings``; None: no limit known): a
        #: forward at position ``max_positions`` or later is a ``ValueError``.
        self.max_positions: int | None = int(limit) if limit else None

    def _measured_layout(self, model: nn.Module) -> str:
        """``auto``: the fastest layout measured here among the registered layouts that run for this
        device and dtype (:func:`selfspec._engine.runner.formats.candidates`), the static rule's
        choice when the measurement cannot tell them apart or where none but it runs (a layout of
        the model's own dtype only: a GPU, float64)."""
        static = self.weight_layout
        if placement.is_dispatched(model):  # offloaded weights are not in memory to time
            self.choices["weight_layout"] = Choice(
                "weight_layout", static, "static: a model accelerate dispatched"
            )
            return static
        candidates = (
            formats.candidates("layout", self.device, self.dtype)
            if static == "packed"
            else [static]
        )
        fits = formats.fitting(candidates, product_bytes(model), machine.available_memory())
        choice = choose_weight_layout(
            model, list(self.layers), self.adapter.lm_head, static=static, candidates=fits
        )
        if len(fits) < len(candidates):
            left = ", ".join(c for c in candidates if c not in fits)
            choice = Choice(
                "weight_layout",
                choice.chosen,
                f"{choice.how}; not measured, its copy would not fit "
                f"in the memory available: {left}",
                choice.seconds,
                choice.key,
            )
        self.choices["weight_layout"] = choice
        return choice.chosen

    def _layout(self) -> formats.WeightFormat:
        """The registered format of this runner's layout."""
        return formats.weight_format(self.weight_layout, "layout")

    def _measured_one_row_width(self) -> None:
        """The packed products compute a one-token input in the number of rows measured fastest
        here (``self.choices["one_row_width"]``; :func:`~selfspec._engine.tuning.calibration.
        choose_one_row_width`)."""
        choice = choose_one_row_width(self.model, list(self.layers), self.adapter.lm_head)
        self.choices["one_row_width"] = choice
        set_one_row_width([*self._run_layers, self.adapter.lm_head], int(choice.chosen))

    def _head_bytes(self, head: nn.Module) -> int:
        cached = self._head_cache.get(id(head))
        if cached is None or cached[0] is not head:
            cached = self._head_cache[id(head)] = (head, product_bytes(head))
        return cached[1]

    @property
    def device(self) -> torch.device:
        """Where token ids, the KV cache's positions and the logits live: the embedding's
        execution device (its weights' device, or accelerate's for an offloaded embedding)."""
        return placement.execution_device(self.embedding)

    @property
    def placement(self) -> dict | None:
        """The model's placement when accelerate dispatched it (``{"devices": {device: layers},
        "layers": "0-13 cpu, 14-27 disk", "other": {...}, "offloaded_layers": n, "layouts":
        "0-13 packed, 14-27 model"}``), else ``None``. Plugins read it to refuse a placement
        they cannot support, at setup."""
        found = placement.describe(self.model)
        if found is not None:
            found["layouts"] = placement.runs(dict(enumerate(self.layer_layouts)))
        return found

    def loaded(self, module: nn.Module):
        """A context manager: inside it, ``module``'s offloaded weights (if any) hold values,
        read through the model's own accelerate hooks, one module at a time; after it they are
        meta tensors again. For a plugin that reads weights at setup (an LM head's rows, a
        norm) of a model that may be offloaded; any other module is yielded as it is."""
        return placement.loaded(module)

    @property
    def dtype(self) -> torch.dtype:
        """The model's dtype (its embedding's)."""
        return self.embedding.weight.dtype

    def new_cache(self, capacity: int) -> KVCache:
        """A cache for up to ``capacity`` positions (prompt + output + the largest draft block)."""
        return KVCache(self.n_layers, capacity, self.device)

    def embed(self, ids: torch.Tensor, *, weights: DraftCopy | None = None) -> torch.Tensor:
        """ids ``[q]`` or ``[1, q]`` -> ``[1, q, H]``. ``weights``: a draft pass's draft
        weights, whose in-memory copy of an offloaded embedding then embeds (the model's own
        embedding otherwise: the same values)."""
        if weights is not None and weights.embedding is not None:
            return weights.embedding(ids.reshape(1, -1).to(self.device))
        return self.adapter.embed(ids.reshape(1, -1))

    def head(self, hidden: torch.Tensor, *, lm_head: nn.Module | None = None) -> torch.Tensor:
        """Final norm + LM head (+ the model's logit soft-capping) on any hidden state: an
        early exit when taken mid-model. ``[..., H]`` -> ``[..., V]``. ``lm_head``: another
        module with the head's contract (``[..., H]`` -> ``[..., V']``, e.g. a compressed copy
        or a row subset of the head) in place of the runner's own."""
        self.weight_bytes += self._head_bytes(self.adapter.lm_head if lm_head is None else lm_head)
        if lm_head is None:
            return self.adapter.head(hidden)
        return self.softcap(lm_head(self.norm(hidden)))

    # ------------------------------------------------------------------ model-wide parts
    # The pieces of head() and embed() a plugin needs to build its own variants of them
    # (exit heads, compressed copies, a draft vocabulary). Plugins use these, never the adapter.
    @property
    def final_norm(self) -> nn.Module:
        """The model's final norm module (the one :meth:`head` applies before the LM head)."""
        return self.adapter.final_norm

    def norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """The final norm alone: ``[..., H]`` -> ``[..., H]``."""
        return self.adapter.final_norm(hidden)

    @property
    def logit_softcap(self) -> float | None:
        """The model's final logit soft-capping constant (Gemma), or ``None``."""
        return self.adapter.softcap or None

    def softcap(self, logits: torch.Tensor) -> torch.Tensor:
        """Apply the model's final logit soft-capping (``tanh(x / c) * c``); identity without."""
        c = self.logit_softcap
        return torch.tanh(logits / c) * c if c else logits

    @property
    def lm_head(self) -> nn.Module:
        """The model's own LM head module (``[..., H]`` -> ``[..., V]``, before soft-capping);
        its ``weight`` is ``[V, H]``. Not the runner's layout copy: read it, never modify it."""
        return self.model.get_output_embeddings()

    @property
    def embedding(self) -> nn.Module:
        """The model's own token embedding module (``ids -> [.., H]``, any ``embed_scale``
        applied inside it, as Gemma's does); ``weight`` is ``[V, H]``. Read it, never modify it."""
        return self.adapter.base.embed_tokens

    @torch.inference_mode()
    def forward(
        self,
        ids: torch.Tensor | None = None,
        *,
        hidden: torch.Tensor | None = None,
        cache: KVCache | None = None,
        start: int | None = None,
        positions: torch.Tensor | None = None,
        block_mask: torch.Tensor | None = None,
        layers: tuple[int, int] | None = None,
        skip_attn: Collection[int] = (),
        skip_mlp: Collection[int] = (),
        write: bool = True,
        capture: Collection[int] = (),
        logits: str | torch.Tensor | None = "all",
        substitutes: Mapping[int, nn.Module] | None = None,
        weights: DraftCopy | None = None,
    ) -> ForwardOut:
        """Run a block of ``q`` tokens through layers ``[a, b)``, under ``torch.inference_mode()``.

        ids: ``[q]`` token ids (batch size 1; needs ``a == 0``), or hidden: ``[1, q, H]`` the
            input of layer a.
        cache/start: the block's keys/values go to slots ``[start, start+q)`` (default: the
            valid length of layer ``a``) and it attends to slots ``[0, start)``; every layer run
            must hold at least ``start`` valid slots (a slot that held a rejected draft is simply
            overwritten). ``cache=None`` runs without a prefix.
        positions: ``[q]`` position ids (default ``start + arange(q)``), absolute (the position
            of the token in the sequence, from 0), each below :attr:`max_positions`: a
            position at or past the model's limit is a ``ValueError`` naming it.
        block_mask: ``[q, q]`` bool, which block tokens each block token sees (default causal;
            the cached prefix is visible to all), or ``[q, start+q]`` bool, which cached slots
            and block tokens each block token sees (a tree drafted depth by depth, whose earlier
            nodes sit in the cache: each node sees only its ancestors' slots).
        skip_attn / skip_mlp: layer indices whose attention / MLP block is skipped (a skipped
            attention block writes no keys/values).
        write: ``False`` attends without writing the cache (read-only).
        capture: layer indices (0..L) whose input state to return in ``captured``.
        logits: the rows that get the LM head: ``"all"`` (``[q, V]``), ``"last"`` (``[1, V]``),
            ``[n]`` row indices (``[n, V]``) or ``None`` (no LM head, as in prefill); computed
            only when ``b`` is the last layer, else ``None`` whatever ``logits=`` says (use
            :meth:`head` on ``out.hidden[0]`` for an early exit).
        substitutes: ``{layer: module}`` to run instead of the model's own layer.
        weights: draft weights (:func:`selfspec.draft_weights`) for a *draft* pass: their
            compressed layers run instead of the model's (``substitutes`` still win for the
            layers they name) and logits come from their head (``[n, V]``, ``-inf`` outside a
            draft vocabulary). Verification never passes it: it reads the model's own weights.
        """
        a, b = layers if layers is not None else (0, self.n_layers)
        if not 0 <= a <= b <= self.n_layers:
            raise ValueError(f"layer range [{a}, {b}) is outside [0, {self.n_layers}]")
        if hidden is None:
            if ids is None or a != 0:
                raise ValueError("give ids (starting at layer 0) or hidden states at layer a")
            h = self.embed(ids, weights=weights)  # h: [1, q, H]
        else:
            h = hidden
        q = h.shape[1]
        device = h.device
        if cache is None:
            cache = KVCache(self.n_layers, max(q, 1), device)
            start = 0
        if start is None:
            start = cache.lengths[a] if a < self.n_layers else 0
        if positions is None:
            last = start + q - 1
            positions = torch.arange(start, start + q, device=device)
        else:
            positions = positions.reshape(-1)
            last = int(positions.max()) if q else -1
        if self.max_positions is not None and last >= self.max_positions:
            raise ValueError(
                f"position {last} is past the model's limit: it holds positions 0 to "
                f"{self.max_positions - 1} (max_position_embeddings {self.max_positions})"
            )
        positions = positions.reshape(-1)
        if start + q > cache.capacity:
            raise ValueError(
                f"block of {q} tokens at slot {start} exceeds the cache capacity {cache.capacity}"
            )
        if write:
            cache.pos[start : start + q] = positions
        prefix_pos = cache.pos[:start]

        # rotary tables and masks, computed once per distinct kind of layer
        pos_ids = positions[None]  # [1, q]
        ropes: dict = {}
        layer_masks: dict = {}
        captured: dict[int, torch.Tensor] = {}
        impl = self.adapter.attn_impl
        for i in range(a, b):
            dev = self.layer_devices[i]
            if h.device != dev:  # a dispatched model: the activations follow the layers
                h = h.to(dev)
            if a == i and i in capture:
                captured[i] = h[0]
            lean = None
            if substitutes and i in substitutes:
                layer = substitutes[i]
            elif weights is not None and i in weights.layers:
                layer = weights.layers[i]
                lean = self._lean_blocks(layer) if self.lean_drafts else None
            else:
                layer = self._run_layers[i]
            attn_bytes, mlp_bytes = block_bytes(layer)
            if i not in skip_attn:
                self.weight_bytes += attn_bytes
                key = (self._rope_keys[i], h.device)
                if key not in ropes:
                    ropes[key] = _to(self.adapter.rope(h, pos_ids.to(h.device), key[0]), h.device)
                # exact mode's own layers take a position mask; draft substitutes the usual one
                mk = (self.windows[i], h.device, self.exact and layer is self._run_layers[i])
                if mk not in layer_masks:
                    m = masks.build(prefix_pos, positions, block_mask, mk[0])
                    layer_masks[mk] = _to(
                        position_mask(m, torch.cat([prefix_pos, positions]), q)
                        if mk[2]
                        else masks.for_attention(m, impl, h.dtype),
                        h.device,
                    )
                kv = cache.view(i, start, write)
                if lean is not None:
                    h = lean.attn(h, ropes[key], layer_masks[mk], kv)
                else:
                    h = self.adapter.attn_block(layer, h, ropes[key], layer_masks[mk], kv)
            if i not in skip_mlp:
                self.weight_bytes += mlp_bytes
                h = lean.mlp(h) if lean is not None else self.adapter.mlp_block(layer, h)
            if i + 1 in capture:
                captured[i + 1] = h[0]

        out = ForwardOut(hidden=h, captured=captured)
        if logits is not None and b == self.n_layers:
            if isinstance(logits, str):
                rows = h[0] if logits == "all" else h[0, -1:]
            else:
                rows = h[0].index_select(0, logits)
            out.logits = self.head(rows) if weights is None else weights.head(self, rows)  # [n, V]
            if out.logits.device != device:
                out.logits = out.logits.to(device)
        return out

    def _lean_blocks(self, layer: nn.Module) -> LeanBlocks | None:
        """``layer``'s lean blocks (built once per layer module), or ``None``."""
        if layer not in self._lean:
            self._lean[layer] = self.adapter.lean(layer)
        return self._lean[layer]


def _to(x, device: torch.device):
    """A tensor, a tuple of tensors or None, on ``device`` (nothing copied when already there)."""
    if x is None:
        return None
    if isinstance(x, tuple):
        return tuple(t.to(device) for t in x)
    return x.to(device)
