"""A sweep's table: one block of rows per cell, in product order. Each row is one bench cell (concurrency,
category) of that sweep cell's report: steps/s, tok/s, acceptance length and per-position rates, each with its
change against the first finished sweep cell's same bench cell and compare's noise band (bench/compare.py's
cell_change: beyond the rounds' spread in both runs, or within). Beside them the cell's boot: time to /health, the
KV tokens, the graph capture's time and memory (the head's, where its timeline has them). A cell that failed to
boot is a row with its diagnosis: the fatal boot line.

Built from the sweep's state record (sweep/state.py) and the cells' bench documents; pure apart from
`load_reports`, which reads those documents through bench's own contract check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sparkstack.bench.compare import Change, cell_change, read_report, round_range
from sparkstack.bench.report import ROUND_FIGURES
from sparkstack.errors import SparkstackError

MARKS = {True: "*", False: "~", None: "?"}  # compare's: beyond the spread, within it, not judged


@dataclass(frozen=True)
class BootFigures:
    ready_s: float | None  # /health 200, seconds after the head's container started
    kv_tokens: int | None
    graph_s: float | None
    graph_gib: float | None
    run_id: str | None

    def to_json(self) -> dict:
        return {"ready_s": self.ready_s, "kv_tokens": self.kv_tokens, "graph_capture_s": self.graph_s,
                "graph_capture_gib": self.graph_gib, "run_id": self.run_id}


def boot_figures(boot: dict | None, run_id: str | None = None) -> BootFigures | None:
    """A run record's boot document -> the figures the table shows (None: no boot recorded)."""
    if not isinstance(boot, dict):
        return None
    timeline = [t for t in boot.get("timeline") or [] if isinstance(t, dict)]
    head = next((t for t in timeline if t.get("rank") == 0), timeline[0] if timeline else {})
    tokens = next((t["kv_cache_tokens"] for t in timeline if isinstance(t.get("kv_cache_tokens"), int)), None)
    return BootFigures(boot.get("health_s"), tokens, head.get("graph_capture_s"), head.get("graph_capture_gib"), run_id)


@dataclass(frozen=True)
class Row:
    concurrency: int
    category: str
    figures: dict[str, float | None]  # steps_per_s, output_tok_s, acceptance_length
    per_position: tuple[float, ...] | None
    flags: tuple[str, ...]
    changes: dict[str, Change] | None  # against the first finished cell's same bench cell; None for that one
    spreads: dict[str, float | None]  # max - min over the cell's rounds (compare's round_range)

    def to_json(self) -> dict:
        return {"concurrency": self.concurrency, "category": self.category, **self.figures,
                "per_position": None if self.per_position is None else list(self.per_position),
                "flags": list(self.flags), "spreads": self.spreads,
                "changes": None if self.changes is None else {k: v.to_json() for k, v in self.changes.items()}}


@dataclass(frozen=True)
class CellRow:
    index: int
    knobs: tuple[tuple[str, str], ...]
    status: str
    boot: BootFigures | None
    failure: dict | None
    rows: tuple[Row, ...]

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v if v != '' else '(empty)'}" for k, v in self.knobs)

    def to_json(self) -> dict:
        return {"index": self.index, "knobs": dict(self.knobs), "status": self.status,
                "boot": None if self.boot is None else self.boot.to_json(), "failure": self.failure,
                "rows": [r.to_json() for r in self.rows]}


@dataclass(frozen=True)
class SweepReport:
    sweep: str
    recipe: str
    knobs: tuple[str, ...]  # the varied knobs, in --vary order
    salt: str | None
    first: int | None  # the cell the bands are against
    cells: tuple[CellRow, ...]

    def to_json(self) -> dict:
        return {"sweep": self.sweep, "recipe": self.recipe, "knobs": list(self.knobs), "salt": self.salt,
                "against_cell": self.first, "cells": [c.to_json() for c in self.cells]}

    def lines(self) -> list[str]:
        against = "none finished" if self.first is None else f"cell {self.first + 1}"
        head = ["cell", "knobs", "ready", "KV tokens", "graphs", "c", "category", "steps/s", "tok/s", "accept len",
                "per position", "flags"]
        table = [head]
        for c in self.cells:
            boot = c.boot
            left = [str(c.index + 1), c.label,
                    "-" if boot is None or boot.ready_s is None else f"{boot.ready_s:.0f} s",
                    "-" if boot is None or boot.kv_tokens is None else f"{boot.kv_tokens:,}",
                    _graphs(boot)]
            if c.status == "failed":
                f = c.failure or {}
                table.append(left + [f"failed: {f.get('line', '(no fatal line)')}"
                                     + (f" ({f['diagnosis']})" if f.get("diagnosis") else "")])
                continue
            if not c.rows:
                table.append(left + [{"cut": "cut (Ctrl-C)", "pending": "not run"}.get(c.status, c.status)])
                continue
            for n, r in enumerate(c.rows):
                cells = left if n == 0 else [""] * len(left)
                table.append(cells + [str(r.concurrency), r.category, *(_figure(r, name) for name in ROUND_FIGURES_SHOWN),
                                      "-" if r.per_position is None else "/".join(f"{p:.2f}" for p in r.per_position),
                                      " ".join(r.flags) or "-"])
        return [f"sweep {self.sweep} ({self.recipe}): bands against {against} "
                "(* beyond the rounds' spread in both, ~ within, ? not judged)", *_aligned(table)]


ROUND_FIGURES_SHOWN = ("steps_per_s", "output_tok_s", "acceptance_length")
assert set(ROUND_FIGURES_SHOWN) == set(ROUND_FIGURES)


def _aligned(table: list[list[str]]) -> list[str]:
    """Columns padded to the widest full-width entry; a row with fewer entries runs its last one on."""
    n = len(table[0])
    widths = [max((len(row[i]) for row in table if i < len(row) - 1 or len(row) == n), default=0) for i in range(n)]
    out = []
    for row in table:
        cells = [cell.ljust(widths[i]) if i < len(row) - 1 else cell for i, cell in enumerate(row)]
        out.append("  ".join(cells).rstrip())
    return out


def _graphs(boot: BootFigures | None) -> str:
    if boot is None or boot.graph_s is None:
        return "-"
    return f"{boot.graph_s:.0f} s" + ("" if boot.graph_gib is None else f"/{boot.graph_gib:.2f} GiB")


def _figure(row: Row, name: str) -> str:
    value = row.figures.get(name)
    digits = 1 if name == "output_tok_s" else 2
    shown = "-" if value is None else f"{value:.{digits}f}"
    ch = None if row.changes is None else row.changes.get(name)
    if ch is None or ch.change_pct is None:
        return shown
    return f"{shown} ({ch.change_pct:+.1f}% {MARKS[ch.exceeds_spread]})"


def sweep_report(state: dict, reports: Mapping[int, dict]) -> SweepReport:
    """The table of a sweep's record; `reports`: each finished cell's bench document by cell index."""
    cells = sorted(state["cells"], key=lambda c: c["index"])
    finished = [c["index"] for c in cells if c["status"] == "done" and c["index"] in reports]
    first = finished[0] if finished else None
    base = {(b["concurrency"], b["category"]): b for b in reports[first]["cells"]} if first is not None else {}
    out = []
    for c in cells:
        doc = reports.get(c["index"]) if c["status"] == "done" else None
        rows = []
        for b in (doc or {}).get("cells", []):
            key = (b["concurrency"], b["category"])
            changes = None
            if c["index"] != first and key in base:
                changes = cell_change(base[key], b).figures
            rows.append(Row(b["concurrency"], b["category"], {n: b[n] for n in ROUND_FIGURES_SHOWN},
                            None if b["per_position"] is None else tuple(b["per_position"]), tuple(b["flags"]),
                            changes, {n: round_range(b, n) for n in ROUND_FIGURES_SHOWN}))
        out.append(CellRow(c["index"], tuple(c["knobs"].items()), c["status"], boot_figures(c.get("boot"),
                           c.get("run_id")), c.get("failure"), tuple(rows)))
    knobs = tuple(v["knob"] for v in state.get("vary", []))
    return SweepReport(state["sweep"], state["recipe"], knobs, state.get("salt"), first, tuple(out))


def load_reports(state: dict) -> dict[int, dict]:
    """Each done cell's bench document, read through bench's contract check (a missing one is one line)."""
    out = {}
    for c in state["cells"]:
        if c["status"] == "done":
            if not c.get("report"):
                raise SparkstackError(f"sweep {state['sweep']}: cell {c['index'] + 1} is done but names no report")
            out[c["index"]] = read_report(Path(c["report"]))
    return out
