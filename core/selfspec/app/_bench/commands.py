"""The ``bench`` and ``sweep`` commands, and ``COMMANDS``: the plain click commands the CLI
attaches (``report`` lives in :mod:`.report`).

Nothing heavy is imported until a command runs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from selfspec.app._bench.report import report, write_sweep
from selfspec.app._bench.setup import (  # noqa: F401 (DEFAULT_TASKS: public here too)
    DEFAULT_TASKS,
    _config,
    _measure_memory,
    _method_config,
    _model_facts,
    _model_options,
    _peers,
    _placement,
    _placement_record,
    _samples,
    _setup,
    _tasks,
    _threads,
)
from selfspec.app._bench.variants import _check_inline, _plugin_options, parse_variant  # noqa: F401 (parse_variant: public here too)

SPEC_BENCH = "spec-bench"


def _finish(records: list[dict[str, Any]], allow: bool) -> None:
    bad = [r for r in records if r["lossless"] is False and not r["near_tie"]]
    ties = sum(1 for r in records if r["near_tie"])
    failed = [r for r in records if r.get("error")]
    if failed:
        click.secho(
            f"{len(failed)} run(s) FAILED and were recorded without output (the bench went on): "
            + "; ".join(
                sorted(
                    {
                        f"{r['method']} on {r['task']}/{r['question_id']}: {r['error']}"
                        for r in failed
                    }
                )
            ),
            fg="yellow",
            err=True,
        )
    if ties:
        click.secho(
            f"{ties} output(s) differ from the baseline at a near-tie (within the dtype's "
            "rounding: selfspec._engine.contract.tiebound).",
            fg="yellow",
        )
    if bad:
        click.secho(
            f"{len(bad)} output(s) DIVERGED from the baseline: "
            + ", ".join(sorted({f"{r['method']} on {r['task']}/{r['question_id']}" for r in bad})),
            fg="red",
            bold=True,
            err=True,
        )
        if not allow:
            sys.exit(1)


# --------------------------------------------------------------------------- bench
@click.command("bench")
@_model_options
@click.option(
    "--plugin",
    "-p",
    "plugins",
    multiple=True,
    metavar="NAME[[key=value,...]]",
    help="Plugin to measure (repeatable; default: every installed plugin; 'none' for none). "
    "Inline options in brackets measure variants side by side: -p lookup "
    "-p 'lookup[adaptive=false]'.",
)
@click.option(
    "--option",
    "-o",
    "options",
    multiple=True,
    metavar="[PLUGIN.]KEY=VALUE",
    help="Plugin option (repeatable); unscoped keys go to every selected plugin that declares "
    "them.",
)
@click.option("--no-peers", is_flag=True, help="Skip the HF peers (prompt lookup, early exit).")
@click.option(
    "--peers",
    "peer_spec",
    default=None,
    metavar="hf-pld,hf-early-exit",
    help="Which HF peers to run (comma-separated) [default: all].",
)
@click.option(
    "--early-exit-layer",
    type=click.IntRange(1),
    default=None,
    help="Exit layer of HF's assistant_early_exit peer [default: a quarter of the layers].",
)
@click.option(
    "--assistant-model",
    default=None,
    metavar="M",
    help="A smaller model with the same tokenizer for the hf-assisted peer (HF assisted "
    "generation: classic two-model speculative decoding), e.g. qwen2.5-coder-0.5b for "
    "qwen2.5-coder-1.5b.",
)
@click.option(
    "--memory",
    "memory",
    is_flag=True,
    help="After the timed runs, measure each method's peak resident memory and load time, each "
    "in a fresh process loading the model as specdec does.",
)
@click.option(
    "--temperature",
    type=click.FloatRange(min=0.0),
    default=0.0,
    show_default=True,
    help="Sample at this temperature (0: greedy). Every plugin is then checked against vanilla "
    "sampling with the same seed; the HF methods sample with generate(do_sample=True).",
)
@click.option(
    "--top-k",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Top-k of sampling (0: off).",
)
@click.option(
    "--top-p",
    type=click.FloatRange(min=0.0, max=1.0, min_open=True),
    default=1.0,
    show_default=True,
    help="Top-p of sampling (1: off).",
)
@click.option(
    "--sample-seed",
    type=click.IntRange(min=0, max=2**64 - 1),
    default=0,
    show_default=True,
    help="Seed of the sampling noise (--seed picks the prompts).",
)
@click.option("--split", type=click.Choice(["test", "dev"]), default="test", show_default=True)
@click.option(
    "--suite",
    type=click.Choice(["tasks", SPEC_BENCH]),
    default="tasks",
    show_default=True,
    help="tasks: the project's own tasks (--tasks). spec-bench: Spec-Bench's 480 questions in its "
    "six families (--samples per family, 80 for all; --tasks picks families), both MT-bench "
    "turns, and Spec-Bench answer files in OUT/model_answer/.",
)
@click.option(
    "--out", "out", type=click.Path(file_okay=False), default="bench-results", show_default=True
)
@click.option(
    "--resume",
    is_flag=True,
    help="Go on with an interrupted run in --out (the same command): samples every method has a "
    "record of are kept, the rest run; the tables cover both.",
)
@click.pass_context
def bench(
    ctx: click.Context,
    model: str | None,
    device: str,
    dtype: str,
    device_map: str | None,
    max_memory: str | None,
    offload_folder: str | None,
    threads: int,
    tasks: str,
    samples: int,
    max_new_tokens: int,
    seed: int,
    warmup: int,
    allow_divergence: bool,
    no_plot: bool,
    quiet: bool,
    plugins: tuple[str, ...],
    options: tuple[str, ...],
    no_peers: bool,
    peer_spec: str | None,
    early_exit_layer: int | None,
    assistant_model: str | None,
    memory: bool,
    temperature: float,
    top_k: int,
    top_p: float,
    sample_seed: int,
    split: str,
    suite: str,
    out: str,
    resume: bool,
) -> None:
    """Measure HF greedy, vanilla, the HF peers and plugins side by side on real prompts.

    Every method runs on the same prompts in one process, interleaved prompt by prompt, and
    every output is checked against HF greedy's. With --temperature above 0 every method
    samples instead: plugins are checked against vanilla sampling with the same seed, speedups
    stay against HF generate (sampling). Writes results.jsonl, summary.json, results.md and
    speedup.png to --out; with --suite spec-bench also one Spec-Bench answer file per method
    (model_answer/<model>-<method>.jsonl) and Spec-Bench's speed report in the table.
    """
    from selfspec._engine.contract.plugins import BUILTIN_METHOD, available
    from selfspec._engine.contract.sampling import Sampling
    from selfspec._engine.tuning.machine import plural
    from selfspec.app._bench import results as res
    from selfspec.app._bench.harness import Method, n_layers, run_bench

    sampling = Sampling(temperature, top_k, top_p, sample_seed)
    if suite == SPEC_BENCH:
        given = ctx.get_parameter_source("tasks") not in (None, click.core.ParameterSource.DEFAULT)
        task_list, prompts = _spec_bench_samples(tasks if given else None, samples, seed)
    else:
        task_list = _tasks(tasks)
        prompts = _samples(task_list, split, samples, seed)
    specs = (
        [p for p in plugins if p != "none"]
        if plugins
        else [p for p in available() if p != BUILTIN_METHOD]
    )
    variants = [(spec.strip(), *parse_variant(spec)) for spec in dict.fromkeys(specs)]
    variants = [v for v in variants if not (v[1] == BUILTIN_METHOD and not v[2])]
    names = list(dict.fromkeys(name for _, name, _ in variants))
    routed = _plugin_options(names, options)
    _check_inline(variants)
    _peers(
        peer_spec, no_peers, 1, assistant_given=assistant_model is not None
    )  # before the (slow) load
    if resume:  # before the (slow) load
        from selfspec.app._bench.resume import ResumeError, check_folder

        try:
            check_folder(Path(out))
        except ResumeError as exc:
            raise click.BadParameter(str(exc), param_hint="--resume") from None
    placement = _placement(device_map, max_memory, offload_folder)
    choice = _threads(threads)
    threads = choice.threads
    loaded = _setup(threads, model, device, dtype, placement)
    assistant = None
    if assistant_model is not None and not no_peers:
        from selfspec.app._bench.harness import check_assistant

        assistant = _setup(threads, assistant_model, device, dtype)
        try:
            check_assistant(loaded.model, assistant.model, (loaded.name, assistant.name))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--assistant-model") from None
    weight_layout = _group_param("weight_layout") or "auto"
    layer = early_exit_layer or max(1, n_layers(loaded.model) // 4)
    methods = [
        Method("hf", "hf"),
        Method.of_plugin(BUILTIN_METHOD),
        *_peers(peer_spec, no_peers, layer, assistant),
    ]
    methods += [
        Method.of_plugin(name, {**routed[name], **inline}, name=spec if inline else None)
        for spec, name, inline in variants
    ]

    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    jsonl = outdir / res.RECORDS
    config = _config(
        loaded,
        model,
        device=device,
        dtype=dtype,
        **choice.as_dict(),
        tasks=task_list,
        samples=samples,
        max_new_tokens=max_new_tokens,
        seed=seed,
        split=split if suite == "tasks" else None,
        warmup=warmup,
        suite=suite,
        questions=len(prompts),
        methods=[_method_config(m) for m in methods],
        argv=list(sys.argv),
        assistant_model=assistant.name if assistant else None,
        sampling=sampling.as_dict(),
        placement=_placement_record(loaded),
        weight_layout=weight_layout,
        **_model_facts(loaded.model),
    )
    machine = res.machine_info()  # before the run: the load average says how busy the machine was
    from selfspec.app._bench import resume as rs

    kept: list[dict[str, Any]] = []
    first_prompt = prompts[0]
    if resume:
        try:
            kept, prompts = rs.resume(outdir, config, machine, prompts, [m.name for m in methods])
        except rs.ResumeError as exc:
            raise click.BadParameter(str(exc), param_hint="--resume") from None
        click.echo(
            f"resuming: {len({(r['task'], r['question_id']) for r in kept})} sample(s) kept "
            f"from {jsonl}",
            err=True,
        )
    else:
        jsonl.write_text("", encoding="utf-8")
        rs.start(outdir, config, machine)
    click.echo(
        f"{len(prompts)} prompts × {len(methods)} methods ({', '.join(m.name for m in methods)}), "
        f"max {max_new_tokens} new tokens, {plural(threads, 'thread')}"
        + ("" if sampling.greedy else f", sampling {sampling.as_dict()}"),
        err=True,
    )
    from selfspec.app._bench.roofline import add_limits, model_device, read_bandwidth

    bandwidth = read_bandwidth(
        device=model_device(loaded.model)
    )  # again after the run: the higher one is the limit
    answers = None
    if suite == SPEC_BENCH:
        from selfspec.app._bench.answers import AnswerWriter

        answers = AnswerWriter(outdir, config["model"], [m.name for m in methods])
        for key in dict.fromkeys((r["task"], r["question_id"]) for r in kept):
            answers(None, [r for r in kept if (r["task"], r["question_id"]) == key])
    try:
        records = run_bench(
            loaded,
            prompts,
            methods,
            max_new_tokens=max_new_tokens,
            baseline="hf",
            warmup=warmup,
            progress=not quiet,
            on_record=lambda r: res.append_jsonl(jsonl, r),
            sampling=sampling,
            reference="hf" if sampling.greedy else BUILTIN_METHOD,
            on_sample=answers,
            weight_layout=weight_layout,
        )
        records = kept + records
    except Exception as exc:
        from selfspec._engine.contract.plugins import PluginError

        if isinstance(exc, PluginError):
            raise click.ClickException(str(exc)) from exc
        raise
    machine["load_avg_end"] = res.load_avg()
    if resume:
        machine["parts"] = rs.parts(outdir)
    summary = res.build_summary(records, baseline="hf", config=config, machine=machine)
    add_limits(summary, records, loaded.model, [bandwidth])
    if memory:  # in fresh processes, after this one let go of its models
        from selfspec.app._bench.memory import method_spec
        from selfspec.app._data import encode_sample

        prompt_ids = encode_sample(loaded, first_prompt)
        specs = [(m.name, method_spec(m, weight_layout)) for m in methods]
        del loaded, assistant, methods
        import gc

        gc.collect()
        summary["memory"] = _measure_memory(
            specs, model, dtype, device, threads, prompt_ids, quiet, placement
        )
    res.render(outdir, summary, plot=not no_plot)
    click.echo(res.markdown(summary))
    click.echo(
        f"wrote {outdir}/{{{res.RECORDS},{res.SUMMARY},{res.TABLE}"
        + ("" if no_plot else f",{res.PLOT}")
        + "}",
        err=True,
    )
    if answers is not None:
        click.echo(
            "wrote Spec-Bench answer files: "
            f"{answers.dir}/{{{','.join(p.name for p in answers.paths.values())}}}",
            err=True,
        )
    _finish(records, allow_divergence)


def _spec_bench_samples(families: str | None, n: int, seed: int) -> tuple[list[str], list[Any]]:
    """The families asked for (all without ``--tasks``) and ``n`` questions of each."""
    from selfspec.app._data import DataError
    from selfspec.app._specbench import FAMILIES, load_suite

    names = (
        list(FAMILIES)
        if families is None
        else [t.strip() for t in families.split(",") if t.strip()]
    )
    try:
        return names, load_suite(n, seed, names)
    except (DataError, FileNotFoundError) as exc:
        raise click.BadParameter(str(exc), param_hint="--tasks") from None


# --------------------------------------------------------------------------- report
# --------------------------------------------------------------------------- sweep
@click.command("sweep")
@_model_options
@click.option(
    "--plugin",
    "-p",
    default=None,
    help="The plugin whose options are swept [default: the one given as specdec --plugin NAME].",
)
@click.option(
    "--option",
    "-o",
    "options",
    multiple=True,
    metavar="KEY=V1,V2,...",
    help="An option and its values (repeatable; at most two options with several values).",
)
@click.option(
    "--split",
    type=click.Choice(["dev", "test"]),
    default="dev",
    show_default=True,
    help="Prompts come from the dev split: tuning never sees the test prompts.",
)
@click.option(
    "--out",
    "out",
    type=click.Path(file_okay=False),
    default=None,
    help="Output directory [default: sweep-<plugin>].",
)
def sweep(
    model: str | None,
    device: str,
    dtype: str,
    device_map: str | None,
    max_memory: str | None,
    offload_folder: str | None,
    threads: int,
    tasks: str,
    samples: int,
    max_new_tokens: int,
    seed: int,
    warmup: int,
    allow_divergence: bool,
    no_plot: bool,
    quiet: bool,
    plugin: str,
    options: tuple[str, ...],
    split: str,
    out: str | None,
) -> None:
    """Grid over one or two plugin options against vanilla; heatmap PNG and table.

    Example: specdec sweep --plugin lookup -o max_ngram=1,2,3 -o num_draft=4,8,16
    (or specdec --plugin lookup sweep -o ...).
    """
    from selfspec._engine.contract.manager import make_manager
    from selfspec._engine.contract.options import OptionError
    from selfspec._engine.contract.plugins import BUILTIN_METHOD, PluginError, declared_options
    from selfspec.app._bench import results as res
    from selfspec.app._bench import sweep as sw
    from selfspec.app._bench.harness import Method, run_bench

    plugin = plugin or _group_plugin()
    if not plugin:
        raise click.UsageError(
            "name the plugin to sweep: specdec sweep --plugin NAME -o key=v1,v2 ..."
        )
    try:
        fixed, axes = sw.parse_grid(options)
        fixed_t, axes_t = sw.typed_grid(
            declared_options(make_manager(plugin)[0]), fixed, axes, plugin
        )
    except (OptionError, PluginError) as exc:
        raise click.ClickException(str(exc)) from exc
    task_list = _tasks(tasks)
    prompts = _samples(task_list, split, samples, seed)
    placement = _placement(device_map, max_memory, offload_folder)
    choice = _threads(threads)
    loaded = _setup(choice.threads, model, device, dtype, placement)
    points = sw.grid_methods(plugin, fixed_t, axes_t)
    methods = [Method.of_plugin(BUILTIN_METHOD), *(m for _, m in points)]
    outdir = Path(out or f"sweep-{plugin}")
    outdir.mkdir(parents=True, exist_ok=True)
    jsonl = outdir / sw.SWEEP_RECORDS
    jsonl.write_text("", encoding="utf-8")
    click.echo(
        f"{len(prompts)} {split} prompts × {len(methods)} configurations, "
        f"max {max_new_tokens} new tokens",
        err=True,
    )
    try:
        records = run_bench(
            loaded,
            prompts,
            methods,
            max_new_tokens=max_new_tokens,
            baseline=BUILTIN_METHOD,
            warmup=warmup,
            progress=not quiet,
            on_record=lambda r: res.append_jsonl(jsonl, r),
            weight_layout=_group_param("weight_layout") or "auto",
        )
    except PluginError as exc:
        raise click.ClickException(str(exc)) from exc
    result = sw.summarize_sweep(records, plugin, fixed_t, axes_t, points, BUILTIN_METHOD)
    result.update(
        config=_config(
            loaded,
            model,
            device=device,
            dtype=dtype,
            **choice.as_dict(),
            tasks=task_list,
            samples=samples,
            max_new_tokens=max_new_tokens,
            seed=seed,
            split=split,
        ),
        machine=res.machine_info(),
    )
    write_sweep(outdir, result, plot=not no_plot)
    click.echo(sw.sweep_markdown(result))
    _finish(records, allow_divergence)


def _group_plugin() -> str | None:
    """The plugin named on the ``specdec`` group (``specdec --plugin NAME sweep``), if any."""
    return _group_param("plugin")


def _group_param(name: str) -> Any:
    """An option given on the ``specdec`` group (``specdec --weight-layout model bench``), if
    any."""
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx is not None else None
    return root.params.get(name) if root is not None and root is not ctx else None


#: The group options each command takes (``selfspec.app._cli.group._route_group_options``): the
#: group's value is the default of the command's own parameter of that meaning; ``""``: read
#: from the group (``_group_param``). Any other group option is refused there.
_RUN_OPTIONS = {
    "model": "model",
    "device": "device",
    "dtype": "dtype",
    "device_map": "device_map",
    "max_memory": "max_memory",
    "offload_folder": "offload_folder",
    "threads": "threads",
    "max_new_tokens": "max_new_tokens",
    "weight_layout": "",
}
bench.group_options = {
    **_RUN_OPTIONS,
    "plugin": "plugins",
    "options": "options",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "seed": "sample_seed",
}
sweep.group_options = {**_RUN_OPTIONS, "plugin": "plugin", "options": "options"}
report.group_options = {}

COMMANDS = (bench, sweep, report)
