"""`sparkstack sweep`'s plan: the knobs to vary, every cell of their product in the order that boots least, each
cell's exact knob values, its boot identity, its content key for resume, and its estimated time.

Knob values enter as the environment does (deploy's precedence: built-in default < recipe < --image <
environment), so a cell is exactly "the recipe as it stands here, with these knobs set": `cell_environ`.

How many boots. Every knob changes the launch plan's argv (an engine flag, a docker option or a container
variable), so every cell needs a boot of its own, with two exceptions, both decided on the boot identity
(`launch.apply.boot_id`: the image's ID, the served revisions and every rank's planned docker argv, the same hash
a run record is named by):

- cells whose identities are equal boot the same thing (a knob this recipe ignores, values vLLM reads alike):
  they run one after the other on one boot, each benched on its own (a second bench of one boot costs minutes,
  and measures the noise the first cell's bands stand for);
- a cell equal to what serves now (the latest run record's id, its pair healthy: the apply checks both) needs no
  boot: its group runs first.

A resumed sweep keeps the cells an earlier run finished (its record's content keys): they neither boot nor count
in the estimate, and the cell after one runs on what the cell before it left serving.

At the end the sweep relaunches the recipe as it stands (the baseline), unless told to leave the last cell up:
so a group equal to the baseline runs last, and the final relaunch is then free. Between groups the order is the
order of the product (the first --vary knob changes slowest), so a table reads as the user wrote the sweep.

Pure: the launch plans are made by the caller (`launch_cells`, which reads the recipe and the local hub's refs
as every plan does) and handed in as `CellLaunch` data.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from sparkstack.errors import UsageError
from sparkstack.launch.apply import boot_id
from sparkstack.launch.plan import LaunchPlan, plan_launch_from_recipe
from sparkstack.recipe import KNOB_DEFAULTS, KNOB_KINDS, Recipe, meaning
from sparkstack.text import quoted as show

MAX_CELLS = 64  # at about 15 minutes a boot, 64 cells are 16 hours
DEFAULT_BOOT_S = 900.0  # a cold boot of the pair takes about 15 minutes on the Sparks
WORKER_LEAD_S = 20.0  # the worker starts first, about 20 s before the head (a record's health_s counts from the head)

# Knobs that say where and how the pair is reached, not how it serves: a sweep that varied them would lose the pair
# it is measuring, or measure nothing new.
NOT_SWEPT = {
    "NAME": "it names the containers stop and status find",
    "API_PORT": "it is where bench and /health reach the pair",
    "SERVED_NAME": "it is the model name bench asks for",
    "WORKER_SSH": "it says how the worker is reached, not how it serves",
    "MASTER_ADDR": "it is the rendezvous address of the ranks",
    "MASTER_PORT": "it is the rendezvous port of the ranks",
    "CX_NIC": "it names the fabric's network interface",
    "CX_HCA": "it names the fabric's RDMA device",
    "HF_HOME": "it says where the weights are, not which",
}


@dataclass(frozen=True)
class Vary:
    knob: str
    values: tuple[str, ...]

    def to_json(self) -> dict:
        return {"knob": self.knob, "values": list(self.values)}


def parse_vary(specs: Sequence[str]) -> tuple[Vary, ...]:
    """`--vary KNOB=V1,V2,...` options, checked: a knob of the recipe tables (recipe.KNOB_KINDS), each value of its
    kind (an empty value where the knob gives it a meaning: KV_CACHE_MEMORY= drops the pin). One line per mistake."""
    if not specs:
        raise UsageError("sweep needs at least one --vary KNOB=V1,V2,...")
    out: list[Vary] = []
    for spec in specs:
        knob, eq, values = spec.partition("=")
        if not eq:
            raise UsageError(f"--vary {show(spec)}: expected KNOB=V1,V2,... (e.g. NUM_SPEC_TOKENS=2,3,4)")
        if knob not in KNOB_KINDS:
            near = difflib.get_close_matches(knob.upper(), list(KNOB_KINDS), n=1)
            hint = f" (did you mean {near[0]}?)" if near else \
                f"; the knobs a sweep varies: {', '.join(k for k in KNOB_DEFAULTS if k not in NOT_SWEPT)}"
            raise UsageError(f"--vary {show(knob)}: not a knob{hint}")
        if knob in NOT_SWEPT:
            raise UsageError(f"--vary {knob}: not swept: {NOT_SWEPT[knob]}")
        if any(v.knob == knob for v in out):
            raise UsageError(f"--vary {knob} is given twice: list its values in one --vary {knob}=V1,V2")
        parts = values.split(",")
        for value in parts:
            problem = KNOB_KINDS[knob](value)
            if problem:
                raise UsageError(f"--vary {knob}={show(value)} {problem}")
        _refuse_one_value_twice(knob, parts)
        out.append(Vary(knob, tuple(parts)))
    size = 1
    for v in out:
        size *= len(v.values)
    if size > MAX_CELLS:
        raise UsageError(f"--vary: {size} cells (the product of {' x '.join(str(len(v.values)) for v in out)}); at "
                         f"most {MAX_CELLS}: at about 15 minutes a boot, that is already a long night")
    return tuple(out)


def _refuse_one_value_twice(knob: str, values: Sequence[str]) -> None:
    """Two values that mean the same for the knob's kind (0.9 and 0.90, 04 and 4) would be two cells of one
    configuration: the second costs a boot or a bench and measures nothing new."""
    seen: dict[object, str] = {}  # a meaning -> the first value given for it
    for value in values:
        meant = meaning(KNOB_KINDS[knob], value)
        if meant not in seen:
            seen[meant] = value
            continue
        first = seen[meant]
        if first == value:
            raise UsageError(f"--vary {knob}: the value {show(value)} is given twice")
        raise UsageError(f"--vary {knob}: {show(first)} and {show(value)} are the same value; give it once")


def product(varies: Sequence[Vary]) -> tuple[tuple[tuple[str, str], ...], ...]:
    """Every cell's knob values, in the order of the product (the first --vary changes slowest)."""
    return tuple(tuple(zip((v.knob for v in varies), combo))
                 for combo in itertools.product(*(v.values for v in varies)))


def cell_environ(environ: Mapping[str, str], knobs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The environment a cell is planned and launched in: this one, with the cell's knobs set (they win)."""
    return {**environ, **dict(knobs)}


@dataclass(frozen=True)
class CellLaunch:
    """What one launch would start, as its launch plan says: the data the sweep plan needs of it."""

    image: str  # the IMAGE knob (a reference)
    argvs: tuple[tuple[str, ...], ...]  # every rank's docker run argv, rank order
    model_revision: str | None
    drafter_revision: str | None

    @classmethod
    def of(cls, plan: LaunchPlan) -> CellLaunch:
        return cls(plan.image, tuple(tuple(r.docker_run) for r in plan.ranks), plan.model_revision,
                   plan.drafter_revision)

    def boot(self, image_id: str | None) -> str:
        """Its boot identity: run records are named by the same hash when `image_id` is docker's image ID. Without
        an ID the image reference stands in (equal within one plan; never equal to a record's id)."""
        return boot_id(image_id or f"ref:{self.image}", self.model_revision, self.drafter_revision, self.argvs)


def launch_cells(recipe: Recipe, environ: Mapping[str, str], cells: Sequence[Sequence[tuple[str, str]]],
                 profile: str = "production", image=None) -> tuple[CellLaunch, tuple[CellLaunch, ...]]:
    """The baseline's launch (the recipe as it stands in `environ`) and each cell's: deploy's and launch's own plans
    (`image`: deploy's ImageFlag for --image, or None). A cell whose knobs deploy refuses together is that one line."""
    baseline = CellLaunch.of(plan_launch_from_recipe(recipe, environ, profile, image))
    return baseline, tuple(CellLaunch.of(plan_launch_from_recipe(recipe, cell_environ(environ, knobs), profile, image))
                           for knobs in cells)


def content_key(recipe: str, knobs: Iterable[tuple[str, str]], launch: CellLaunch, image_id: str,
                bench: Mapping[str, object]) -> str:
    """What makes a finished cell reusable on resume: the recipe, the cell's knobs, the image's config digest, the
    served revisions, the argv they produce (an edited recipe changes it) and the bench options (not the URL or
    the salt: a resumed sweep keeps its salt). 16 hex digits."""
    doc = {"recipe": recipe, "knobs": dict(knobs), "image": image_id, "model": launch.model_revision,
           "drafter": launch.drafter_revision, "argv": [list(a) for a in launch.argvs],
           "bench": {k: v for k, v in bench.items() if k not in ("url", "salt")}}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class BootEstimate:
    seconds: float
    runs: int  # recorded boots it comes from (0: the default)
    source: str

    def to_json(self) -> dict:
        return {"seconds": self.seconds, "runs": self.runs, "source": self.source}


def boot_estimates(records: Iterable[dict], recipe: str) -> tuple[BootEstimate, dict[str, BootEstimate]]:
    """From launch's run records: the recipe's typical boot (median time to /health, plus the worker's lead), and
    each recorded boot identity's own. With none recorded, a Spark pair's usual 15 minutes."""
    by_id: dict[str, list[float]] = {}
    for r in records:
        boot = r.get("boot") if isinstance(r, dict) else None
        health = boot.get("health_s") if isinstance(boot, dict) else None
        if r.get("recipe") != recipe or not isinstance(health, (int, float)) or isinstance(health, bool):
            continue
        by_id.setdefault(str(r.get("id")), []).append(float(health) + WORKER_LEAD_S)
    every = [s for xs in by_id.values() for s in xs]
    if not every:
        typical = BootEstimate(DEFAULT_BOOT_S, 0, "no recorded boot of this recipe: about 15 minutes on the Sparks")
    else:
        typical = BootEstimate(round(statistics.median(every), 1), len(every),
                               f"the median of {len(every)} recorded boot(s) of {recipe}")
    own = {rid: BootEstimate(round(statistics.median(xs), 1), len(xs), f"this boot's own record (run {rid})")
           for rid, xs in by_id.items()}
    return typical, own


@dataclass(frozen=True)
class Cell:
    index: int  # its place in the product (stable across orders and resumes: the table's row number)
    knobs: tuple[tuple[str, str], ...]  # the varied knobs, in --vary order
    boot: str  # its boot identity
    boots: bool  # whether this cell starts a boot (False: it shares the one before, or what serves now)
    reuses: str | None  # why it does not boot ("what serves now", "the boot of cell 2")
    key: str | None  # content key; None while the image's ID is not known (the apply reads it from docker)
    boot_s: float  # estimated boot time (0 when it does not boot)
    boot_from: str
    bench_s: float | None  # estimated bench time, when known
    finished: bool = False  # finished in an earlier run of this sweep (its record): kept, not run, not estimated

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v if v != '' else '(empty)'}" for k, v in self.knobs)

    @property
    def estimate_s(self) -> float | None:
        return None if self.bench_s is None else self.boot_s + self.bench_s

    def to_json(self) -> dict:
        return {"index": self.index, "knobs": dict(self.knobs), "boot": self.boot, "boots": self.boots,
                "reuses": self.reuses, "key": self.key, "boot_s": self.boot_s, "boot_from": self.boot_from,
                "bench_s": self.bench_s, "estimate_s": self.estimate_s, "finished": self.finished}


@dataclass(frozen=True)
class SweepPlan:
    recipe: str
    varies: tuple[Vary, ...]
    cells: tuple[Cell, ...]  # in run order
    baseline: str  # the boot identity of the recipe as it stands
    leave_last_up: bool
    final_boot: bool  # whether the final relaunch boots (False: the last cell is the baseline, or left up)
    final_boot_s: float
    boots: int  # boots the run starts, the final relaunch included (a finished cell's are not)

    @property
    def left(self) -> tuple[Cell, ...]:
        """The cells this run runs: every cell but those finished in an earlier run."""
        return tuple(c for c in self.cells if not c.finished)

    @property
    def estimate_s(self) -> float:
        """The boots and known bench times of the cells left, and the final relaunch, summed."""
        return sum(c.boot_s + (c.bench_s or 0.0) for c in self.left) + (self.final_boot_s if self.final_boot else 0.0)

    def to_json(self) -> dict:
        return {"recipe": self.recipe, "vary": [v.to_json() for v in self.varies],
                "cells": [c.to_json() for c in self.cells], "baseline": self.baseline,
                "leave_last_up": self.leave_last_up, "final_boot": self.final_boot, "final_boot_s": self.final_boot_s,
                "boots": self.boots, "estimate_s": self.estimate_s}

    def lines(self) -> list[str]:
        vary = " x ".join(f"{v.knob} ({', '.join(v.values)})" for v in self.varies)
        done = len(self.cells) - len(self.left)
        cells = f"{len(self.cells)} cell{'' if len(self.cells) == 1 else 's'}" + (f" ({done} finished)" if done else "")
        lines = [f"sweep {self.recipe}: {vary}: {cells}, {self.boots} boot(s), about {_duration(self.estimate_s)}"
                 f"{'' if all(c.bench_s is not None for c in self.left) else ' + bench'}"]
        for n, c in enumerate(self.cells, 1):
            if c.finished:
                lines.append(f"  {n}. cell {c.index + 1}: {c.label}: finished in an earlier run: kept")
                continue
            how = f"boot ~{_duration(c.boot_s)} ({c.boot_from})" if c.boots else f"no boot: {c.reuses}"
            bench = "bench" if c.bench_s is None else f"bench ~{_duration(c.bench_s)}"
            lines.append(f"  {n}. cell {c.index + 1}: {c.label}: {how}, then {bench}")
        if self.leave_last_up:
            lines.append("then: the last cell is left serving (--leave-last-up)")
        elif self.final_boot:
            lines.append(f"then: relaunch the recipe as it stands, ~{_duration(self.final_boot_s)}")
        else:
            lines.append("then: the last cell is the recipe as it stands: it stays serving, no relaunch")
        return lines


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 120 else f"{minutes / 60:.1f} h"


def run_order(boots: Sequence[str], serving: str | None, baseline: str | None, leave_last_up: bool) -> list[int]:
    """Cell indexes in the order that boots least: cells of one boot identity together, in first-appearance order;
    the group that serves now first; the baseline's group last unless the last cell stays up (or the baseline is
    also what serves now: then first or last cost the same, one boot, and first keeps the product's order)."""
    groups: dict[str, list[int]] = {}
    for i, b in enumerate(boots):
        groups.setdefault(b, []).append(i)
    order = list(groups)
    if serving in groups:
        order.remove(serving)
        order.insert(0, serving)
    if not leave_last_up and baseline in groups and baseline != serving:
        order.remove(baseline)
        order.append(baseline)
    return [i for b in order for i in groups[b]]


def plan_sweep(recipe: str, varies: Sequence[Vary], baseline: CellLaunch, launches: Sequence[CellLaunch], *,
               image_id: str | None = None, serving: str | None = None, records: Iterable[dict] = (),
               bench: Mapping[str, object] | None = None, bench_s: float | None = None,
               leave_last_up: bool = False, finished: Collection[str] = ()) -> SweepPlan:
    """The sweep's plan from each cell's launch (`launch_cells`, in product order).

    `image_id`: docker's ID of the image the cells run (the layout's config digest under --image, or what --probe
    read), None when not known yet; `serving`: the boot identity of what serves now (the latest run record's id,
    when its pair is healthy); `records`: launch's run records (boot estimates); `bench`: the bench options the
    content keys include; `bench_s`: one bench's estimated time, when known; `finished`: the content keys of the
    cells an earlier run of this sweep finished (its record's), which this run keeps and does not run."""
    cells_knobs = product(varies)
    if len(cells_knobs) != len(launches):
        raise ValueError(f"{len(launches)} launches for {len(cells_knobs)} cells")
    boots = [launch.boot(image_id) for launch in launches]
    base = baseline.boot(image_id)
    order = run_order(boots, serving, base, leave_last_up)
    typical, own = boot_estimates(records, recipe)
    cells = []
    prev: str | None = serving
    first_of: dict[str, int] = {}
    for i in order:
        b = boots[i]
        key = content_key(recipe, cells_knobs[i], launches[i], image_id, bench or {}) if image_id else None
        if key is not None and key in finished:  # skipped: what serves stays as the cell before left it
            cells.append(Cell(i, cells_knobs[i], b, False, None, key, 0.0, "", None, finished=True))
            continue
        starts = b != prev
        reuses = None
        if not starts:
            reuses = "what serves now" if b == serving and b not in first_of else f"the boot of cell {first_of[b] + 1}"
        est = own.get(b, typical)
        cells.append(Cell(i, cells_knobs[i], b, starts, reuses, key, est.seconds if starts else 0.0,
                          est.source if starts else "", bench_s))
        first_of.setdefault(b, i)
        prev = b
    final_boot = not leave_last_up and prev != base
    final = own.get(base, typical)
    boots_n = sum(c.boots for c in cells) + (1 if final_boot else 0)
    return SweepPlan(recipe, tuple(varies), tuple(cells), base, leave_last_up, final_boot,
                     final.seconds if final_boot else 0.0, boots_n)
