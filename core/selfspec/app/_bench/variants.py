"""Which plugins a bench measures, and with which options: ``--plugin NAME[key=value,...]``
variants and ``-o [PLUGIN.]KEY=VALUE`` routing (parsed before any model loads)."""

from __future__ import annotations

from collections.abc import Sequence

import click


def _plugin_options(plugins: Sequence[str], pairs: Sequence[str]) -> dict[str, dict[str, str]]:
    """Route ``-o [PLUGIN.]KEY=VALUE`` to plugins: scoped to one (and to the member of that name
    in every composition measured), or unscoped to every plugin and composition member declaring
    KEY."""
    from selfspec._engine.contract.manager import make_manager
    from selfspec._engine.contract.options import OptionError, parse_pairs
    from selfspec._engine.contract.plugins import PluginError, declared_options

    try:
        given = parse_pairs(pairs)
        declared = {p: set(declared_options(make_manager(p)[0])) for p in plugins}
    except (OptionError, PluginError) as exc:
        raise click.ClickException(str(exc)) from exc
    routed: dict[str, dict[str, str]] = {p: {} for p in plugins}
    for key, value in given.items():
        scope, dot, name = key.partition(".")
        if dot:  # PLUGIN.KEY: that plugin's KEY, and a composition's member option of that name
            takers = [p for p in plugins if p == scope or key in declared[p]]
            if not takers:
                raise click.ClickException(
                    f"-o {key}=...: plugin {scope!r} is not among --plugin {list(plugins)} "
                    "(nor a member of a composition among them)"
                )
            for p in takers:
                routed[p][name if p == scope else key] = value
            continue
        # unscoped: every plugin declaring KEY, and every member of a composition declaring it
        takers = [
            (p, k)
            for p in plugins
            for k in sorted(declared[p])
            if k == key or k.endswith(f".{key}")
        ]
        if not takers:
            raise click.ClickException(f"-o {key}=...: no selected plugin declares option {key!r}")
        for p, k in takers:
            routed[p][k] = value
    return routed


def parse_variant(spec: str) -> tuple[str, dict[str, str]]:
    """``"lookup[num_draft=10,adaptive=false]"`` ->
    ``("lookup", {"num_draft": "10", "adaptive": "false"})``.

    A ``--plugin`` value may carry inline options in brackets, so one run can measure several
    configurations of the same plugin side by side (an ablation); a bare name has none.
    """
    spec = spec.strip()
    name, bracket, rest = spec.partition("[")
    name = name.strip()
    if not name or any(c in name for c in "]=,"):
        raise click.BadParameter(
            f"{spec!r} is not NAME or NAME[key=value,...]", param_hint="--plugin"
        )
    if not bracket:
        return name, {}
    if not rest.endswith("]"):
        raise click.BadParameter(f"{spec!r}: missing the closing ']'", param_hint="--plugin")
    inline: dict[str, str] = {}
    for pair in filter(None, (x.strip() for x in rest[:-1].split(","))):
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise click.BadParameter(f"{spec!r}: {pair!r} is not key=value", param_hint="--plugin")
        inline[key.strip()] = value.strip()
    return name, inline


def _check_inline(variants: Sequence[tuple[str, str, dict[str, str]]]) -> None:
    from selfspec._engine.contract.manager import make_manager
    from selfspec._engine.contract.plugins import declared_options

    for spec, name, inline in variants:
        if inline:
            declared = declared_options(make_manager(name)[0])
            unknown = sorted(set(inline) - set(declared))
            if unknown:
                raise click.BadParameter(
                    f"{spec!r}: {name} has no option(s) {unknown} "
                    f"(it declares: {', '.join(sorted(declared)) or 'none'})",
                    param_hint="--plugin",
                )
