"""``specdec --plugin hispec calibrate`` and ``specdec --plugin hispec rates``.

Both receive a :class:`selfspec.app.CommandContext` as ``ctx.obj`` (the model the user chose,
decoders for it, the ``-o`` plugin options). Heavy imports happen inside the commands.
"""

from __future__ import annotations

import json
from typing import Any

import click

from selfspec import Layers, OptionError
from selfspec.app import CommandContext, DataError, encode_sample, load_task, task_names

from .heads import exit_layers

TASKS = "humaneval,gsm8k,mtbench,sharegpt"


def _task_samples(tasks: str, split: str, n: int, seed: int) -> list[Any]:
    names = [t.strip() for t in tasks.split(",") if t.strip()]
    unknown = [t for t in names if t not in task_names()]
    if unknown or not names:
        raise click.BadParameter(
            f"unknown task(s) {unknown} (known: {', '.join(task_names())})", param_hint="--tasks"
        )
    out = []
    for t in names:
        try:
            out.extend(load_task(t, split, n=n, seed=seed))
        except DataError as exc:
            raise click.ClickException(str(exc)) from exc
    if not out:
        raise click.ClickException(f"no {split} samples in {tasks}")
    return out


def _layers(spec: str | None, command: CommandContext, n_layers: int) -> list[int]:
    if spec:
        try:
            # the host's layer-list syntax (3,5,10-12)
            layers = list(Layers.parse(spec, "--layers"))
        except OptionError as exc:
            raise click.BadParameter(str(exc), param_hint="--layers") from None
    else:
        try:
            ld, li = exit_layers(command.options(), n_layers)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
        layers = sorted({ld, li})
    bad = [x for x in layers if not 1 <= x < n_layers]
    if bad or not layers:
        raise click.BadParameter(
            f"exit layers must lie in [1, {n_layers - 1}], got {bad or layers}",
            param_hint="--layers",
        )
    return layers


@click.command("calibrate")
@click.option(
    "--layers",
    default=None,
    metavar="4,8",
    help="Exit layers to fit [default: the plugin's draft_layer and verify_layer].",
)
@click.option(
    "--tasks", default=TASKS, show_default=True, help="Development tasks the prompts come from."
)
@click.option(
    "--prompts",
    "n_prompts",
    type=click.IntRange(1),
    default=6,
    show_default=True,
    help="Development prompts per task.",
)
@click.option(
    "--tokens",
    type=click.IntRange(1),
    default=64,
    show_default=True,
    help="Greedy continuation length per prompt.",
)
@click.option(
    "--texts",
    "n_texts",
    type=click.IntRange(0),
    default=48,
    show_default=True,
    help="Extra development texts (first 256 tokens) read without generating: more positions, "
    "cheaply.",
)
@click.option(
    "--vocab",
    "vocab_size",
    type=click.IntRange(0),
    default=8192,
    show_default=True,
    help="Exit heads score only this many most frequent tokens of development text (0: all).",
)
@click.option(
    "--steps", type=click.IntRange(0), default=200, show_default=True, help="Adam steps per layer."
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--out",
    "out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Profile path [default: <selfspec cache>/hispec/<model key>.pt, "
    "which profile=auto finds].",
)
@click.pass_obj
def calibrate(
    command: CommandContext,
    layers: str | None,
    tasks: str,
    n_prompts: int,
    tokens: int,
    n_texts: int,
    vocab_size: int,
    steps: int,
    seed: int,
    out: str | None,
) -> None:
    """Fit exit heads by self-distillation on the model's greedy continuations of dev prompts."""
    import torch
    from tqdm.auto import tqdm

    from . import calibrate as cal
    from .heads import ExitHeads, default_profile_path, save_profile

    samples = _task_samples(tasks, "dev", n_prompts, seed)
    loaded = command.load_model()
    vanilla = command.decoder(loaded, "vanilla")
    runner = vanilla.runner
    chosen = _layers(layers, command, runner.n_layers)

    sequences = []
    for s in tqdm(samples, desc="greedy continuations", unit="prompt", dynamic_ncols=True):
        ids = encode_sample(loaded, s)
        res = vanilla.generate(ids, max_new_tokens=tokens)
        sequences.append(ids + res.output_ids)
    # more development text, read (not generated): the targets are still the model's own greedy
    # tokens
    kinds = ("sharegpt", "humaneval", "gsm8k")  # n_texts split as evenly as it goes
    share = {
        k: (n_texts * (i + 1)) // len(kinds) - (n_texts * i) // len(kinds)
        for i, k in enumerate(kinds)
    }
    extra = cal.dev_texts(loaded.tokenizer, share) if n_texts else []
    data = cal.collect(
        runner,
        sequences + extra,
        chosen,
        progress=lambda it: tqdm(it, desc="capturing states", unit="seq", dynamic_ncols=True),
    )

    vocab = None
    if vocab_size and vocab_size < runner.vocab_size:
        counts = torch.zeros(runner.vocab_size, dtype=torch.long)
        for ids in sequences:
            counts += torch.bincount(torch.tensor(ids), minlength=runner.vocab_size)[
                : runner.vocab_size
            ]
        counts += _corpus_counts(loaded.tokenizer, runner.vocab_size, seed)
        vocab = cal.top_vocab(
            counts,
            vocab_size,
            must=torch.tensor(sorted(set(loaded.tokenizer.all_special_ids or []))),
        )
        vocab = vocab[vocab < runner.vocab_size]

    maps, report = {}, {}
    for layer in chosen:
        m, rep = cal.fit_layer(
            runner,
            data,
            layer,
            vocab,
            steps=steps,
            seed=seed,
            progress=lambda it, _l=layer: tqdm(
                it, desc=f"layer {_l}", unit="step", dynamic_ncols=True
            ),
        )
        if m is not None:
            maps[layer] = m
        report[layer] = rep
    heads = ExitHeads(
        maps=maps,
        vocab=vocab,
        meta={
            "layers": chosen,
            "tasks": tasks,
            "prompts": n_prompts,
            "tokens": tokens,
            "texts": n_texts,
            "steps": steps,
            "report": report,
        },
    )
    path = save_profile(heads, out or default_profile_path(runner), runner)
    click.echo("| layer | positions | plain head | ridge | refined | chosen |")
    click.echo("| ---: | ---: | ---: | ---: | ---: | --- |")
    for layer, r in report.items():
        chosen_name = ("plain", "ridge", "refined")[int(r["chosen"])]
        click.echo(
            f"| {layer} | {int(r['positions'])} | {r['plain']:.3f} | {r['ridge']:.3f} | "
            f"{r['refined']:.3f} | "
            f"{chosen_name} |"
        )
    click.echo(
        f"agreement with the full model's greedy token on held-out dev sequences"
        f"{'' if vocab is None else f' (exits score {vocab.numel()} tokens)'}"
    )
    click.echo(f"wrote {path}")


def _corpus_counts(tokenizer: Any, vocab_size: int, seed: int, max_texts: int = 3000) -> Any:
    """Token counts over development texts (the vocabulary the model reads and writes)."""
    import torch

    from selfspec.app import corpus_texts

    counts = torch.zeros(vocab_size, dtype=torch.long)
    for i, text in enumerate(corpus_texts()):
        if i >= max_texts:
            break
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if ids:
            counts += torch.bincount(torch.tensor(ids), minlength=vocab_size)[:vocab_size]
    return counts


@click.command("rates")
@click.option("--tasks", default=TASKS, show_default=True)
@click.option(
    "--samples", type=click.IntRange(1), default=2, show_default=True, help="Prompts per task."
)
@click.option("--max-new-tokens", type=click.IntRange(1), default=64, show_default=True)
@click.option("--split", type=click.Choice(["test", "dev"]), default="test", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object instead of a table row."
)
@click.pass_obj
def rates_command(
    command: CommandContext,
    tasks: str,
    samples: int,
    max_new_tokens: int,
    split: str,
    seed: int,
    as_json: bool,
) -> None:
    """Intermediate and full acceptance rates and tau of the current options (no timing)."""
    from .stats import COUNTERS, rates

    chosen = _task_samples(tasks, split, samples, seed)
    loaded = command.load_model()
    decoder = command.decoder(loaded)
    plugin = decoder.plugin
    if not hasattr(plugin, "counters"):
        raise click.ClickException("rates needs --plugin hispec")
    total = dict.fromkeys(COUNTERS, 0)
    new = forwards = 0.0
    for s in chosen:
        res = decoder.generate(encode_sample(loaded, s), max_new_tokens=max_new_tokens)
        for k in COUNTERS:
            total[k] += plugin.counters[k]
        new += res.stats.new_tokens
        forwards += res.stats.forwards
    out = {
        "options": {k: decoder.options[k] for k in sorted(decoder.options)},
        "layers": [plugin.ld, plugin.li],
        "profile": plugin.profile_path,
        **rates(total),
        "tau": new / forwards if forwards else None,
        "counters": total,
    }
    if as_json:
        click.echo(json.dumps(out))
        return
    f = lambda v: "–" if v is None else f"{v:.3f}"  # noqa: E731
    click.echo(
        "| L_d | L_i | single | profile | intermediate acc. | full acc. | buffer/step | tau |"
    )
    click.echo("| ---: | ---: | --- | --- | ---: | ---: | ---: | ---: |")
    click.echo(
        f"| {plugin.ld} | {plugin.li} | {plugin.single} | "
        f"{'yes' if plugin.profile_path else 'no'} | "
        f"{f(out['intermediate_acceptance'])} | {f(out['full_acceptance'])} | "
        f"{f(out['buffer_per_step'])} | "
        f"{f(out['tau'])} |"
    )
