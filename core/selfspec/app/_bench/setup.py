"""What the ``bench`` and ``sweep`` commands share before they measure: their model and run
options, the prompts, the thread choice, the model (and its placement), the peers, and what a
results folder records about the run. Nothing heavy is imported until a command runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import click

DEFAULT_TASKS = "humaneval,gsm8k,mtbench,sharegpt,summarization"


def _model_options(f: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option(
            "--model",
            "-m",
            default=None,
            help="Model path or name (default: the embedded default model).",
        ),
        click.option("--device", default="cpu", show_default=True, help="torch device."),
        click.option(
            "--dtype",
            default="float32",
            show_default=True,
            help="float32, bfloat16, float16 or float64.",
        ),
        click.option(
            "--device-map",
            metavar="MAP",
            default=None,
            help="Place the model with accelerate (auto, balanced, sequential or a JSON object); "
            "every method runs on that placement. See docs/cli.md.",
        ),
        click.option(
            "--max-memory",
            metavar="DEV=SIZE,...",
            default=None,
            help="What each device may hold, e.g. cpu=3GiB (the rest goes to disk); implies "
            "--device-map auto.",
        ),
        click.option(
            "--offload-folder",
            metavar="DIR",
            default=None,
            help="Where weights offloaded to disk are written; implies --device-map auto.",
        ),
        click.option(
            "--threads",
            type=click.IntRange(1),
            default=None,
            help="torch.set_num_threads for the run [default: the physical cores; on a busy "
            "machine see specdec's busy-machine rule, docs/cli.md].",
        ),
        click.option(
            "--tasks", default=DEFAULT_TASKS, show_default=True, help="Comma-separated task names."
        ),
        click.option(
            "--samples",
            "-n",
            type=click.IntRange(1),
            default=2,
            show_default=True,
            help="Prompts per task (bench --suite spec-bench: questions per family).",
        ),
        click.option("--max-new-tokens", type=click.IntRange(1), default=64, show_default=True),
        click.option(
            "--seed",
            type=int,
            default=0,
            show_default=True,
            help="Which prompts are drawn from the split.",
        ),
        click.option(
            "--warmup",
            type=click.IntRange(0),
            default=1,
            show_default=True,
            help="Warm-up calls per method.",
        ),
        click.option(
            "--allow-divergence",
            is_flag=True,
            help="Exit 0 even when an output diverges from the baseline.",
        ),
        click.option("--no-plot", is_flag=True, help="Skip the PNG plot."),
        click.option("--quiet", "-q", is_flag=True, help="No progress bar."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _tasks(spec: str) -> list[str]:
    from selfspec.app._data import task_names

    names = [t.strip() for t in spec.split(",") if t.strip()]
    unknown = [t for t in names if t not in task_names()]
    if unknown or not names:
        raise click.BadParameter(
            f"unknown task(s) {unknown} (known: {', '.join(task_names())})", param_hint="--tasks"
        )
    return names


def _samples(tasks: Sequence[str], split: str, n: int, seed: int) -> list[Any]:
    from selfspec.app._data import DataError, load_task

    out = []
    for t in tasks:
        try:
            got = load_task(t, split, n=n, seed=seed)
        except DataError as exc:
            raise click.ClickException(str(exc)) from exc
        if not got:
            raise click.ClickException(f"task {t!r} has no {split} samples")
        out.extend(got)
    return out


def _threads(threads: int | None) -> Any:
    """The run's :class:`selfspec._engine.tuning.machine.ThreadChoice` (the busy-machine rule,
    said on stderr)."""
    from selfspec._engine.tuning.machine import choose_threads

    choice = choose_threads(threads)
    if choice.reason == "busy":
        click.echo(choice.note(), err=True)
    return choice


def _placement(
    device_map: str | None, max_memory: str | None, offload_folder: str | None
) -> dict[str, Any]:
    """The checked placement options as ``load()`` keyword arguments (``{}`` when none)."""
    from selfspec.app._models import ModelLoadError
    from selfspec.app._models.placement import placement_request

    try:
        request = placement_request(device_map, max_memory, offload_folder)
    except ModelLoadError as exc:
        raise click.BadParameter(str(exc)) from None
    if not request.asked:
        return {}
    return {
        "device_map": request.device_map,
        "max_memory": request.max_memory or None,
        "offload_folder": request.offload_folder,
    }


def _setup(
    threads: int,
    model: str | None,
    device: str,
    dtype: str,
    placement: dict[str, Any] | None = None,
) -> Any:
    import torch

    from selfspec.app._models import ModelLoadError, load

    torch.set_num_threads(threads)
    try:
        loaded = load(model, device=device, dtype=dtype, **(placement or {}))
    except (ModelLoadError, OSError, ValueError) as exc:
        raise click.ClickException(f"cannot load the model: {exc}") from exc
    if placement:
        from selfspec.app._models.placement import placement_line

        click.echo(f"selfspec: {placement_line(loaded)}", err=True)
    return loaded


def _config(loaded: Any, model: str | None, **kw: Any) -> dict[str, Any]:
    return {"model": loaded.name or model, "chat": bool(loaded.chat), **kw}


def _method_config(m: Any) -> dict[str, Any]:
    """A method as summary.json records it; a plugin's with every option value it ran with."""
    from selfspec._engine.contract.options import OptionError
    from selfspec.app._bench.harness import resolved_options

    entry = {"name": m.name, "kind": m.kind, "plugin": m.plugin, "options": m.options, **m.extra}
    if m.kind == "plugin":
        try:
            entry["resolved_options"] = resolved_options(m.plugin, m.options, m.plugin_object)
        except OptionError as exc:
            raise click.ClickException(f"{m.name}: {exc}") from exc
    return entry


def _peers(
    spec: str | None,
    no_peers: bool,
    layer: int,
    assistant: Any = None,
    *,
    assistant_given: bool | None = None,
) -> list[Any]:
    """The peers to run. ``hf-assisted`` runs when an assistant model is given (always then,
    unless ``--peers`` leaves it out); asking for it without one is an error."""
    from selfspec.app._bench.harness import HF_KINDS, peer_methods

    if no_peers:
        return []
    has_assistant = assistant is not None if assistant_given is None else assistant_given
    peers = peer_methods(layer, assistant)
    if spec is None:
        return peers
    wanted = [s.strip() for s in spec.split(",") if s.strip()]
    known = [k for k in HF_KINDS if k != "hf"]
    unknown = [w for w in wanted if w not in known]
    if unknown:
        raise click.BadParameter(
            f"unknown peer(s) {unknown} (known: {', '.join(known)})", param_hint="--peers"
        )
    if "hf-assisted" in wanted and not has_assistant:
        raise click.BadParameter(
            "hf-assisted needs --assistant-model (e.g. qwen2.5-coder-0.5b for qwen2.5-coder-1.5b)",
            param_hint="--peers",
        )
    kinds = {m.kind: m for m in peers}
    return [kinds[w] for w in dict.fromkeys(wanted) if w in kinds]


def _model_facts(model: Any) -> dict[str, Any]:
    """Parameter count, layers and width: what a scaling comparison needs of the model."""
    cfg = getattr(model.config, "get_text_config", lambda: model.config)()
    return {
        "model_params": int(sum(p.numel() for p in model.parameters())),
        "model_layers": int(cfg.num_hidden_layers),
        "model_hidden": int(cfg.hidden_size),
    }


def _measure_memory(
    specs: Sequence[tuple[str, dict[str, Any] | None]],
    model: str | None,
    dtype: str,
    device: str,
    threads: int,
    prompt_ids: list[int],
    quiet: bool,
    placement: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Per method, peak RSS and load time in a fresh process (:mod:`.memory`)."""
    from tqdm.auto import tqdm

    from selfspec.app._bench.memory import measure

    out: dict[str, Any] = {}
    for name, spec in tqdm(
        specs, desc="memory (one process per method)", unit="method", disable=quiet
    ):
        out[name] = (
            measure(
                spec,
                model=model,
                dtype=dtype,
                device=device,
                threads=threads,
                prompt_ids=prompt_ids,
                placement=placement,
            )
            if spec
            else {"error": "a plugin object: not measured"}
        )
    return out


def _placement_record(loaded: Any) -> Any:
    from selfspec.app._models.placement import placement_record  # torch: imported on use only

    return placement_record(loaded)
