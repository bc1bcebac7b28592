"""PNG plots (matplotlib, Agg backend, imported only when a plot is drawn)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from selfspec._engine.tuning.machine import capability_note, plural


def format_params(n: float) -> str:
    """``134_515_008`` -> ``"135M"``, ``494e6`` -> ``"0.5B"``, ``1.54e9`` -> ``"1.5B"``."""
    return f"{n / 1e6:.0f}M" if n < 3e8 else f"{n / 1e9:.1f}B"


def _plt() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("plots need matplotlib: pip install 'selfspec[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def speedup_bars(summary: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Grouped bars: one group per task (and ``all``), one bar per method, speedup on y."""
    plt = _plt()
    rows = summary["rows"]
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    by = {(r["task"], r["method"]): r for r in rows}
    width = 0.8 / max(1, len(methods))
    fig, ax = plt.subplots(
        figsize=(min(14.0, max(7.0, 0.35 * len(tasks) * max(1, len(methods)) + 2)), 5.0)
    )
    styles = bar_styles(len(methods))
    for j, m in enumerate(methods):
        xs, ys = [], []
        for i, t in enumerate(tasks):
            r = by.get((t, m))
            if r is not None and r["speedup"] is not None:
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(r["speedup"])
        color, hatch = styles[j]
        bars = ax.bar(xs, ys, width, label=m, color=color, hatch=hatch)
        for b, y in zip(bars, ys):
            ax.annotate(
                f"{y:.2f}",
                (b.get_x() + b.get_width() / 2, y),
                ha="center",
                va="bottom",
                fontsize=7,
                xytext=(0, 1),
                textcoords="offset points",
            )
        for i, t in enumerate(tasks):  # mark divergences in red above the bar
            r = by.get((t, m))
            if r is not None and r["divergences"]:
                ax.annotate(
                    "✗",
                    (i - 0.4 + width * (j + 0.5), (r["speedup"] or 0) + 0.08),
                    ha="center",
                    color="red",
                )
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks(range(len(tasks)), tasks)
    ax.set_ylabel(f"speedup over {summary.get('baseline', 'hf')} (×)")
    ax.set_title(plot_title(summary, "Speedup"), fontsize=9)
    ax.legend(fontsize=8, ncol=min(4, len(methods)), loc="upper left", bbox_to_anchor=(0, -0.08))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def bar_styles(n: int) -> list[tuple[tuple[float, ...], str]]:
    """``n`` distinct ``(colour, hatch)`` pairs: tab10 up to ten bars, tab20 up to twenty, then
    tab20 again with hatches (up to 80), so no two methods of one plot look alike."""
    plt = _plt()
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    hatches = ["", "//", "..", "xx"]
    return [(tuple(cmap(j % cmap.N)), hatches[(j // cmap.N) % len(hatches)]) for j in range(n)]


def sweep_plot(sweep: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """A heatmap of speedup over the 2-D grid, or bars for a 1-D grid."""
    plt = _plt()
    axes = sweep["axes"]
    cells = {tuple(c["point"]): c for c in sweep["cells"]}
    title = plot_title(
        sweep, f"Sweep of {sweep['plugin']}, speedup over {sweep.get('baseline', 'vanilla')}"
    )
    if len(axes) == 2:
        (n1, v1), (n2, v2) = axes
        grid = [[(cells.get((a, b)) or {}).get("speedup") or float("nan") for b in v2] for a in v1]
        fig, ax = plt.subplots(figsize=(1.1 * len(v2) + 3, 0.8 * len(v1) + 2.2))
        im = ax.imshow(grid, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(v2)), [str(v) for v in v2])
        ax.set_yticks(range(len(v1)), [str(v) for v in v1])
        ax.set_xlabel(n2)
        ax.set_ylabel(n1)
        finite = [x for row in grid for x in row if x == x]
        mid = (max(finite) + min(finite)) / 2 if finite else 0
        for i, row in enumerate(grid):
            for j, x in enumerate(row):
                if x == x:
                    bad = (cells.get((v1[i], v2[j])) or {}).get("divergences")
                    ax.text(
                        j,
                        i,
                        f"{x:.2f}" + (" ✗" if bad else ""),
                        ha="center",
                        va="center",
                        fontsize=8,
                        color="black" if x > mid else "white",
                    )
        fig.colorbar(im, ax=ax, label="speedup (×)")
    else:
        name, values = axes[0] if axes else ("config", [()])
        ys = [(cells.get((v,) if axes else ()) or {}).get("speedup") or 0.0 for v in values]
        fig, ax = plt.subplots(figsize=(max(5.0, 0.8 * len(values) + 2), 4))
        ax.bar([str(v) for v in values], ys, color="tab:blue")
        for i, y in enumerate(ys):
            ax.annotate(f"{y:.2f}", (i, y), ha="center", va="bottom", fontsize=8)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xlabel(name)
        ax.set_ylabel("speedup (×)")
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def scaling_plot(table: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Two panels over model size (parameters, log scale): geo-mean speedup over HF greedy on the
    left, τ on the right; one line per method (a :func:`scaling.scaling_table`)."""

    plt = _plt()
    models, methods = table["models"], table["methods"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.0, 5.0))
    styles = bar_styles(len(methods))
    markers = "osD^v<>ph*"
    for j, (label, entries) in enumerate(methods.items()):
        color = styles[j][0]
        ls = ["-", "--", ":", "-."][(j // 10) % 4]
        for ax, key in ((left, "speedup"), (right, "tau")):
            pts = [(e["params"], e[key]) for e in entries if e[key] is not None]
            if pts:
                ax.plot(
                    *zip(*pts), marker=markers[j % len(markers)], color=color, ls=ls, label=label
                )
    left.axhline(1.0, color="black", lw=0.8, ls="--")
    ticks = [m["params"] for m in models]
    for ax, ylabel in (
        (left, "geo-mean speedup over HF greedy (×)"),
        (right, "τ (tokens per full-model forward)"),
    ):
        ax.set_xscale("log")
        ax.set_xticks(ticks, [format_params(x) for x in ticks])
        ax.minorticks_off()
        ax.set_xlabel("model parameters")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    big = models[-1]
    fig.suptitle(
        f"Scaling across model sizes: {', '.join(m['name'] for m in models)}\n"
        f"{big['cpu']}, {big['dtype']}, max {big['max_new_tokens']} new tokens",
        fontsize=9,
    )
    right.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_title(summary: dict[str, Any], what: str) -> str:
    cfg, mach = summary.get("config", {}), summary.get("machine", {})
    model = Path(str(cfg.get("model", "?"))).name or str(cfg.get("model"))
    return (
        f"{what}: {model}, {cfg.get('dtype', '?')}, "
        f"max {cfg.get('max_new_tokens', '?')} new tokens\n"
        f"{mach.get('cpu', '?')}{capability_note(mach)}, "
        f"{plural(mach.get('torch_threads', '?'), 'thread')}, "
        f"{mach.get('date', '?')}"
    )
