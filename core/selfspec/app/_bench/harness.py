"""Run decoding methods side by side on the same prompts, interleaved prompt by prompt.

A :class:`Method` is one way to decode: Hugging Face ``generate`` greedy (``hf``, the baseline
users know), HF prompt lookup decoding (``hf-pld``), HF early-exit self-speculation
(``hf-early-exit``), HF assisted generation with a smaller model of the same tokenizer drafting
(``hf-assisted``, the classic two-model speculative decoding), or a selfspec plugin with options (``vanilla`` included). :func:`run_bench`
runs every method on prompt 1, then every method on prompt 2, ... (the order of methods rotates
by one each prompt), so machine drift hits all methods alike, and checks every output against
the baseline's with :func:`selfspec._engine.reference.compare` (exact, or the near-tie rule).

Every method is timed the same way: wall-clock time around one call, prefill included, after a
warm-up call per method.

Under sampling (``sampling=``, a :class:`selfspec.Sampling` with temperature > 0) every plugin
samples with the same seed, the HF peers call ``generate(do_sample=True, ...)`` with the same
temperature, top-k and top-p after ``torch.manual_seed(seed)`` (HF's own RNG: their tokens
differ from ours one by one, so they are not checked), and the losslessness reference is
``vanilla``'s output (``reference=``), the speed baseline still HF.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from selfspec._engine.runner.placement import model_device
from selfspec.app._data import Sample, encode_sample
from selfspec.app._models import Loaded, eos_token_ids

HF_KINDS = ("hf", "hf-pld", "hf-early-exit", "hf-assisted")
PLD_TOKENS = 10  # HF's default prompt_lookup_num_tokens in its docs' examples


# --------------------------------------------------------------------------- methods
@dataclass(frozen=True)
class Method:
    """One way to decode. ``kind`` is one of :data:`HF_KINDS` or ``plugin``."""

    name: str
    kind: str = "plugin"
    plugin: str | None = None
    options: dict[str, Any] = field(default_factory=dict, hash=False)
    plugin_object: Any = field(default=None, hash=False, compare=False)
    extra: dict[str, Any] = field(default_factory=dict, hash=False)
    assistant: Any = field(default=None, hash=False, compare=False)  # hf-assisted: the Loaded drafter

    @classmethod
    def of_plugin(cls, plugin: str, options: dict[str, Any] | None = None, name: str | None = None,
                  plugin_object: Any = None) -> Method:
        options = dict(options or {})
        label = name or (plugin + (f"[{','.join(f'{k}={v}' for k, v in options.items())}]" if options else ""))
        return cls(label, "plugin", plugin, options, plugin_object)


def resolved_options(plugin: str, options: dict[str, Any], plugin_object: Any = None) -> dict[str, Any]:
    """Every option value ``plugin`` runs with when given ``options``: the given ones validated,
    today's defaults for the rest, as JSON values. A bench records it per method, so a table
    can tell a row measured at other defaults than today's (``scripts/readme_tables.py``)."""
    import json

    from selfspec._engine.options import resolve
    from selfspec._engine.plugins import declared_options, make_manager

    values = resolve(declared_options(make_manager(plugin, plugin_object)[0]), options, plugin)
    return json.loads(json.dumps(values))


def peer_methods(early_exit_layer: int, assistant: Loaded | None = None) -> list[Method]:
    """The HF peers a user would otherwise pick; ``hf-assisted`` when an assistant model is
    given (a loaded model sharing the target's tokenizer)."""
    peers = [
        Method("hf-pld", "hf-pld", extra={"prompt_lookup_num_tokens": PLD_TOKENS}),
        Method(f"hf-early-exit[{early_exit_layer}]", "hf-early-exit", extra={"assistant_early_exit": early_exit_layer}),
    ]
    if assistant is not None:
        peers.append(Method(f"hf-assisted[{assistant.name}]", "hf-assisted",
                            extra={"assistant_model": assistant.name}, assistant=assistant))
    return peers


def check_assistant(model: torch.nn.Module, assistant: torch.nn.Module, names: tuple[str, str]) -> None:
    """ValueError unless ``assistant`` can draft for ``model`` in HF assisted generation: the
    same vocabulary (HF's universal assisted decoding across tokenizers is out of scope here),
    dtype and device."""
    def vocab(m: torch.nn.Module) -> int:
        return int(m.get_output_embeddings().weight.shape[0])

    if vocab(model) != vocab(assistant):
        raise ValueError(f"the assistant {names[1]!r} has a vocabulary of {vocab(assistant)} tokens and the model "
                         f"{names[0]!r} {vocab(model)}: assisted generation needs the same tokenizer")
    p, q = next(model.parameters()), next(assistant.parameters())
    if (p.dtype, p.device) != (q.dtype, q.device):
        raise ValueError(f"the assistant runs in {q.dtype} on {q.device}, the model in {p.dtype} on {p.device}")


def n_layers(model: torch.nn.Module) -> int:
    cfg = getattr(model.config, "get_text_config", lambda: model.config)()
    return int(cfg.num_hidden_layers)


@dataclass
class Run:
    """One decode of one prompt by one method."""

    output_ids: list[int]
    wall_time: float
    forwards: float
    drafted: int | None = None
    accepted: int | None = None
    accept_lengths: list[int] | None = None
    phase_s: dict[str, float] = field(default_factory=dict)
    prefill_s: float | None = None
    weight_layout: str | None = None  # the runner's layout (None for HF's own generate)


RunFn = Callable[[list[int], int, set[int]], Run]


def _last_layer(model: torch.nn.Module) -> torch.nn.Module:
    dec = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    return dec.layers[-1]


def _sync(model: torch.nn.Module) -> None:
    if model_device(model).type == "cuda":
        torch.cuda.synchronize()


def make_runner(method: Method, model: torch.nn.Module, tokenizer: Any = None, sampling: Any = None) -> RunFn:
    """A callable ``(prompt_ids, max_new_tokens, eos) -> Run`` for ``method``; ``sampling``: a
    :class:`selfspec.Sampling` (default greedy)."""
    if method.kind in HF_KINDS:
        return _hf_runner(method, model, sampling)
    if method.kind != "plugin":
        raise ValueError(f"unknown method kind {method.kind!r}")
    from selfspec._engine.loop import Decoder

    dec = Decoder(model, method.plugin or "vanilla", method.options, tokenizer=tokenizer, plugin_object=method.plugin_object,
                  sampling=sampling)

    def run(prompt_ids: list[int], max_new_tokens: int, eos: set[int]) -> Run:
        _sync(model)
        t0 = time.perf_counter()
        res = dec.generate(prompt_ids, max_new_tokens=max_new_tokens, eos_token_ids=eos)
        _sync(model)
        wall = time.perf_counter() - t0
        s = res.stats
        return Run(res.output_ids, wall, s.forwards, s.drafted, s.accepted, list(s.accept_lengths), dict(s.phase_s),
                   s.prefill_s, s.weight_layout)

    return run


def _hf_runner(method: Method, model: torch.nn.Module, sampling: Any = None) -> RunFn:
    """HF ``generate``: greedy, as :func:`selfspec._engine.reference.reference_generate` configures it,
    or sampling (``do_sample=True`` with the temperature, top-k and top-p of ``sampling``, HF's
    RNG seeded with its seed before every call).

    Full-model forwards are counted by a hook on the last decoder layer (draft passes of the
    peers never reach it), so tau = new tokens / forwards, prefill forward included: HF's
    prefill produces the first token, like the first step of a selfspec decode.
    """
    from transformers import GenerationConfig

    device = model_device(model)
    layer = _last_layer(model)
    extra = dict(method.extra)
    assistant = None
    if method.kind == "hf-assisted":
        extra.pop("assistant_model", None)
        assistant = method.assistant.model
    gen_kwargs = {"assistant_model": assistant} if assistant is not None else {}

    sample = sampling is not None and not sampling.greedy
    how = (dict(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
           if sample else dict(do_sample=False))

    def run(prompt_ids: list[int], max_new_tokens: int, eos: set[int]) -> Run:
        eos_list = sorted(eos)
        cfg = GenerationConfig(max_new_tokens=max_new_tokens, min_new_tokens=0,
                               eos_token_id=eos_list or None, pad_token_id=eos_list[0] if eos_list else 0,
                               num_beams=1, **how, **extra)
        if sample:
            torch.manual_seed(sampling.seed)
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
        count = [0]
        handle = layer.register_forward_hook(lambda *_: count.__setitem__(0, count[0] + 1))
        try:
            with torch.inference_mode():
                _sync(model)
                t0 = time.perf_counter()
                out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=cfg, **gen_kwargs)
                _sync(model)
                wall = time.perf_counter() - t0
        finally:
            handle.remove()
        new = out[0, ids.shape[1]:].tolist()
        for i, t in enumerate(new):  # batch 1: nothing after EOS
            if t in eos:
                new = new[: i + 1]
                break
        return Run(new, wall, float(count[0]))

    return run


# --------------------------------------------------------------------------- the run
Progress = Callable[[dict[str, Any]], None]


def run_bench(
    loaded: Loaded,
    samples: Sequence[Sample],
    methods: Sequence[Method],
    *,
    max_new_tokens: int,
    baseline: str = "hf",
    warmup: int = 1,
    rotate: bool = True,
    progress: bool = True,
    on_record: Progress | None = None,
    runners: dict[str, RunFn] | None = None,
    sampling: Any = None,
    reference: str | None = None,
) -> list[dict[str, Any]]:
    """Run every method on every sample, interleaved; one record (a dict) per (sample, method).

    ``baseline`` names the method whose output is the reference for the losslessness check and
    whose time is the speedup denominator. ``warmup`` calls per method (on the first prompt,
    16 new tokens) come first. ``runners`` may supply prebuilt run functions by method name
    (tests use it to observe calls). ``sampling``: every method samples (see the module
    docstring); ``reference`` names the method whose output the others must equal (default: the
    baseline); under sampling, methods of another kind than ``plugin`` are not checked
    (``lossless: None``: HF's RNG) unless they are the reference's kind.
    """
    from selfspec._engine.reference import compare

    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise ValueError(f"method names must be unique: {names}")
    if baseline not in names:
        raise ValueError(f"the baseline {baseline!r} is not among the methods {names}")
    model = loaded.model
    eos = set(eos_token_ids(model, loaded.tokenizer))  # the rule specdec stops by
    runners = dict(runners or {})
    for m in methods:
        if m.name not in runners:
            runners[m.name] = make_runner(m, model, loaded.tokenizer, sampling)
    reference = reference or baseline
    if reference not in names:
        raise ValueError(f"the reference {reference!r} is not among the methods {names}")
    ref_kind = next(m.kind for m in methods if m.name == reference)
    greedy_run = sampling is None or sampling.greedy  # greedy: every output is checked

    encoded = [encode_sample(loaded, s) for s in samples]
    if warmup and encoded:
        for m in methods:
            for _ in range(warmup):
                runners[m.name](encoded[0], min(16, max_new_tokens), eos)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(samples) * len(methods), unit="run", dynamic_ncols=True, leave=True)
    records: list[dict[str, Any]] = []
    try:
        for i, (sample, ids) in enumerate(zip(samples, encoded)):
            shift = i % len(methods) if rotate else 0
            order = list(methods[shift:]) + list(methods[:shift])
            runs: dict[str, Run] = {}
            position: dict[str, int] = {}
            for pos, m in enumerate(order):
                if bar is not None:
                    bar.set_postfix_str(f"{sample.task} · {m.name}")
                runs[m.name] = run = runners[m.name](ids, max_new_tokens, eos)
                if bar is not None:
                    tps = len(run.output_ids) / run.wall_time if run.wall_time > 0 else 0.0
                    bar.set_postfix_str(f"{sample.task} · {m.name} {tps:.1f} tok/s")
                    bar.update(1)
                position[m.name] = pos
            ref = runs[reference].output_ids
            for m in methods:
                run = runs[m.name]
                checked = greedy_run or m.kind == "plugin" or m.kind == ref_kind
                cmp = compare(model, ids, run.output_ids, ref, sampling=sampling) if checked and m.name != reference else None
                rec = make_record(sample, m, run, ids, cmp, loaded.tokenizer, i, position[m.name], checked)
                records.append(rec)
                if on_record is not None:
                    on_record(rec)
                if rec["lossless"] is False and not rec["near_tie"]:
                    _warn(f"DIVERGENCE {m.name} on {sample.task}/{sample.id}: differs from {reference} at new token "
                          f"{rec['diverged_at']} (top-1/top-2 margin {rec['margin']}, above the near-tie bound {rec['bound']})", bar)
    finally:
        if bar is not None:
            bar.close()
    return records


def make_record(sample: Sample, method: Method, run: Run, prompt_ids: list[int], cmp: Any, tokenizer: Any,
                index: int, order: int, checked: bool = True) -> dict[str, Any]:
    """One JSONL line: Spec-Bench's fields plus ours (see docs/benchmarks.md); ``lossless`` is
    None for an output nothing was compared with (``checked=False``: HF sampling)."""
    n = len(run.output_ids)
    text = None
    if tokenizer is not None:
        try:
            text = tokenizer.decode(run.output_ids, skip_special_tokens=True)
        except Exception:  # a tokenizer that cannot decode some id: keep the ids only
            text = None
    return {
        "question_id": sample.id,
        "task": sample.task,
        "method": method.name,
        "plugin": method.plugin,
        "options": {k: v for k, v in method.options.items()},
        "new_tokens": n,
        "wall_time": run.wall_time,
        "accept_lengths": run.accept_lengths,
        "tokens_per_s": n / run.wall_time if run.wall_time > 0 else 0.0,
        "tau": n / run.forwards if run.forwards else None,
        "forwards": run.forwards,
        "drafted": run.drafted,
        "accepted": run.accepted,
        "acceptance": (run.accepted / run.drafted) if run.drafted else None,
        "phase_s": run.phase_s,
        "prefill_s": run.prefill_s,
        "weight_layout": run.weight_layout,
        "prompt_tokens": len(prompt_ids),
        "lossless": (cmp is None or bool(cmp.equal)) if checked else None,
        "near_tie": bool(cmp is not None and cmp.near_tie),
        "margin": None if cmp is None else cmp.margin,
        "bound": None if cmp is None else cmp.bound,
        "diverged_at": None if cmp is None else cmp.index,
        "sample_index": index,
        "order": order,
        "output_ids": list(run.output_ids),
        "output": text,
    }


def _warn(msg: str, bar: Any = None) -> None:
    import click

    line = click.style(msg, fg="red", bold=True)
    if bar is not None:
        bar.write(line)
    else:
        click.echo(line, err=True)
