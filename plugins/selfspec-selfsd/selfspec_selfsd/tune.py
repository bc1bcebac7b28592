"""``specdec --plugin selfsd tune`` and ``trials``: the Bayesian search over skip sets (§3.3).

The search space is {0,1}^(2L): one switch per attention block and per MLP block. Optuna's
TPE sampler proposes a skip set; the objective decodes a few short development prompts
(greedy, so the drafted/accepted counts are deterministic) and scores the set with the cost
model (default) or by measured wall time (``--objective time``, the paper's; noisy on a
shared machine). Trials live in a sqlite study under the selfspec cache directory, so a
search resumes where it stopped and can be listed with ``trials``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from selfspec.app import CommandContext

TASKS = ("humaneval", "gsm8k", "mtbench", "sharegpt")


def commands() -> list[click.Command]:
    return [tune, trials]


def _storage_url(path: str | None) -> str:
    from .profiles import STORE

    p = Path(path) if path else STORE.path("optuna.db")
    p.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{p}"


def dev_prompts(loaded: Any, tasks: tuple[str, ...], n: int) -> list[list[int]]:
    """``n`` development prompts, round-robin over ``tasks`` (the dev split only)."""
    from selfspec.app import format_prompt, load_task

    per_task = {t: load_task(t, split="dev", n=n) for t in tasks}
    out: list[list[int]] = []
    i = 0
    while len(out) < n and any(per_task.values()):
        t = tasks[i % len(tasks)]
        if per_task[t]:
            s = per_task[t].pop(0)
            text = s.prompt if loaded.chat or not s.completion else s.completion
            out.append(format_prompt(loaded, text))
        i += 1
    return out


@click.command("tune")
@click.option(
    "--trials",
    "n_trials",
    type=click.IntRange(0),
    default=30,
    show_default=True,
    help="Trials to run now (added to the study's earlier ones); "
    "0 writes the study's best profile.",
)
@click.option(
    "--prompts",
    "n_prompts",
    type=click.IntRange(1),
    default=2,
    show_default=True,
    help="Development prompts per trial.",
)
@click.option(
    "--tokens", type=click.IntRange(1), default=16, show_default=True, help="New tokens per prompt."
)
@click.option(
    "--task",
    "tasks",
    multiple=True,
    type=click.Choice(TASKS),
    help="Tasks to draw dev prompts from (default: all four).",
)
@click.option(
    "--objective",
    type=click.Choice(["cost", "time"]),
    default="cost",
    show_default=True,
    help="cost: deterministic cost model; time: measured wall time per token (noisy).",
)
@click.option("--study", default=None, help="Study name (default: model key + objective).")
@click.option(
    "--storage",
    type=click.Path(dir_okay=False),
    default=None,
    help="sqlite file for the study (default: <cache dir>/selfsd/optuna.db).",
)
@click.option(
    "--give-up",
    type=float,
    default=1.5,
    show_default=True,
    help="Stop a trial after its first prompts once its relative cost exceeds this.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Sampler seed.")
@click.option("--remeasure", is_flag=True, help="Measure the block costs again.")
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the profile here (default: the user profile directory, used by profile=auto).",
)
@click.pass_obj
def tune(
    command: CommandContext,
    n_trials: int,
    n_prompts: int,
    tokens: int,
    tasks: tuple[str, ...],
    objective: str,
    study: str | None,
    storage: str | None,
    give_up: float,
    seed: int,
    remeasure: bool,
    out: str | None,
) -> None:
    """Search the skip set with Bayesian optimisation and save the best as a profile."""
    import optuna
    from tqdm import tqdm

    from selfspec import format_layers, model_identity
    from selfspec.app import user_errors

    from . import costmodel, profiles

    with user_errors():
        opts = dict(command.given_options())
        if "skip_attn" in opts or "skip_mlp" in opts:
            raise click.BadParameter(
                "the search chooses skip_attn/skip_mlp; do not pass them", param_hint="-o"
            )
        opts["profile"] = "none"
        # the cost model prices chains: k draft tokens, then verify[k + 1]
        opts.setdefault("tree", False)
        loaded = command.load_model()
        dec = command.decoder(loaded, "selfsd", opts)
    plugin = dec.plugin
    runner = dec.runner
    L = runner.n_layers
    identity = model_identity(runner)
    key = identity.key
    try:
        prompts = dev_prompts(loaded, tasks or TASKS, n_prompts)
    except Exception as exc:  # a missing data package
        raise click.ClickException(f"cannot load development prompts: {exc}") from None
    if not prompts:
        raise click.ClickException("no development prompts found")
    eos = None  # the model's own EOS

    click.echo(
        f"selfsd tune: {key}, {len(prompts)} dev prompts x {tokens} tokens, objective {objective}",
        err=True,
    )
    costs = (
        costmodel.costs_for(
            runner, key, remeasure=remeasure, max_q=plugin.num_draft + 1, weights=plugin.weights
        )
        if objective == "cost"
        else None
    )
    base_time = None
    if objective == "time":
        van = command.decoder(loaded, "vanilla")
        base_time = _per_token_time(van, prompts, tokens, eos)

    def evaluate(attn: tuple[int, ...], mlp: tuple[int, ...]) -> tuple[float, dict[str, Any]]:
        plugin.set_skips(attn, mlp, L)
        steps: list[tuple[int, int]] = []
        drafted = accepted = committed = 0
        wall = 0.0
        used = 0
        value = float("inf")
        for p in prompts:
            r = dec.generate(p, max_new_tokens=tokens, eos_token_ids=eos)
            wall += r.stats.wall_time_s
            steps += [(d, c) for (d, _), c in zip(plugin.log, r.stats.accept_lengths)]
            drafted += r.stats.drafted
            accepted += r.stats.accepted
            committed += r.stats.new_tokens
            used += 1
            if costs is not None:
                value = costs.relative_cost(steps, attn, mlp, reuse=plugin.reuse)
            else:
                value = (wall / max(1, committed)) / base_time
            if value > give_up:  # hopeless: the other prompts would not change the verdict
                break
        info = {
            "tau": committed / max(1, len(steps)),
            "acceptance": accepted / drafted if drafted else 0.0,
            "drafted_per_step": drafted / max(1, len(steps)),
            "prompts": used,
        }
        return value, info

    def objective_fn(trial: optuna.Trial) -> float:
        attn = tuple(i for i in range(L) if trial.suggest_categorical(f"a{i}", [0, 1]))
        mlp = tuple(i for i in range(L) if trial.suggest_categorical(f"m{i}", [0, 1]))
        value, info = evaluate(attn, mlp)
        for k, v in info.items():
            trial.set_user_attr(k, v)
        trial.set_user_attr("skip_attn", format_layers(attn))
        trial.set_user_attr("skip_mlp", format_layers(mlp))
        return value

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # costs differ per draft weights: one study each
    drafts = costmodel.weights_name(plugin.weights)
    name = study or (
        f"{key}-{objective}" if drafts == "none" else f"{key}-{objective}-draft-{drafts}"
    )
    st = optuna.create_study(
        study_name=name,
        storage=_storage_url(storage),
        direction="minimize",
        sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=10),
        load_if_exists=True,
    )
    if not st.trials:  # seed the search with structured guesses
        for attn, mlp in _seeds(L):
            st.enqueue_trial(
                {
                    **{f"a{i}": int(i in attn) for i in range(L)},
                    **{f"m{i}": int(i in mlp) for i in range(L)},
                }
            )
    bar = tqdm(total=n_trials, desc="selfsd tune", unit="trial")

    def progress(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        bar.update(1)
        try:
            bar.set_postfix(best=f"{study.best_value:.3f}")
        except ValueError:
            pass

    try:
        if n_trials:
            st.optimize(objective_fn, n_trials=n_trials, callbacks=[progress])
    except KeyboardInterrupt:
        click.echo("\ninterrupted: saving the best trial so far", err=True)
    bar.close()
    if not any(t.value is not None for t in st.trials):
        raise click.ClickException(f"study {name!r} has no complete trial yet")
    best = st.best_trial
    attn = tuple(i for i in range(L) if best.params.get(f"a{i}"))
    mlp = tuple(i for i in range(L) if best.params.get(f"m{i}"))
    prof = profiles.Profile(
        identity.as_dict(),
        attn,
        mlp,
        {
            "objective": objective,
            "value": best.value,
            "trial": best.number,
            "study": name,
            "trials": len(st.trials),
            "prompts": len(prompts),
            "tokens": tokens,
            "draft_weights": drafts,
            "options": {k: v for k, v in opts.items() if k != "profile"},
            **{k: best.user_attrs.get(k) for k in ("tau", "acceptance", "drafted_per_step")},
        },
    )
    path = profiles.save(prof, out)
    click.echo(
        f"best: trial {best.number}, {objective} {best.value:.4f} "
        f"(tau {best.user_attrs.get('tau', 0):.2f}, "
        f"acceptance {best.user_attrs.get('acceptance', 0):.2f}); skip attention "
        f"{format_layers(attn)}, MLP {format_layers(mlp)}"
    )
    click.echo(f"profile written to {path}")


@click.command("trials")
@click.option("--study", default=None, help="Study name (default: every study in the storage).")
@click.option(
    "--storage",
    type=click.Path(dir_okay=False),
    default=None,
    help="sqlite file (default: <cache dir>/selfsd/optuna.db).",
)
@click.option("--top", type=click.IntRange(1), default=None, help="Only the best N trials.")
def trials(study: str | None, storage: str | None, top: int | None) -> None:
    """List the trials of earlier searches (best first)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = _storage_url(storage)
    names = [study] if study else [s.study_name for s in optuna.get_all_study_summaries(url)]
    if not names:
        raise click.ClickException("no studies yet: run `specdec --plugin selfsd tune` first")
    for name in names:
        try:
            st = optuna.load_study(study_name=name, storage=url)
        except KeyError:
            raise click.ClickException(f"no study named {name!r}") from None
        done = [t for t in st.trials if t.value is not None]
        done.sort(key=lambda t: t.value)
        click.echo(f"study {name}: {len(st.trials)} trials ({len(done)} complete)")
        click.echo(
            f"{'trial':>5} {'value':>8} {'tau':>5} {'accept':>6} {'k/step':>6}  "
            f"skip attention | skip MLP"
        )
        for t in done[:top] if top else done:
            u = t.user_attrs
            click.echo(
                f"{t.number:>5} {t.value:>8.4f} {u.get('tau', 0):>5.2f} "
                f"{u.get('acceptance', 0):>6.2f} "
                f"{u.get('drafted_per_step', 0):>6.2f}  {u.get('skip_attn', '?')} | "
                f"{u.get('skip_mlp', '?')}"
            )


def _per_token_time(dec: Any, prompts: list[list[int]], tokens: int, eos: Any) -> float:
    wall = 0.0
    n = 0
    for p in prompts:
        r = dec.generate(p, max_new_tokens=tokens, eos_token_ids=eos)
        wall += r.stats.wall_time_s
        n += r.stats.new_tokens
    return wall / max(1, n)


def _seeds(L: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Structured first guesses, dense to sparse: the heuristic, later-half attention, every
    fourth later attention block, a few single blocks (small models tolerate few skips)."""
    from .profiles import heuristic

    mid = L // 2
    seeds = [
        heuristic(L),
        (tuple(range(mid, L - 1)), ()),
        (tuple(range(mid, L - 1, 4)), ()),
        ((L * 2 // 3,), ()),
        ((), (L // 6,)),
        ((L * 2 // 3, L * 5 // 6), (L // 6,)),
    ]
    return [(tuple(a), tuple(m)) for a, m in seeds]
