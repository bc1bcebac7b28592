"""``specdec plugins``: installed plugins, versions, hooks and options, and the host's CPU."""

from __future__ import annotations

import json
import os
from typing import Any

import click

from selfspec.app._cli.group import cli
from selfspec.app._cli.settings import Settings, user_errors


@cli.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.pass_obj
def plugins_command(settings: Settings, as_json: bool) -> None:
    """List installed plugins with version, hooks and options."""
    from selfspec._engine.contract import manager, plugins

    entries: list[dict[str, Any]] = []
    for name, info in plugins.available().items():
        try:
            entries.append(manager.describe(name))
        except Exception as exc:  # one broken plugin must not hide the others
            entries.append({**info.as_dict(), "hooks": [], "options": [], "error": str(exc)})
    if settings.plugin_file:
        with user_errors():
            name, obj = settings.plugin_object()
            pm, instance = manager.make_manager(name, obj)
            entries.append(
                {
                    "name": name,
                    "version": getattr(obj, "__version__", None),
                    "distribution": None,
                    "value": os.path.abspath(settings.plugin_file),
                    "hooks": plugins.hook_names(pm, instance),
                    "options": [o.describe() for o in plugins.declared_options(pm).values()],
                }
            )
    if as_json:
        click.echo(json.dumps(entries, indent=2))
        return
    for e in entries:
        origin = e.get("distribution") or e.get("value")
        click.echo(f"{e['name']} {e.get('version') or '?'} ({origin})")
        if "error" in e:
            click.echo(f"  error: {e['error']}")
            continue
        click.echo(f"  hooks: {', '.join(e['hooks']) or 'none'}")
        if not e["options"]:
            click.echo("  options: none")
        for o in e["options"]:
            choices = f", one of {o['choices']}" if o.get("choices") else ""
            click.echo(
                f"  -o {o['name']}=<{o['type']}>  (default {o['default']!r}{choices}) {o['help']}"
            )
    click.echo(host_line())


def host_line() -> str:
    """The CPU and what ``--weight-layout auto`` runs on it in each dtype, and why."""
    import torch

    from selfspec._engine.runner.layout import choose_layout, packing_unsupported
    from selfspec._engine.tuning.machine import cpu_capability, cpu_model

    cpu = cpu_capability()
    parts = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        name = str(dtype).removeprefix("torch.")
        layout = choose_layout("auto", "cpu", dtype, cpu)
        why = packing_unsupported("cpu", dtype, cpu) if layout != "packed" else None
        parts.append(f"{name}: {layout}" + (f" ({why})" if why and dtype != torch.float64 else ""))
    line = (
        f"host: {cpu_model()} [{cpu.label}]; before measuring, --weight-layout auto on CPU runs "
        + "; ".join(parts)
    )
    return "\n".join([line, *format_lines(), *measured_lines()])


def format_lines() -> list[str]:
    """The registered weight formats (:mod:`selfspec._engine.runner.formats`), one line each: role,
    name, what it is, where it can run, whether it runs for a float32 model on this CPU (or
    why not), whether ``auto`` measures it, and the package that registered it."""
    import torch

    from selfspec._engine.runner.formats import weight_formats

    lines = [
        "weight formats (--weight-layout: layout; -o draft_weights=: draft; for a float32 model on "
        "this CPU):"
    ]
    for name, fmt in weight_formats().items():
        why = fmt.why_not("cpu", torch.float32)
        here = "runs here" if why is None else f"not here: {why}"
        auto = ", auto measures it" if fmt.auto and why is None else ""
        gate = " through the agreement gate" if auto and fmt.gated else ""
        owner = "" if fmt.owner == "selfspec" else f" [from {fmt.owner}]"
        lines.append(
            f"  {fmt.role:6} {name}: {fmt.summary} ({fmt.runs_on}; {here}{auto}{gate}){owner}"
        )
    return lines


def measured_lines() -> list[str]:
    """What ``auto`` measured on this machine so far, one line per model shape and choice."""
    from selfspec._engine.drafting.draftweights.agreement import cached_agreements, gated
    from selfspec._engine.tuning.calibration import cached_choices

    found = cached_choices()
    if not found:
        return [
            "measured here: nothing yet (auto measures the layout and draft weights at a model's "
            "first use)"
        ]
    lines = ["measured here (auto, per model shape; SELFSPEC_CALIBRATE=0 keeps the rule above):"]
    for key, choice in found:
        note = (
            "; a 4-bit copy runs only where the agreement gate admits it"
            if gated(choice.chosen)
            else ""
        )
        lines.append(f"  {key.rsplit('-', 1)[0]}: {choice.note()}{note}")
    agreements = cached_agreements()
    if agreements:
        lines.append(
            "agreement gate (per model: how often each copy ranks the model's token in its top "
            "two):"
        )
        lines += [f"  {line}" for line in agreements]
    return lines
