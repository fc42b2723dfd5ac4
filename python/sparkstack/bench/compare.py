"""Two bench JSON documents, cell by cell: the change in each per-round figure, and whether it exceeds the spread
of the rounds within each run (|B - A| greater than max - min of A's rounds and of B's rounds)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

from sparkstack.bench.plan import Settings
from sparkstack.bench.report import RESULTS, ROUND_FIGURES, SPEC_RESULTS
from sparkstack.errors import SparkstackError
from sparkstack.text import printable

MAX_BYTES = 64 << 20
CELL_KEYS = ("concurrency", "category", *RESULTS, "errors", "drafts", "draft_tokens", "accepted_tokens",
             *SPEC_RESULTS, "rounds", "flags")
SETTINGS_KEYS = tuple(f.name for f in fields(Settings))


LARGEST = 1e15  # beyond any figure or counter a bench measures; larger ones would overflow the arithmetic
SETTING_TYPES = {"url": "text", "model": "text or null", "concurrency": "whole numbers", "rounds": "whole",
                 "max_tokens": "whole", "temperature": "number", "top_p": "number", "categories": "texts"}
CELL_TYPES = {"concurrency": "whole", "category": "text", **dict.fromkeys(RESULTS, "number or null"),
              "errors": "whole", **dict.fromkeys(("drafts", "draft_tokens", "accepted_tokens"), "number or null"),
              "acceptance_length": "number or null", "per_position": "numbers or null",
              "steps_per_s": "number or null", "flags": "texts"}


ELEMENT = {"whole numbers": "whole", "numbers": "number or null", "texts": "text"}
WORDS = {"text": "a text", "whole": "a whole number", "number": "a number", "whole numbers": "a list of whole numbers",
         "numbers": "a list of numbers", "texts": "a list of texts"}


def _is(kind: str, v: object) -> bool:
    """Whether `v` is of a contract `kind` (numbers: finite, within LARGEST; never a bool)."""
    if kind.endswith(" or null"):
        return v is None or _is(kind.removesuffix(" or null"), v)
    if kind in ELEMENT:
        return isinstance(v, list) and all(_is(ELEMENT[kind], x) for x in v)
    if kind == "text":
        return isinstance(v, str)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not abs(v) <= LARGEST:
        return False
    return kind == "number" or isinstance(v, int)


def _describe(kind: str) -> str:
    base = kind.removesuffix(" or null")
    words = WORDS[base] + (" or null" if base != kind else "")
    return words + (f" (at most {LARGEST:g})" if base != "text" and base != "texts" else "")


def _finite_or_none(text: str) -> float | None:
    """A JSON float; NaN and the infinities (and literals that overflow to them) read as a withheld figure."""
    v = float(text)
    return v if math.isfinite(v) else None


def read_report(path: Path) -> dict:
    """A bench --json document, checked against the contract; anything else is one clear error. A non-finite
    figure reads as withheld (so it is never judged)."""
    with open(path, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise SparkstackError(f"{path}: larger than {MAX_BYTES >> 20} MiB: not a bench report")
    try:
        doc = json.loads(raw, parse_float=_finite_or_none, parse_constant=lambda _name: None)
    except (ValueError, RecursionError):
        raise SparkstackError(f"{path}: not JSON: not a bench report (sparkstack bench --json)") from None

    def bad(where: str, what: str) -> SparkstackError:
        return SparkstackError(f"{path}: {where}: {what}: not a bench report (sparkstack bench --json)")

    def check_types(where: str, obj: dict, types: dict[str, str]) -> None:
        for key, kind in types.items():
            if not _is(kind, obj[key]):
                raise bad(f"{where}.{key}", f"not {_describe(kind)}")

    if not isinstance(doc, dict) or not isinstance(doc.get("suite_version"), str):
        raise bad("suite_version", "missing or not a string")
    settings = doc.get("settings")
    if not isinstance(settings, dict) or any(k not in settings for k in SETTINGS_KEYS):
        raise bad("settings", f"not an object with {', '.join(SETTINGS_KEYS)}")
    check_types("settings", settings, SETTING_TYPES)
    cells = doc.get("cells")
    if not isinstance(cells, list):
        raise bad("cells", "not a list")
    for i, c in enumerate(cells):
        if not isinstance(c, dict):
            raise bad(f"cells[{i}]", "not an object")
        missing = [k for k in CELL_KEYS if k not in c]
        if missing:
            raise bad(f"cells[{i}]", f"no {missing[0]!r}")
        check_types(f"cells[{i}]", c, CELL_TYPES)
        rounds = c["rounds"]
        if not isinstance(rounds, list) or not all(isinstance(r, dict) and all(_is("number or null", r.get(k))
                                                                                for k in ROUND_FIGURES)
                                                   for r in rounds):
            raise bad(f"cells[{i}].rounds", "not a list of round figures (numbers or null)")
    keys = [(c["concurrency"], c["category"]) for c in cells]
    if len(set(keys)) != len(keys):
        raise bad("cells", "a (concurrency, category) cell twice")
    return doc


@dataclass(frozen=True)
class Change:
    a: float | None
    b: float | None
    spread_a: float | None  # max - min of the run's rounds; None with under two rounds
    spread_b: float | None

    @property
    def change(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def change_pct(self) -> float | None:
        if self.change is None or not self.a:
            return None
        pct = 100 * self.change / self.a
        return pct if math.isfinite(pct) else None  # a change off a figure near 0 is not a percentage

    @property
    def exceeds_spread(self) -> bool | None:
        """None when it cannot be judged: a withheld figure, or a run with under two rounds."""
        if self.change is None or self.spread_a is None or self.spread_b is None:
            return None
        return abs(self.change) > max(self.spread_a, self.spread_b)

    def to_json(self) -> dict:
        return {"a": self.a, "b": self.b, "change": self.change, "change_pct": self.change_pct,
                "spread_a": self.spread_a, "spread_b": self.spread_b, "exceeds_spread": self.exceeds_spread}


def round_range(cell: dict, name: str) -> float | None:
    """max - min of one figure over a cell's rounds (a contract cell); None with under two rounds."""
    xs = [r[name] for r in cell["rounds"] if r.get(name) is not None]
    return max(xs) - min(xs) if len(xs) >= 2 else None


@dataclass(frozen=True)
class CellChange:
    concurrency: int
    category: str
    figures: dict[str, Change]
    flags_a: tuple[str, ...]
    flags_b: tuple[str, ...]

    def to_json(self) -> dict:
        return {"concurrency": self.concurrency, "category": self.category, "flags_a": list(self.flags_a),
                "flags_b": list(self.flags_b), "figures": {k: v.to_json() for k, v in self.figures.items()}}


def cell_change(ca: dict, cb: dict) -> CellChange:
    """Two contract cells of one (concurrency, category): each round figure's change against the rounds' spread."""
    figs = {name: Change(ca[name], cb[name], round_range(ca, name), round_range(cb, name)) for name in ROUND_FIGURES}
    return CellChange(ca["concurrency"], ca["category"], figs, tuple(ca["flags"]), tuple(cb["flags"]))


@dataclass(frozen=True)
class Comparison:
    suite_version: str
    a: tuple[str, dict]  # (path, settings)
    b: tuple[str, dict]
    cells: tuple[CellChange, ...]

    @property
    def settings_differ(self) -> list[str]:
        sa, sb = self.a[1], self.b[1]
        return [f"{k} {sa[k]} -> {sb[k]}" for k in SETTINGS_KEYS if k != "url" and sa[k] != sb[k]]

    def to_json(self) -> dict:
        return {"suite_version": self.suite_version,
                "a": {"path": self.a[0], "settings": self.a[1]}, "b": {"path": self.b[0], "settings": self.b[1]},
                "settings_differ": self.settings_differ, "cells": [c.to_json() for c in self.cells]}


def compare(path_a: Path, path_b: Path) -> Comparison:
    a, b = read_report(path_a), read_report(path_b)
    if a["suite_version"] != b["suite_version"]:
        raise SparkstackError(f"suite versions differ ({path_a}: v{a['suite_version']}, {path_b}: "
                              f"v{b['suite_version']}): their prompts differ, so their figures do not compare")
    cells_a = {(c["concurrency"], c["category"]): c for c in a["cells"]}
    cells_b = {(c["concurrency"], c["category"]): c for c in b["cells"]}
    if list(cells_a) != list(cells_b):
        only = sorted(set(cells_a) ^ set(cells_b))
        what = f"c={only[0][0]} {only[0][1]} is in one only" if only else "the cells are in another order"
        raise SparkstackError(f"the runs have different shapes ({len(cells_a)} and {len(cells_b)} cells; {what}): "
                              "bench both with the same --concurrency and --category")
    changes = [cell_change(ca, cells_b[key]) for key, ca in cells_a.items()]
    return Comparison(a["suite_version"], (str(path_a), a["settings"]), (str(path_b), b["settings"]), tuple(changes))


def _fmt(v: float | None, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def table(cmp: Comparison):
    from rich.markup import escape
    from rich.table import Table

    # everything from the files (paths, categories, flags) is text, not markup
    t = Table(title=escape(printable(f"sparkstack compare · suite v{cmp.suite_version} · A {cmp.a[0]} → B {cmp.b[0]}")),
              caption="* beyond the rounds' spread (max - min) in both runs · ~ within · ? not judged")
    for head in ("conc", "category", "tok/s A → B", "change", "accept len A → B", "change", "steps/s A → B",
                 "change", "flags A / B"):
        t.add_column(head, justify="left" if head in ("category", "flags A / B") else "right")
    digits = {"output_tok_s": 1, "acceptance_length": 2, "steps_per_s": 2}
    for c in cmp.cells:
        row = [str(c.concurrency), escape(printable(c.category))]
        for name in ROUND_FIGURES:
            ch = c.figures[name]
            row.append(f"{_fmt(ch.a, digits[name])} → {_fmt(ch.b, digits[name])}")
            mark = {True: "*", False: "~", None: "?"}[ch.exceeds_spread]
            pct = "-" if ch.change_pct is None else f"{ch.change_pct:+.1f}%"
            row.append(f"[bold]{pct} {mark}[/bold]" if ch.exceeds_spread else f"{pct} {mark}")
        row.append(escape(printable(f"{' '.join(map(str, c.flags_a)) or '-'} / {' '.join(map(str, c.flags_b)) or '-'}")))
        t.add_row(*row)
    return t
