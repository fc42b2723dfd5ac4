"""The published figures as a reference: `reference.toml` beside a recipe (recipes/<name>/reference.toml, reached as
the recipe is), loaded and checked, and a bench report (the JSON contract of bench/report.py) set beside it.

The blog's advice is kept: steps/s ("what the kit delivers") and acceptance ("what your content allows") are shown
apart, and tok/s, their product, after them. Only the `count` category is judged: counting 1..1000 is content the
drafter should accept almost whole, so its ceiling is where a drafter or parser regression shows first. Every other
figure stands beside ours, unjudged: our prompts are not the blog's traffic.

A figure is compared only under its own conditions: the speculative block length n, CUDA graphs or eager, and the
sampling temperature. Ours come from the caller (the deployment's knobs: NUM_SPEC_TOKENS, EAGER) or, for n, from
the report's per-position rates (one rate per drafted position); a figure whose conditions differ from ours is
shown as such, never judged.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sparkstack.bench.compare import round_range
from sparkstack.errors import SparkstackError
from sparkstack.recipe import find_recipe

REFERENCE_FILE = "reference.toml"
FIGURES = ("steps_per_s", "acceptance_length", "per_position", "output_tok_s", "kv_tokens")
REAL_TRAFFIC = "real traffic"  # the blog's own use; any suite category but count stands beside it
COUNT = "count"
JUDGES = ("at_least",)
_TOP = {"version": int, "recipe": str, "title": str, "measured_on": str, "temperature": float, "top_p": float,
        "figures": list}
_FIGURE = {"figure": str, "value": float, "values": list, "low": float, "high": float, "approx": bool, "n": int,
           "graphs": bool, "concurrency": int, "category": str, "kv_bytes": int, "gpu_memory_utilization": float,
           "judge": str, "tolerance": float, "source": str, "note": str}
# Where each figure sits in the report's cells: steps/s and tok/s per stream (the blog's tok/s is one stream's).
CELL_FIGURE = {"steps_per_s": "steps_per_s", "acceptance_length": "acceptance_length", "per_position": "per_position",
               "output_tok_s": "per_stream_tok_s"}
SECTIONS = (
    ("kit", "what the kit delivers (decode steps/s of one stream)", ("steps_per_s",)),
    ("content", "what your content allows (acceptance length; per-position acceptance)",
     ("acceptance_length", "per_position")),
    ("product", "their product (tok/s of one stream = steps/s x acceptance length)", ("output_tok_s",)),
)


@dataclass(frozen=True)
class Figure:
    figure: str
    source: str
    value: float | None = None
    values: tuple[float, ...] | None = None  # per_position
    low: float | None = None
    high: float | None = None
    approx: bool = False
    n: int | None = None
    graphs: bool | None = None
    concurrency: int | None = None
    category: str | None = None
    kv_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    judge: str | None = None
    tolerance: float | None = None
    note: str | None = None

    def conditions(self) -> str:
        parts = [f"n={self.n}" if self.n is not None else "",
                 "" if self.graphs is None else ("CUDA graphs" if self.graphs else "eager"),
                 f"c={self.concurrency}" if self.concurrency is not None else "",
                 self.category or "",
                 f"pin {self.kv_bytes:,} B" if self.kv_bytes is not None else "",
                 f"gpu-memory-utilization {self.gpu_memory_utilization:g}" if self.gpu_memory_utilization else ""]
        return ", ".join(p for p in parts if p)

    def shown(self) -> str:
        """The figure as the source gives it."""
        if self.values is not None:
            return "/".join(_fmt(v, 2) for v in self.values)
        around = "~" if self.approx else ""
        if self.value is not None:
            extra = f" ({_fmt(self.low, 1)}-{_fmt(self.high, 1)} at peak)" if self.low is not None else ""
            return f"{around}{self.value:,g}{extra}"
        return f"{_fmt(self.low, 1)}-{_fmt(self.high, 1)}"

    def to_json(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class Reference:
    path: Path
    recipe: str
    title: str
    measured_on: str
    temperature: float | None
    top_p: float | None
    figures: tuple[Figure, ...]

    def to_json(self) -> dict:
        return {"path": str(self.path), "recipe": self.recipe, "title": self.title, "measured_on": self.measured_on,
                "temperature": self.temperature, "top_p": self.top_p, "figures": [f.to_json() for f in self.figures]}


def _fmt(v: float | None, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _typed(where: str, table: dict, schema: dict) -> None:
    for key, value in table.items():
        if key not in schema:
            raise SparkstackError(f"{where}: unknown key {key!r}")
        want = schema[key]
        ok = isinstance(value, (int, float) if want is float else want) and not (
            want in (int, float) and isinstance(value, bool))
        if ok and want is float and not math.isfinite(value):
            ok = False
        if not ok:
            raise SparkstackError(f"{where}: {key} must be {want.__name__ if want is not float else 'a number'}, "
                                  f"got {value!r:.40}")


def _figure(where: str, raw: object) -> Figure:
    if not isinstance(raw, dict):
        raise SparkstackError(f"{where}: must be a table")
    _typed(where, raw, _FIGURE)
    for key in ("figure", "source"):
        if key not in raw:
            raise SparkstackError(f"{where}: missing key {key!r}")
    kind = raw["figure"]
    if kind not in FIGURES:
        raise SparkstackError(f"{where}: figure {kind!r} is not one of {', '.join(FIGURES)}")
    where = f"{where} ({kind})"
    values = raw.get("values")
    if ("low" in raw) != ("high" in raw) or ("low" in raw and raw["low"] > raw["high"]):
        raise SparkstackError(f"{where}: low and high come together, low <= high")
    if kind == "per_position":
        if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1
                                 for v in values):
            raise SparkstackError(f"{where}: values must be a list of rates from 0 to 1")
        if any(b > a for a, b in zip(values, values[1:])):
            raise SparkstackError(f"{where}: values rise with the position; per-position rates never do")
        if "n" in raw and raw["n"] != len(values):
            raise SparkstackError(f"{where}: {len(values)} values for n={raw['n']}: one rate per drafted position")
    elif values is not None:
        raise SparkstackError(f"{where}: values is for per_position only")
    elif "value" not in raw and not ("low" in raw and "high" in raw):
        raise SparkstackError(f"{where}: needs a value, or low and high")
    for key in ("value", "low", "high", "tolerance"):
        if key in raw and raw[key] < 0:
            raise SparkstackError(f"{where}: {key} must not be negative")
    if "n" in raw and raw["n"] < 1:
        raise SparkstackError(f"{where}: n must be at least 1")
    judge = raw.get("judge")
    if judge is not None:
        if judge not in JUDGES:
            raise SparkstackError(f"{where}: judge {judge!r} is not one of {', '.join(JUDGES)}")
        if "tolerance" not in raw:
            raise SparkstackError(f"{where}: a judged figure needs its tolerance")
        if raw.get("category") != COUNT or kind not in ("acceptance_length", "per_position"):
            raise SparkstackError(f"{where}: only the count category's acceptance is judged")
    if kind == "kv_tokens" and ("value" not in raw or not float(raw["value"]).is_integer()):
        raise SparkstackError(f"{where}: value must be a whole number of tokens")
    fields = dict(raw)
    fields["values"] = tuple(float(v) for v in values) if values is not None else None
    for key in ("value", "low", "high", "tolerance", "gpu_memory_utilization"):
        if key in fields:
            fields[key] = float(fields[key])
    return Figure(**fields)


def load_reference(path: Path) -> Reference:
    """A reference file, checked; anything wrong in it is one line naming the file and the place."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as exc:
        raise SparkstackError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SparkstackError(f"{path}: not UTF-8 text") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SparkstackError(f"{path}: not valid TOML ({exc})") from None
    _typed(str(path), doc, _TOP)
    if doc.get("version") != 1:
        raise SparkstackError(f"{path}: version must be 1, got {doc.get('version')!r}")
    for key in ("recipe", "title", "figures"):
        if key not in doc:
            raise SparkstackError(f"{path}: missing key {key!r}")
    figures = tuple(_figure(f"{path} [[figures]] #{i + 1}", f) for i, f in enumerate(doc["figures"]))
    if not figures:
        raise SparkstackError(f"{path}: no [[figures]]")
    return Reference(path, doc["recipe"], doc["title"], doc.get("measured_on", ""),
                     float(doc["temperature"]) if "temperature" in doc else None,
                     float(doc["top_p"]) if "top_p" in doc else None, figures)


def reference_path(recipe_path: Path) -> Path:
    return recipe_path.parent / REFERENCE_FILE


def find_reference(recipe: str | None) -> Reference:
    """The reference beside a recipe (by name or path, as --recipe names it)."""
    path = reference_path(find_recipe(recipe))
    if not path.is_file():
        raise SparkstackError(f"recipe {recipe or path.parent.name}: no {REFERENCE_FILE} beside {path.parent}: "
                              "nothing to compare against")
    return load_reference(path)


# ---------------------------------------------------------------- the comparison


@dataclass(frozen=True)
class Served:
    """What our run served under: None where it is not known."""

    n: int | None = None
    graphs: bool | None = None
    n_from: str = "unknown"  # "knobs" or "per_position"

    def to_json(self) -> dict:
        return {"n": self.n, "graphs": self.graphs, "n_from": self.n_from}


def served_from_knobs(knobs) -> Served:
    """NUM_SPEC_TOKENS and EAGER, as the deployment resolved them: deploy's Knobs (`deployment.knobs`) or a mapping."""
    values = knobs if isinstance(knobs, Mapping) else knobs.values
    n = values.get("NUM_SPEC_TOKENS")
    eager = values.get("EAGER")
    return Served(int(n) if n and n.isdigit() else None, None if eager is None else eager != "1",
                  "knobs" if n and n.isdigit() else "unknown")


def _served(doc: dict, served: Served) -> Served:
    if served.n is not None:
        return served
    widths = {len(c["per_position"]) for c in doc["cells"] if c.get("per_position")}
    if len(widths) == 1:
        return Served(widths.pop(), served.graphs, "per_position")
    return served


@dataclass(frozen=True)
class Row:
    section: str  # kit, content, product, count, kv
    figure: Figure
    cell: str | None  # "c=1 code"; None: no cell of the report stands beside it
    ours: float | tuple[float, ...] | None
    spread: float | None  # max - min over the cell's rounds
    status: str  # ok, below (judged); shown; differs (conditions); withheld (flagged cell); absent
    detail: str

    def to_json(self) -> dict:
        return {"section": self.section, "figure": self.figure.to_json(), "cell": self.cell,
                "ours": list(self.ours) if isinstance(self.ours, tuple) else self.ours, "spread": self.spread,
                "status": self.status, "detail": self.detail}

    def line(self) -> str:
        f = self.figure
        ours = ("-" if self.ours is None else "/".join(_fmt(v, 2) for v in self.ours) if isinstance(self.ours, tuple)
                else f"{self.ours:,.2f}" if f.figure != "kv_tokens" else f"{self.ours:,.0f}")
        spread = f" (rounds spread {self.spread:.2f})" if self.spread is not None else ""
        where = self.cell or "-"
        return (f"  {self.status:<8} {where}: {f.figure} {ours}{spread} vs {f.shown()} "
                f"[{f.conditions()}; {f.source}]" + (f": {self.detail}" if self.detail else ""))


@dataclass(frozen=True)
class ReferenceComparison:
    reference: Reference
    served: Served
    temperature: float | None  # the report's
    rows: tuple[Row, ...]

    @property
    def failed(self) -> tuple[Row, ...]:
        """The judged rows that did not reach their ceiling (a flagged count cell among them)."""
        return tuple(r for r in self.rows if r.figure.judge is not None and r.status in ("below", "withheld"))

    def verdict(self) -> str:
        """'' when the count ceiling holds (or could not be judged); else one line."""
        if not self.failed:
            return ""
        first = self.failed[0]
        return (f"the count category is below its ceiling ({len(self.failed)} figure(s); first: {first.cell} "
                f"{first.figure.figure}: {first.detail}): a drafter or parser regression shows here first")

    def to_json(self) -> dict:
        return {"reference": self.reference.to_json(), "served": self.served.to_json(),
                "temperature": self.temperature, "rows": [r.to_json() for r in self.rows], "verdict": self.verdict()}

    def lines(self) -> list[str]:
        ref, s = self.reference, self.served
        lines = [f"reference: {ref.title} ({ref.path}); {ref.measured_on}"]
        n = "n unknown" if s.n is None else f"n={s.n} (from {'the knobs' if s.n_from == 'knobs' else 'per-position rates'})"
        graphs = "graphs unknown" if s.graphs is None else "CUDA graphs" if s.graphs else "eager"
        lines.append(f"ours: {n}, {graphs}, temperature {self.temperature}"
                     + (f" (the reference's: {ref.temperature}; another temperature moves acceptance, so nothing "
                        "is judged)" if self._temperature_differs() else ""))
        titles = {key: title for key, title, _ in SECTIONS} | {
            COUNT: "the count ceiling (judged: a drafter or parser regression shows here first)",
            "kv": "the KV pool (the boot's `KV cache size`)"}
        for key in (*(k for k, _, _ in SECTIONS), COUNT, "kv"):
            rows = [r for r in self.rows if r.section == key]
            if rows:
                lines.append(titles[key] + ":")
                lines += [r.line() for r in rows]
        verdict = self.verdict()
        lines.append(f"verdict: {verdict}" if verdict else "verdict: the count ceiling holds" if any(
            r.figure.judge is not None and r.status == "ok" for r in self.rows) else "verdict: nothing judged")
        return lines

    def _temperature_differs(self) -> bool:
        t = self.reference.temperature
        return t is not None and self.temperature is not None and not math.isclose(t, self.temperature)


def _section(f: Figure) -> str:
    if f.figure == "kv_tokens":
        return "kv"
    if f.judge is not None or (f.category == COUNT and f.figure != "steps_per_s"):
        return COUNT
    return next(key for key, _, figures in SECTIONS if f.figure in figures)


def _cells_for(f: Figure, cells: list[dict]) -> tuple[list[dict], str]:
    """The report's cells that stand beside a figure, and a note on how they were chosen."""
    if f.category == REAL_TRAFFIC:
        chosen = [c for c in cells if c["category"] != COUNT]
    else:
        chosen = [c for c in cells if c["category"] == f.category]
    if f.concurrency is not None:
        return [c for c in chosen if c["concurrency"] == f.concurrency], ""
    if not chosen:
        return [], ""
    low = min(c["concurrency"] for c in chosen)
    note = f"the source states no concurrency: ours at c={low}, the report's lowest" if low != 1 else ""
    return [c for c in chosen if c["concurrency"] == low], note


def _differs(f: Figure, served: Served, temp_differs: bool) -> str:
    why = []
    if f.n is not None and served.n is not None and f.n != served.n:
        why.append(f"measured at n={f.n}, ours n={served.n}")
    if f.graphs is not None and served.graphs is not None and f.graphs != served.graphs:
        why.append(f"measured {'with CUDA graphs' if f.graphs else 'eager'}, ours "
                   f"{'with CUDA graphs' if served.graphs else 'eager'}")
    if temp_differs and f.figure != "steps_per_s":
        why.append("another sampling temperature")
    return "; ".join(why)


def _judge(f: Figure, ours: float | tuple[float, ...]) -> tuple[str, str]:
    tol = f.tolerance or 0.0
    if f.values is not None:
        if len(ours) != len(f.values):
            return "differs", f"{len(ours)} positions against the ceiling's {len(f.values)}"
        for i, (o, ceiling) in enumerate(zip(ours, f.values)):
            if o < ceiling - tol:
                return "below", f"position {i + 1}: {o:.3f} < {ceiling:.3f} - {tol:g}"
        return "ok", f"every position within {tol:g} of its ceiling"
    if ours < f.value - tol:
        return "below", f"{ours:.3f} < {f.value:g} - {tol:g}"
    return "ok", f"within {tol:g} of {f.value:g}"


def _kv_row(f: Figure, tokens: int | None, kv_bytes: int | None, pool: str | None) -> Row:
    if tokens is None:
        return Row("kv", f, None, None, None, "absent", "no boot measured here (plan kv --from-boot)")
    if f.kv_bytes is not None and (pool != "pin" or kv_bytes != f.kv_bytes):
        ours = f"pin {kv_bytes:,} B" if pool == "pin" and kv_bytes is not None else "no pin"
        return Row("kv", f, None, tokens, None, "differs", f"measured at the pin {f.kv_bytes:,} B, ours {ours}")
    if f.kv_bytes is None and pool == "pin":
        return Row("kv", f, None, tokens, None, "differs", "measured without a pin, ours pinned")
    return Row("kv", f, None, tokens, None, "shown", f"{tokens / f.value:.3f}x")


def compare_reference(doc: dict, reference: Reference, served: Served = Served(), kv_tokens: int | None = None,
                      kv_bytes: int | None = None, kv_pool: str | None = None) -> ReferenceComparison:
    """A bench report document beside the reference. `served`: what the deployment served (served_from_knobs);
    `kv_tokens`, `kv_bytes`, `kv_pool`: the boot's measured KV pool (launch/calibrate.py's BootMeasure: tokens,
    pool_bytes, pool "pin" or "profiled"), if known: a KV figure stands beside it under the same pin only."""
    served = _served(doc, served)
    temperature = doc["settings"].get("temperature")
    ref_t = reference.temperature
    temp_differs = ref_t is not None and temperature is not None and not math.isclose(ref_t, temperature)
    rows = []
    for f in reference.figures:
        section = _section(f)
        if f.figure == "kv_tokens":
            rows.append(_kv_row(f, kv_tokens, kv_bytes, kv_pool))
            continue
        cells, note = _cells_for(f, doc["cells"])
        if not cells:
            rows.append(Row(section, f, None, None, None, "absent", f"the report has no {f.category} cell"))
            continue
        differs = _differs(f, served, temp_differs)
        for c in cells:
            name = f"c={c['concurrency']} {c['category']}"
            raw = c[CELL_FIGURE[f.figure]]
            ours = tuple(raw) if isinstance(raw, list) else raw
            spread = round_range(c, f.figure) if f.figure in ("steps_per_s", "acceptance_length") else None
            if ours is None:
                why = f"flagged {' '.join(c['flags'])}" if c["flags"] else "withheld by the bench"
                rows.append(Row(section, f, name, None, None, "withheld", why))
                continue
            if differs:
                status, detail = "differs", differs
            elif f.judge is not None:
                status, detail = _judge(f, ours)
            else:
                status, detail = "shown", _ratio(f, ours)
            rows.append(Row(section, f, name, ours, spread, status, "; ".join(x for x in (detail, note) if x)))
    return ReferenceComparison(reference, served, temperature, tuple(rows))


def _ratio(f: Figure, ours: float | tuple[float, ...]) -> str:
    if isinstance(ours, tuple) or f.values is not None:
        return ""
    if f.value:
        return f"{ours / f.value:.2f}x"
    if f.low is not None:
        return "within" if f.low <= ours <= f.high else "below" if ours < f.low else "above"
    return ""
