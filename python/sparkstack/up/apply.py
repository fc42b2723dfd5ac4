"""`sparkstack up`'s apply: each stage, in order, through its own command object's apply.

A stage that an earlier stage of this run changed the ground under is planned again just before it runs (its
plan in the table was made against the disk as it was). The first failure stops the run; Ctrl-C stops it at
once. Either way the run record (`state.up_record_path()`) says what each stage did, so the next `up` resumes:
every finished stage plans as up to date.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sparkstack import fsio, interrupt
from sparkstack.command import StageRows, View
from sparkstack.errors import SparkstackError
from sparkstack.state import up_record_path
from sparkstack.up.plan import (BLOCKED, SKIPPED, SPECS, STAGES, UP_TO_DATE, WILL_RUN, Ground, Stage, UpPlan,
                                plan_stage, serving_already)


@dataclass(frozen=True)
class StageRun:
    """What one stage did in a run of `up`."""

    stage: str
    outcome: str  # done, up to date, failed, cut, blocked, skipped, not started
    seconds: float
    detail: str
    rerun: str
    outputs: Mapping[str, object] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"stage": self.stage, "outcome": self.outcome, "seconds": round(self.seconds, 3),
                "detail": self.detail, "rerun": self.rerun, "outputs": dict(self.outputs)}


@dataclass(frozen=True)
class UpResult:
    recipe: str
    runs: tuple[StageRun, ...]
    record: Path
    started_at: str
    stopped: str | None = None  # "failed", "blocked" or "cut": the run ended early
    failure: str | None = None  # the one line that says which stage stopped it, and what to run

    def to_json(self) -> dict:
        return {"recipe": self.recipe, "started_at": self.started_at, "record": str(self.record),
                "stages": [r.to_json() for r in self.runs]}


def failure_line(run: StageRun, unblock: str | None = None) -> str:
    """The one line that names the stage, its own error, and the command to run it alone (or to unblock it)."""
    if unblock is not None:
        return f"up: {run.stage} is blocked: {run.detail}; unblock it: {unblock}; then run `sparkstack up` again"
    return (f"up: {run.stage} failed: {run.detail}; run it alone: {run.rerun}; then `sparkstack up` resumes from "
            "there")


def _write_record(result: UpResult) -> None:
    result.record.parent.mkdir(parents=True, exist_ok=True)
    fsio.write_atomic(result.record, (json.dumps(result.to_json(), indent=2) + "\n").encode())


def _ready_record(path: Path) -> None:
    """Before any stage acts: a record that cannot be written must stop `up` here, not after a stage ran."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = path.parent / f".{path.name}.writable"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise SparkstackError(f"up: cannot write its run record in {path.parent}: {exc.strerror or exc} "
                              "(set SPARKSTACK_STATE_DIR to a writable directory)") from None


class StageView(View):
    """A stage's command sees this view: its lines above the rows, its bars as the stage's own row."""

    def __init__(self, outer: View, rows: StageRows, stage: str, advance: Callable[[int], None] | None) -> None:
        super().__init__()
        self.outer, self.rows, self.stage, self.advance = outer, rows, stage, advance

    def hide(self, secret: str | None) -> None:
        self.outer.hide(secret)

    def shown(self, text: str) -> str:
        return self.outer.shown(text)

    def say(self, line: str) -> None:
        self.rows.say(self.shown(line))

    note = warn = out = say

    @contextlib.contextmanager
    def progress(self, label: str, total: int | None, enabled: bool = True):
        if enabled:
            self.rows.resize(self.stage, total)
        yield self.advance if enabled else None

    @contextlib.contextmanager
    def hosts_progress(self, totals: dict[str, int]):
        self.rows.resize(self.stage, sum(totals.values()) or None)
        yield (lambda host, n: self.advance(n)) if self.advance else None

    @contextlib.contextmanager
    def requests_progress(self, planned: int):
        self.rows.resize(self.stage, planned)
        done = [0]

        def progress(label: str, requests_done: int, planned_now: int) -> None:
            if self.advance and requests_done > done[0]:
                self.advance(requests_done - done[0])
                done[0] = requests_done

        yield progress


def _kept(stage: Stage, plan: UpPlan) -> StageRun | None:
    """A stage this run did not plan (after --until): the previous run's entry for it, which later runs still judge
    against the launch that serves then (a verify or bench of another run is never taken for this one's)."""
    last_run, in_range = plan.last_run, plan.request.stages
    if stage.state != SKIPPED or not last_run or STAGES.index(stage.name) < max(map(STAGES.index, in_range)):
        return None
    old = next((r for r in last_run.get("stages", []) if isinstance(r, dict) and r.get("stage") == stage.name), None)
    if not old or old.get("outcome") not in ("done", "up to date"):
        return None
    return StageRun(stage.name, old["outcome"], 0.0, str(old.get("detail", "")), str(old.get("rerun", "")),
                    dict(old.get("outputs") or {}))


def _run_stage(stage: Stage, view: View, finished: Mapping[str, Stage]) -> dict:
    """Apply one stage as its table row says (its command's apply, and what the record keeps of it)."""
    spec = SPECS[stage.name]
    return spec.run(spec.command, stage, view, finished)


def apply_up(plan: UpPlan, view: View | None = None) -> UpResult:
    """Run every stage of `plan` that will run, in order. Stops at the first failure, block or Ctrl-C, after
    writing the record; the result says how it stopped."""
    view = view or View()
    r, environ = plan.request, plan.environ
    runs: list[StageRun] = []
    finished: dict[str, Stage] = {}
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    path = up_record_path()
    _ready_record(path)

    def result(stopped: str | None = None, failure: str | None = None) -> UpResult:
        return UpResult(plan.recipe, tuple(runs), path, started_at, stopped, failure)

    def stop_after(i: int) -> None:
        """The stages after the one that stopped the run, then the record."""
        for s in plan.stages[i + 1:]:
            runs.append(_kept(s, plan) or StageRun(s.name, "skipped" if s.state == SKIPPED else "not started", 0.0,
                                                   s.detail, s.rerun, dict(s.outputs)))
        _write_record(result())

    ground = None  # planned anew after a stage acted: its output may change the deployment
    serving = serving_already({s.name: s for s in plan.stages})
    stopped = None
    with view.stages([(s.name, s.state) for s in plan.stages]) as rows:
        for i, planned in enumerate(plan.stages):
            stage = planned
            t0 = time.monotonic()
            try:
                if planned.state != SKIPPED and ground is not None:
                    stage = plan_stage(planned.name, r, environ, finished, plan.last_run, ground)
                if serving:
                    stage = SPECS[stage.name].while_serving(stage)
                if stage.state in (UP_TO_DATE, SKIPPED):
                    runs.append(_kept(stage, plan) or StageRun(
                        stage.name, "up to date" if stage.state == UP_TO_DATE else "skipped", 0.0, stage.detail,
                        stage.rerun, dict(stage.outputs)))
                    finished[stage.name] = stage
                    rows.finished(runs[-1])
                    continue
                if stage.state == BLOCKED:
                    runs.append(StageRun(stage.name, "blocked", 0.0, stage.detail, stage.rerun, dict(stage.outputs)))
                    rows.finished(runs[-1])
                    stop_after(i)
                    stopped = result("blocked", failure_line(runs[i], stage.unblock or stage.rerun))
                    break
                assert stage.state == WILL_RUN
                advance = rows.started(stage.name, stage.bytes or None)
                outputs = _run_stage(stage, StageView(view, rows, stage.name, advance), finished)
            except KeyboardInterrupt:
                runs.append(StageRun(stage.name, "cut", time.monotonic() - t0, f"interrupted by {interrupt.name()}",
                                     stage.rerun, dict(stage.outputs)))
                rows.finished(runs[-1])
                stop_after(i)
                stopped = result("cut")
                break
            except (SparkstackError, OSError) as exc:
                line = str(exc) if isinstance(exc, SparkstackError) else \
                    f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}"
                runs.append(StageRun(stage.name, "failed", time.monotonic() - t0, view.shown(line), stage.rerun,
                                     dict(stage.outputs)))
                rows.finished(runs[-1])
                stop_after(i)
                stopped = result("failed", failure_line(runs[i]))
                break
            runs.append(StageRun(stage.name, "done", time.monotonic() - t0, stage.detail, stage.rerun, outputs))
            finished[stage.name] = dataclasses.replace(stage, state=UP_TO_DATE, outputs=outputs)
            ground = Ground(r, environ)
            rows.finished(runs[-1])
            _write_record(result())  # after every stage: a kill -9 leaves the stages done so far on record
    if stopped is not None:  # below the rows, once they are gone
        from sparkstack.up.report import stopped_lines

        for line in stopped_lines(stopped):
            view.note(line)
        return stopped
    _write_record(result())
    return result()
