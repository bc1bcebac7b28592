"""Run decoding methods side by side on the same prompts, interleaved prompt by prompt.

A :class:`Method` is one way to decode: Hugging Face ``generate`` greedy (``hf``, the baseline
users know), HF prompt lookup decoding (``hf-pld``), HF early-exit self-speculation
(``hf-early-exit``), HF assisted generation with a smaller model of the same tokenizer drafting
(``hf-assisted``, the classic two-model speculative decoding), or a selfspec plugin with options
(``vanilla`` included). :func:`run_bench` runs every method on prompt 1, then every method on
prompt 2, ... (the order of methods rotates by one each prompt), so machine drift hits all
methods alike, and checks every output against the baseline's with
:func:`selfspec._engine.contract.reference.compare` (exact, or the near-tie rule).

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
from selfspec.app._bench.turns import (
    Run,
    answer_text,
    conversation,
    encode_turn,
    make_record,
    safe_run,
)
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
    assistant: Any = field(
        default=None, hash=False, compare=False
    )  # hf-assisted: the Loaded drafter

    @classmethod
    def of_plugin(
        cls,
        plugin: str,
        options: dict[str, Any] | None = None,
        name: str | None = None,
        plugin_object: Any = None,
    ) -> Method:
        options = dict(options or {})
        label = name or (
            plugin + (f"[{','.join(f'{k}={v}' for k, v in options.items())}]" if options else "")
        )
        return cls(label, "plugin", plugin, options, plugin_object)


def resolved_options(
    plugin: str, options: dict[str, Any], plugin_object: Any = None
) -> dict[str, Any]:
    """Every option value ``plugin`` runs with when given ``options``: the given ones validated,
    today's defaults for the rest, as JSON values. A bench records it per method, so a table
    can tell a row measured at other defaults than today's (``scripts/readme_tables.py``)."""
    import json

    from selfspec._engine.contract.manager import make_manager
    from selfspec._engine.contract.options import resolve
    from selfspec._engine.contract.plugins import declared_options

    values = resolve(declared_options(make_manager(plugin, plugin_object)[0]), options, plugin)
    return json.loads(json.dumps(values))


def peer_methods(early_exit_layer: int, assistant: Loaded | None = None) -> list[Method]:
    """The HF peers a user would otherwise pick; ``hf-assisted`` when an assistant model is
    given (a loaded model sharing the target's tokenizer)."""
    peers = [
        Method("hf-pld", "hf-pld", extra={"prompt_lookup_num_tokens": PLD_TOKENS}),
        Method(
            f"hf-early-exit[{early_exit_layer}]",
            "hf-early-exit",
            extra={"assistant_early_exit": early_exit_layer},
        ),
    ]
    if assistant is not None:
        peers.append(
            Method(
                f"hf-assisted[{assistant.name}]",
                "hf-assisted",
                extra={"assistant_model": assistant.name},
                assistant=assistant,
            )
        )
    return peers


def check_assistant(
    model: torch.nn.Module, assistant: torch.nn.Module, names: tuple[str, str]
) -> None:
    """ValueError unless ``assistant`` can draft for ``model`` in HF assisted generation: the
    same vocabulary (HF's universal assisted decoding across tokenizers is out of scope here),
    dtype and device."""

    def vocab(m: torch.nn.Module) -> int:
        return int(m.get_output_embeddings().weight.shape[0])

    if vocab(model) != vocab(assistant):
        raise ValueError(
            f"the assistant {names[1]!r} has a vocabulary of {vocab(assistant)} tokens and the "
            f"model {names[0]!r} {vocab(model)}: assisted generation needs the same tokenizer"
        )
    p, q = next(model.parameters()), next(assistant.parameters())
    if (p.dtype, p.device) != (q.dtype, q.device):
        raise ValueError(
            f"the assistant runs in {q.dtype} on {q.device}, the model in {p.dtype} on {p.device}"
        )


def n_layers(model: torch.nn.Module) -> int:
    cfg = getattr(model.config, "get_text_config", lambda: model.config)()
    return int(cfg.num_hidden_layers)


RunFn = Callable[[list[int], int, set[int]], Run]


def _last_layer(model: torch.nn.Module) -> torch.nn.Module:
    dec = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    return dec.layers[-1]


def _sync(model: torch.nn.Module) -> None:
    if model_device(model).type == "cuda":
        torch.cuda.synchronize()


def make_runner(
    method: Method,
    model: torch.nn.Module,
    tokenizer: Any = None,
    sampling: Any = None,
    weight_layout: str = "auto",
) -> RunFn:
    """A callable ``(prompt_ids, max_new_tokens, eos) -> Run`` for ``method``; ``sampling``: a
    :class:`selfspec.Sampling` (default greedy); ``weight_layout``: the runner's layout for a
    plugin (the HF methods run the model as it is)."""
    if method.kind in HF_KINDS:
        return _hf_runner(method, model, sampling)
    if method.kind != "plugin":
        raise ValueError(f"unknown method kind {method.kind!r}")
    from selfspec._engine.contract.loop import Decoder

    dec = Decoder(
        model,
        method.plugin or "vanilla",
        method.options,
        tokenizer=tokenizer,
        plugin_object=method.plugin_object,
        sampling=sampling,
        weight_layout=weight_layout,
    )

    def run(prompt_ids: list[int], max_new_tokens: int, eos: set[int]) -> Run:
        _sync(model)
        t0 = time.perf_counter()
        res = dec.generate(prompt_ids, max_new_tokens=max_new_tokens, eos_token_ids=eos)
        _sync(model)
        wall = time.perf_counter() - t0
        s = res.stats
        return Run(
            res.output_ids,
            wall,
            s.forwards,
            s.drafted,
            s.accepted,
            list(s.accept_lengths),
            dict(s.phase_s),
            s.prefill_s,
            s.weight_layout,
            s.weight_bytes,
            dict(s.choices),
            dict(s.extra),
            members={k: dict(v) for k, v in s.members.items()},
        )

    return run


def _hf_runner(method: Method, model: torch.nn.Module, sampling: Any = None) -> RunFn:
    """HF ``generate``: greedy, as :func:`selfspec._engine.contract.reference.reference_generate`
    configures it, or sampling (``do_sample=True`` with the temperature, top-k and top-p of
    ``sampling``, HF's RNG seeded with its seed before every call).

    Full-model forwards are counted by a hook on the last decoder layer (draft passes of the
    peers never reach it), so tau = new tokens / forwards, prefill forward included: HF's
    prefill produces the first token, like the first step of a selfspec decode. The same hook
    reads each forward's first position, from which the tokens each forward committed follow
    (:func:`accept_lengths_from_starts`). Plain ``hf`` also times its prefill: from the call to the
    end of the first forward's last layer (the prompt's forward, which goes on to give the
    first new token: ``prefill_new_tokens`` 1). A peer's first forward verifies drafts too, so its
    prefill is not separable and stays unknown.
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
    how = (
        dict(
            do_sample=True,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
        )
        if sample
        else dict(do_sample=False)
    )

    def run(prompt_ids: list[int], max_new_tokens: int, eos: set[int]) -> Run:
        eos_list = sorted(eos)
        cfg = GenerationConfig(
            max_new_tokens=max_new_tokens,
            min_new_tokens=0,
            eos_token_id=eos_list or None,
            pad_token_id=eos_list[0] if eos_list else 0,
            num_beams=1,
            **how,
            **extra,
        )
        if sample:
            torch.manual_seed(sampling.seed)
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
        starts: list[int | None] = []
        first_done: list[float] = []

        def hook(_module: Any, args: Any, kwargs: dict[str, Any], _out: Any) -> None:
            if not starts:
                _sync(model)
                first_done.append(time.perf_counter())
            pos = kwargs.get("position_ids")
            starts.append(
                int(pos.reshape(-1)[0]) if isinstance(pos, torch.Tensor) and pos.numel() else None
            )

        handle = layer.register_forward_hook(hook, with_kwargs=True)
        try:
            with torch.inference_mode():
                _sync(model)
                t0 = time.perf_counter()
                out = model.generate(
                    ids, attention_mask=torch.ones_like(ids), generation_config=cfg, **gen_kwargs
                )
                _sync(model)
                wall = time.perf_counter() - t0
        finally:
            handle.remove()
        new = out[0, ids.shape[1] :].tolist()
        for i, t in enumerate(new):  # batch 1: nothing after EOS
            if t in eos:
                new = new[: i + 1]
                break
        prefill = first_done[0] - t0 if first_done and method.kind == "hf" else None
        return Run(
            new,
            wall,
            float(len(starts)),
            accept_lengths=accept_lengths_from_starts(starts, len(prompt_ids), len(new)),
            prefill_s=prefill,
            prefill_new_tokens=1 if prefill is not None else 0,
        )

    return run


def accept_lengths_from_starts(
    starts: Sequence[int | None], prompt_len: int, new_tokens: int
) -> list[int] | None:
    """The tokens each full-model forward of an HF decode committed, from the first position of
    every forward: forward ``k > 0`` starts at the last committed token (not yet cached), so
    ``starts[k] + 1 - prompt_len`` tokens were committed before it; the last forward committed the
    rest. ``None`` when a position is unknown or the lengths are not all positive."""
    if not starts or any(s is None for s in starts) or starts[0] != 0:
        return None
    done = [s + 1 - prompt_len for s in starts[1:]] + [new_tokens]  # type: ignore[operator]
    lengths = [done[0], *(b - a for a, b in zip(done, done[1:]))]
    return lengths if all(x > 0 for x in lengths) and sum(lengths) == new_tokens else None


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
    on_sample: Callable[[Sample, list[dict[str, Any]]], None] | None = None,
    weight_layout: str = "auto",
) -> list[dict[str, Any]]:
    """Run every method on every sample, interleaved; one record (a dict) per (sample, method).

    ``baseline`` names the method whose output is the reference for the losslessness check and
    whose time is the speedup denominator. ``warmup`` calls per method (on the first prompt,
    16 new tokens) come first. ``runners`` may supply prebuilt run functions by method name
    (tests use it to observe calls). ``sampling``: every method samples (see the module
    docstring); ``reference`` names the method whose output the others must equal (default: the
    baseline); under sampling, methods of another kind than ``plugin`` are not checked
    (``lossless: None``: HF's RNG) unless they are the reference's kind.

    A sample of several turns (``meta["conversation"]``) gives one record per turn and method
    (``turn`` 1, 2, ...), run and checked as :mod:`.turns` describes; a run that raises gives a
    record with ``error`` set, never an exception. ``on_sample(sample, records)`` is called
    after every sample with its records. ``weight_layout``: every plugin's runner layout.
    """
    from selfspec._engine.contract.reference import compare

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
            runners[m.name] = make_runner(m, model, loaded.tokenizer, sampling, weight_layout)
    reference = reference or baseline
    if reference not in names:
        raise ValueError(f"the reference {reference!r} is not among the methods {names}")
    ref_kind = next(m.kind for m in methods if m.name == reference)
    greedy_run = sampling is None or sampling.greedy  # greedy: every output is checked

    encoded = [encode_sample(loaded, s) for s in samples]  # every sample's first turn
    if warmup and encoded:
        for m in methods:
            for _ in range(warmup):
                safe_run(runners[m.name], encoded[0], min(16, max_new_tokens), eos)

    n_turns = [len(conversation(s, loaded.chat)) for s in samples]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=sum(n_turns) * len(methods), unit="run", dynamic_ncols=True, leave=True)
    records: list[dict[str, Any]] = []
    try:
        for i, (sample, first) in enumerate(zip(samples, encoded)):
            shift = i % len(methods) if rotate else 0
            order = list(methods[shift:]) + list(methods[:shift])
            runs: dict[str, list[tuple[list[int], Run]]] = {}
            position: dict[str, int] = {}
            for pos, m in enumerate(order):  # every turn of the conversation, method by method
                position[m.name] = pos
                runs[m.name] = []
                answers: list[str] = []
                for turn in range(n_turns[i]):
                    if bar is not None:
                        bar.set_postfix_str(f"{sample.task} · {m.name}")
                    ids = first if turn == 0 else encode_turn(loaded, sample, answers)
                    run = safe_run(runners[m.name], ids, max_new_tokens, eos)
                    runs[m.name].append((ids, run))
                    if bar is not None:
                        tps = len(run.output_ids) / run.wall_time if run.wall_time > 0 else 0.0
                        bar.set_postfix_str(f"{sample.task} · {m.name} {tps:.1f} tok/s")
                        bar.update(1)
                    if run.error is not None:
                        _warn(
                            f"ERROR {m.name} on {sample.task}/{sample.id} turn {turn + 1}: "
                            f"{run.error}",
                            bar,
                        )
                        if bar is not None:
                            bar.update(n_turns[i] - turn - 1)
                        break
                    if turn + 1 < n_turns[i]:
                        answers.append(answer_text(loaded.tokenizer, run.output_ids))
            sample_records = []
            for m in methods:
                checked = greedy_run or m.kind == "plugin" or m.kind == ref_kind
                for turn, (ids, run) in enumerate(runs[m.name]):
                    cmp, against = None, None
                    if checked and m.name != reference and run.error is None:
                        ref = _reference_output(
                            runs[reference], turn, ids, runners[reference], max_new_tokens, eos
                        )
                        if ref is not None:
                            against = "shared" if ref[1] else "own-prompt"
                            cmp = compare(model, ids, run.output_ids, ref[0], sampling=sampling)
                    ok = checked and (m.name == reference or cmp is not None)
                    rec = make_record(
                        sample,
                        m,
                        run,
                        ids,
                        cmp,
                        loaded.tokenizer,
                        i,
                        position[m.name],
                        ok,
                        turn + 1,
                    )
                    rec["reference_prompt"] = against
                    records.append(rec)
                    sample_records.append(rec)
                    if on_record is not None:
                        on_record(rec)
                    if rec["lossless"] is False and not rec["near_tie"]:
                        _warn(
                            f"DIVERGENCE {m.name} on {sample.task}/{sample.id} turn {turn + 1}: "
                            f"differs from {reference} at new token {rec['diverged_at']} "
                            f"(top-1/top-2 margin {rec['margin']}, "
                            f"above the near-tie bound {rec['bound']})",
                            bar,
                        )
            if on_sample is not None:
                on_sample(sample, sample_records)
    finally:
        if bar is not None:
            bar.close()
    return records


def _reference_output(
    ref_runs: list[tuple[list[int], Run]],
    turn: int,
    ids: list[int],
    ref_fn: RunFn,
    max_new_tokens: int,
    eos: set[int],
) -> tuple[list[int], bool] | None:
    """The reference's output for a turn whose prompt is ``ids``, and whether it is the timed run
    of the same prompt (``False``: the reference run afresh, untimed, on a prompt of the method's
    own, after an earlier answer differed). ``None`` when the reference failed."""
    if turn < len(ref_runs) and ref_runs[turn][0] == ids:
        run = ref_runs[turn][1]
        return None if run.error is not None else (run.output_ids, True)
    run = safe_run(ref_fn, ids, max_new_tokens, eos)
    return None if run.error is not None else (run.output_ids, False)


def _warn(msg: str, bar: Any = None) -> None:
    import click

    line = click.style(msg, fg="red", bold=True)
    if bar is not None:
        bar.write(line)
    else:
        click.echo(line, err=True)
