"""A sweep's state record: one JSON file per sweep under the state dir (`<state>/sweeps/<sweep id>.json`, beside
launch's `runs/`), rewritten atomically after every step of every cell, so a Ctrl-C, a kill or a crash leaves the
cells done so far standing and the one cut named.

The document (version 1):

    {"version": 1, "sweep": "<id>", "recipe": "glm53-...", "vary": [{"knob": "NUM_SPEC_TOKENS", "values": [...]}],
     "salt": "ab12cd34",            # one bench salt shared by every cell: the same prompts in every cell
     "bench": {...},                # the bench options every cell runs with (bench's Settings, without the url)
     "created_at": "...Z", "updated_at": "...Z",
     "cells": [{"index": 0, "knobs": {"NUM_SPEC_TOKENS": "2"}, "key": "<content key>" | null,
                "status": "pending" | "booting" | "benching" | "done" | "failed" | "cut",
                "run_id": "<launch's run record id>" | null, "boot": {...the run record's boot...} | null,
                "report": "<path of the cell's bench --json document>" | null,
                "failure": {"line": "...", "diagnosis": "...", "at_s": 512.0, "rank": 0} | null,
                "started_at": "...Z" | null, "finished_at": "...Z" | null}, ...],
     "serving": {"what": "recipe" | "cell", "cell": 3 | null, "run_id": "..."} | null}

`done` and `failed` cells are finished: a resume skips them when their content key is unchanged (the same recipe,
knobs, image, revisions, argv and bench options); `booting`/`benching` at load time means the process died there:
such a cell is `cut` and runs again. A failed cell keeps its diagnosis (the fatal boot line) and is a row of the
table, not the end of the sweep.

The apply (`sweep/command.py`'s `apply`, through the command objects stop, launch and bench), per cell in the plan's
run order:
1. skip it when `finished(state)` holds its key (resume); else `mark(..., status="booting")` and write;
2. unless the plan says the cell reuses a boot (and the pair is healthy with that run id): `launch stop`, then
   `launch all` with `cell_environ(environ, knobs)`; a LaunchFailed is `failed` with its fatal line
   (`failure_of(timeline)`), and the sweep goes on to the next cell;
3. `mark(status="benching", run_id=..., boot=record["boot"])`, write; bench with the sweep's salt and options,
   its --json document written beside the state file (`report_path`); `mark(status="done", report=...)`, write;
4. Ctrl-C (interrupt.Stopped): `cut(state, index)`, write, print `progress_lines`, and leave what serves as it is;
5. at the end: relaunch the baseline unless the last cell is it or --leave-last-up; record `serving`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from sparkstack import fsio
from sparkstack.errors import SparkstackError
from sparkstack.state import launch_runs_dir, sweeps_dir
from sparkstack.sweep.plan import SweepPlan, Vary

VERSION = 1
STATUSES = ("pending", "booting", "benching", "done", "failed", "cut")
FINISHED = ("done", "failed")
MAX_BYTES = 16 << 20


def state_path(sweep: str) -> Path:
    """The record of the sweep with this id (sweep_id)."""
    return sweeps_dir() / f"{sweep}.json"


def read_run_records(directory: Path | None = None) -> list[dict]:
    """launch's run records (`<state>/runs/<id>.json`), the unreadable ones left out: boot estimates read them."""
    out = []
    for path in sorted((directory or launch_runs_dir()).glob("*.json")):
        try:
            doc = json.loads(path.read_bytes()[:MAX_BYTES])
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(doc, dict):
            out.append(doc)
    return out


def sweep_id(recipe: str, varies: Sequence[Vary], bench: Mapping[str, object]) -> str:
    """One sweep: the same recipe, knobs and values, and bench options run again resume it."""
    doc = {"recipe": recipe, "vary": [v.to_json() for v in varies],
           "bench": {k: v for k, v in bench.items() if k not in ("url", "salt")}}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]


def report_path(state_file: Path, index: int) -> Path:
    """Where the cell's bench --json document is kept: beside the state file."""
    return state_file.with_name(f"{state_file.stem}-cell{index + 1}.json")


def new_state(plan: SweepPlan, salt: str, bench: Mapping[str, object], now: str) -> dict:
    """A fresh record of the plan: every cell pending, in product order."""
    cells = sorted(plan.cells, key=lambda c: c.index)
    return {"version": VERSION, "sweep": sweep_id(plan.recipe, plan.varies, bench), "recipe": plan.recipe,
            "vary": [v.to_json() for v in plan.varies], "salt": salt,
            "bench": {k: v for k, v in bench.items() if k != "url"}, "created_at": now, "updated_at": now,
            "cells": [{"index": c.index, "knobs": dict(c.knobs), "key": c.key, "status": "pending", "run_id": None,
                       "boot": None, "report": None, "failure": None, "started_at": None, "finished_at": None}
                      for c in cells],
            "serving": None}


def mark(state: dict, index: int, now: str, **changes) -> dict:
    """A new record with cell `index` changed (status, run_id, boot, report, failure, key); times kept."""
    if "status" in changes and changes["status"] not in STATUSES:
        raise ValueError(f"status {changes['status']!r}")
    cells = []
    for c in state["cells"]:
        if c["index"] == index:
            c = {**c, **changes}
            if changes.get("status") == "booting" and c["started_at"] is None:
                c["started_at"] = now
            if changes.get("status") in (*FINISHED, "cut"):
                c["finished_at"] = now
        cells.append(c)
    return {**state, "cells": cells, "updated_at": now}


def cut(state: dict, index: int, now: str) -> dict:
    return mark(state, index, now, status="cut")


def recover(state: dict, now: str) -> dict:
    """A record read back: a cell left booting or benching was cut by a death the process could not record."""
    for c in state["cells"]:
        if c["status"] in ("booting", "benching"):
            state = cut(state, c["index"], now)
    return state


def finished(state: dict, key: str | None) -> dict | None:
    """The finished cell with this content key, if any: a resume skips it."""
    if key is None:
        return None
    return next((c for c in state["cells"] if c["key"] == key and c["status"] in FINISHED), None)


def finished_keys(state: dict) -> frozenset[str]:
    """The content keys of the record's finished cells: the plan keeps them (`finished`, one of them)."""
    return frozenset(c["key"] for c in state["cells"] if isinstance(c.get("key"), str) and c["status"] in FINISHED)


def failure_of(timeline: Sequence[dict]) -> dict | None:
    """A failed boot's diagnosis from its timeline's JSON (launch/timeline.py): the first rank's fatal line."""
    for rank in timeline:
        fatal = rank.get("fatal")
        if fatal:
            return {"line": fatal["line"], "diagnosis": fatal.get("diagnosis", ""), "at_s": fatal.get("at_s"),
                    "rank": rank.get("rank")}
    return None


def progress_lines(state: dict) -> list[str]:
    """What a Ctrl-C (or a look at the record) says: the cells done, the one cut, the ones left."""
    def names(status: tuple[str, ...]) -> str:
        return ", ".join(f"{c['index'] + 1} ({_label(c)})" for c in state["cells"] if c["status"] in status) or "none"

    lines = [f"sweep {state['sweep']} ({state['recipe']}): done: {names(('done',))}",
             f"  failed: {names(('failed',))}", f"  cut: {names(('cut', 'booting', 'benching'))}",
             f"  not started: {names(('pending',))}"]
    serving = state.get("serving")
    if serving:
        what = "the recipe as it stands" if serving["what"] == "recipe" else f"cell {serving['cell'] + 1}"
        lines.append(f"serving: {what} (run {serving.get('run_id')})")
    return lines


def _label(cell: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cell["knobs"].items())


def read_state(path: Path) -> dict | None:
    """A sweep's record, checked; None when there is none yet."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SparkstackError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        doc = json.loads(raw) if len(raw) <= MAX_BYTES else None
    except (ValueError, RecursionError):
        doc = None
    if not (isinstance(doc, dict) and doc.get("version") == VERSION and isinstance(doc.get("cells"), list)
            and all(isinstance(c, dict) and c.get("status") in STATUSES and isinstance(c.get("index"), int)
                    for c in doc["cells"])):
        raise SparkstackError(f"{path}: not a sweep record of version {VERSION}; move it away to start afresh")
    return doc


def write_state(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fsio.write_atomic(path, (json.dumps(state, indent=2) + "\n").encode())
