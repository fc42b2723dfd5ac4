"""A sweep's table as a picture (matplotlib, Agg, through bench/plot.py's helpers): the knob values along x,
steps/s per stream in one panel and acceptance length in the other, one line per bench cell (concurrency,
category), the rounds' spread as a bar. One varied knob with numeric values is a numeric axis (n=2, 4, 7 spaced as
numbers); otherwise each cell is a tick labelled with its knob values. A failed cell is a red cross on the axis,
named in the title; flagged (withheld) figures are gaps, never results."""

from __future__ import annotations

import re
from pathlib import Path

from sparkstack import fsio
from sparkstack.bench.plot import agg_figure, check_destination, figure_png
from sparkstack.errors import SparkstackError
from sparkstack.sweep.report import SweepReport
from sparkstack.text import printable

COMMAND = "sparkstack sweep"
PANELS = (("steps_per_s", "steps/s per stream (what the kit delivers)", "steps/s"),
          ("acceptance_length", "acceptance length (what your content allows)", "tokens per step"))
_NUMBER = re.compile(r"[0-9]{1,12}(\.[0-9]{1,12})?")


def x_positions(report: SweepReport) -> tuple[dict[int, float], list[float], list[str], str]:
    """Each cell's x, the ticks and their labels, and the axis title."""
    cells = report.cells
    if len(report.knobs) == 1 and cells and all(_NUMBER.fullmatch(c.knobs[0][1]) for c in cells):
        xs = {c.index: float(c.knobs[0][1]) for c in cells}
        ticks = sorted(set(xs.values()))
        return xs, ticks, [f"{t:g}" for t in ticks], report.knobs[0]
    xs = {c.index: float(n) for n, c in enumerate(cells)}
    labels = ["\n".join(f"{k}={v if v != '' else '(empty)'}" for k, v in c.knobs) for c in cells]
    return xs, list(xs.values()), labels, "cell"


def render_png(report: SweepReport) -> bytes:
    xs, ticks, labels, xlabel = x_positions(report)
    fig = agg_figure(figsize=(13, 5), dpi=100, layout="constrained")
    axes = fig.subplots(1, 2)
    series: dict[tuple[int, str], list] = {}
    for c in report.cells:
        for r in c.rows:
            series.setdefault((r.concurrency, r.category), []).append((c.index, r))
    failed = [c for c in report.cells if c.status == "failed"]
    for ax, (name, title, ylabel) in zip(axes, PANELS):
        for (conc, cat), points in sorted(series.items()):
            points = sorted(points, key=lambda p: xs[p[0]])
            x = [xs[i] for i, _ in points]
            y = [r.figures[name] for _, r in points]
            y = [float("nan") if v is None else v for v in y]
            line, = ax.plot(x, y, marker="o", label=f"c={conc} {cat}")
            for (i, r), v in zip(points, y):
                spread = r.spreads.get(name)
                if spread is not None and v == v:
                    ax.vlines(xs[i], v - spread / 2, v + spread / 2, color=line.get_color(), alpha=0.5)
        for c in failed:
            ax.plot([xs[c.index]], [0], marker="x", color="red", markersize=10, linestyle="none", clip_on=False)
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        ax.set_xticks(ticks, labels, fontsize="small")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    if series:
        axes[0].legend(fontsize="small")
    title = f"sparkstack sweep {report.sweep} · {report.recipe} · salt {report.salt}"
    if failed:
        title += "\nfailed to boot (x): " + ", ".join(f"cell {c.index + 1} ({c.label})" for c in failed)
    fig.suptitle(title.replace("$", r"\$"), fontsize="medium")
    return figure_png(fig, COMMAND)


def check_plot(path: Path) -> None:
    """Before the sweep: the picture is a .png, its path is writable, and it replaces only a picture sweep drew."""
    if path.suffix.lower() != ".png":
        raise SparkstackError(f"--plot {printable(str(path))}: the picture is a PNG: name it *.png")
    check_destination(path, COMMAND)


def write_plot(report: SweepReport, path: Path) -> None:
    fsio.write_atomic(path, render_png(report))
