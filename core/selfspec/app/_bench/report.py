"""``specdec report``: re-render a bench or sweep directory from its saved records, or put
benches of several model sizes side by side (``--scaling``).

Nothing heavy is imported until the command runs.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click


@click.command("report")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.argument(
    "more", nargs=-1, metavar="[DIRECTORY]...", type=click.Path(exists=True, file_okay=False)
)
@click.option("--no-plot", is_flag=True, help="Skip the PNG plot.")
@click.option(
    "--scaling",
    is_flag=True,
    help="Put two or more bench directories (one model size each) side by side, with a projection.",
)
@click.option(
    "--out",
    "out",
    type=click.Path(file_okay=False),
    default=None,
    help="With --scaling: output directory [default: scaling-results].",
)
def report(
    directory: str, more: tuple[str, ...], no_plot: bool, scaling: bool, out: str | None
) -> None:
    """Re-render the table and plot of a bench (or sweep) directory from its saved JSONL.

    With --scaling, every DIRECTORY is a bench of one model size: writes scaling.json,
    scaling.md and scaling.png (speedup and τ over model size, and a labelled projection
    for a 7B model) to --out.
    """
    from selfspec.app._bench import results as res
    from selfspec.app._bench import sweep as sw

    if scaling:
        _report_scaling([directory, *more], out or "scaling-results", plot=not no_plot)
        return
    if more or out is not None:
        raise click.UsageError(
            "several directories and --out go with --scaling; "
            "specdec report DIRECTORY re-renders one bench or sweep"
        )
    d = Path(directory)
    done = False
    if (d / res.RECORDS).is_file():
        old = (
            json.loads((d / res.SUMMARY).read_text(encoding="utf-8"))
            if (d / res.SUMMARY).is_file()
            else {}
        )
        records = res.read_jsonl(d / res.RECORDS)
        baseline = old.get("baseline", "hf")
        summary = res.build_summary(
            records, baseline=baseline, config=old.get("config", {}), machine=old.get("machine", {})
        )
        _carry(old, summary, records)
        res.render(d, summary, plot=not no_plot)
        click.echo(res.markdown(summary))
        done = True
    if (d / sw.SWEEP_RECORDS).is_file() and (d / sw.SWEEP_SUMMARY).is_file():
        old = json.loads((d / sw.SWEEP_SUMMARY).read_text(encoding="utf-8"))
        records = res.read_jsonl(d / sw.SWEEP_RECORDS)
        axes = [(k, v) for k, v in old["axes"]]
        points = sw.grid_methods(old["plugin"], old["fixed"], axes)
        new = sw.summarize_sweep(
            records, old["plugin"], old["fixed"], axes, points, old.get("baseline", "vanilla")
        )
        new.update(config=old.get("config", {}), machine=old.get("machine", {}))
        write_sweep(d, new, plot=not no_plot)
        click.echo(sw.sweep_markdown(new))
        done = True
    if not done:
        raise click.ClickException(f"{d} holds neither {res.RECORDS} nor {sw.SWEEP_RECORDS}")


def _carry(old: dict[str, Any], summary: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """What a re-render cannot rebuild from the records alone, from the old summary: the
    memory table and the measured choices as they were, the roofline recomputed from the
    records with the bandwidth and model bytes measured then."""
    from selfspec.app._bench.roofline import roofline

    for key in ("memory", "choices"):
        if key in old:
            summary[key] = old[key]
    roof = old.get("roofline")
    if roof:
        summary["roofline"] = roofline(
            records,
            bandwidth=roof["bandwidth_bytes_per_s"],
            full_forward_bytes=roof["model_bytes"],
            device=roof.get("device", "cpu"),
        )


def _report_scaling(directories: Sequence[str], out: str, plot: bool) -> None:
    from selfspec.app._bench import scaling as sc

    if len(directories) < 2:
        raise click.UsageError(
            "--scaling needs at least two bench directories (one per model size)"
        )
    try:
        summaries = [sc.load_summary(d) for d in directories]
        names = [str(s["config"].get("model")) for s in summaries]
        for j, i in itertools.combinations(range(len(names)), 2):
            if names[i] == names[j]:
                raise sc.ScalingError(
                    f"{directories[j]} and {directories[i]} are both benches of {names[i]}; "
                    "--scaling needs one directory per model size"
                )
        table = sc.scaling_table(summaries)
        proj = sc.projection(table)
    except sc.ScalingError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        written = sc.render_scaling(out, table, proj, plot=plot)
    except RuntimeError as exc:  # matplotlib missing
        raise click.ClickException(f"{exc} (or pass --no-plot)") from exc
    click.echo(sc.scaling_markdown(table, proj))
    click.echo("wrote " + ", ".join(str(p) for p in written), err=True)


def write_sweep(d: Path, sweep: dict[str, Any], plot: bool) -> None:
    from selfspec.app._bench import sweep as sw

    (d / sw.SWEEP_SUMMARY).write_text(
        json.dumps(sweep, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    (d / sw.SWEEP_TABLE).write_text(sw.sweep_markdown(sweep), encoding="utf-8")
    if plot:
        from selfspec.app._bench.plot import sweep_plot

        sweep_plot(sweep, d / sw.SWEEP_PLOT)
