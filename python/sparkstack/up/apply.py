"""`sparkstack up`'s apply: each stage, in order, through its own command's apply. No logic of its own.

A stage that an earlier stage of this run changed the ground under is planned again just before it runs (its
plan in the table was made against the disk as it was). The first failure stops the run; Ctrl-C stops it at
once. Either way the run record (`record_path()`) says what each stage did, so the next `up` resumes: every
finished stage plans as up to date.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sparkstack import fsio, interrupt
from sparkstack.errors import SparkstackError
from sparkstack.up.plan import (BLOCKED, SKIPPED, STAGES, UP_TO_DATE, WILL_RUN, Stage, UpInputs, UpPlan, plan_stage,
                                serving, without_page_cache)


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

    def to_json(self) -> dict:
        return {"recipe": self.recipe, "started_at": self.started_at, "record": str(self.record),
                "stages": [r.to_json() for r in self.runs]}


class StageFailed(SparkstackError):
    """A stage failed (or was blocked): the one line names it, its own error, and the command to run it alone."""

    def __init__(self, result: UpResult, run: StageRun, unblock: str | None = None) -> None:
        from sparkstack.text import printable

        self.result, self.run = result, run
        if unblock is not None:
            line = f"up: {run.stage} is blocked: {run.detail}; unblock it: {unblock}; then run `sparkstack up` again"
        else:
            line = (f"up: {run.stage} failed: {run.detail}; run it alone: {run.rerun}; then `sparkstack up` resumes "
                    "from there")
        super().__init__(printable(line))  # one line: a path may hold a newline


class UpInterrupted(Exception):
    """Ctrl-C: the stage under way was cut; the record holds what was done."""

    def __init__(self, result: UpResult) -> None:
        super().__init__("interrupted")
        self.result = result


class View:
    """What `up` tells the person watching: the CLI passes a live view; the default prints nothing."""

    def started(self, stage: str, total: int | None) -> Callable[[int], None] | None:
        return None

    def finished(self, run: StageRun) -> None:
        pass

    def say(self, line: str) -> None:
        pass


# ---------------------------------------------------------------- the record


def record_path() -> Path:
    """Beside launch's run records: $SPARKSTACK_STATE_DIR (else $XDG_STATE_HOME/sparkstack)/up/last.json."""
    from sparkstack.state import up_record_path

    return up_record_path()


def read_record() -> dict | None:
    try:
        doc = json.loads(record_path().read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _write_record(result: UpResult) -> None:
    result.record.parent.mkdir(parents=True, exist_ok=True)
    fsio.write_atomic(result.record, (json.dumps(result.to_json(), indent=2) + "\n").encode())


# ---------------------------------------------------------------- one apply per stage, through the area's own


@dataclass
class _Run:
    inp: UpInputs
    environ: Mapping[str, str]
    view: View
    finished: dict[str, Stage]  # this run's stages, as they stand after it dealt with them
    api_key: str | None = None

    def said(self, text: str) -> str:
        """Server text on our lines, as the single commands show it: the key it may echo masked, controls escaped."""
        from sparkstack.text import printable
        from sparkstack.verify import mask_key

        return printable(mask_key(text, self.api_key))

    def say(self, line: str) -> None:
        self.view.say(self.said(line))


def _apply_fetch(stage: Stage, run: _Run, advance) -> dict:
    from sparkstack.fetch import apply_fetch

    apply_fetch(stage.work, on_progress=advance,
                on_wait=lambda entry, pid: run.say(f"waiting for another fetch of {entry}"))
    return dict(stage.outputs)


def _apply_strip(stage: Stage, run: _Run, advance) -> dict:
    from sparkstack.strip import apply_strip

    apply_strip(stage.work, on_progress=advance, on_wait=lambda dest, pid: run.say(f"waiting for another strip of {dest}"))
    return dict(stage.outputs)


def _apply_build(stage: Stage, run: _Run, advance) -> dict:
    from sparkstack.image import build_image

    result = build_image(stage.work, on_progress=advance)
    return {"config": result.config_digest, "manifest": result.manifest_digest, "image": str(result.out)}


def _apply_ship(stage: Stage, run: _Run, advance) -> dict:
    from sparkstack.ship import apply_ship_recorded

    result, note = apply_ship_recorded(stage.work, on_progress=(lambda host, n: advance(n)) if advance else None)
    if note:
        run.say(f"head: image {note}")
    def total(h, field: str) -> int:
        return (getattr(h.image, field) if h.image else 0) + sum(getattr(w, field) for w in h.weights)

    if result.failed:
        raise SparkstackError("; ".join(f"{h.host}: {h.error}" for h in result.failed))
    return {**stage.outputs, "bytes_sent": {h.host: total(h, "bytes_sent") for h in result.hosts},
            "bytes_resumed": {h.host: total(h, "bytes_resumed") for h in result.hosts}}


def _apply_tune(stage: Stage, run: _Run, advance) -> dict:
    from sparkstack.tune.apply import apply_tune

    plan, runners = stage.work
    done, problems = apply_tune(plan, runners, run.say)
    if problems:
        raise SparkstackError("; ".join(problems))
    return {"done": done}


def _apply_launch(stage: Stage, run: _Run, advance) -> dict:
    from sparkstack.launch import apply as launch_apply

    plan, runners, now = stage.work
    inp = run.inp
    if now.present:
        failures = launch_apply.stop(plan, runners, run.say)
        if failures:
            raise SparkstackError("; ".join(failures))
    selected, checks = launch_apply.preflight(plan, "all", inp.host_root, runners, True, False, inp.gates,
                                              dict(run.environ), dry_run=False)
    for c in checks:
        if c.status != "pass":
            run.say(c.line())
    timeouts = launch_apply.Timeouts(health_interval_s=inp.health_interval_s, health_attempts=inp.health_attempts,
                                     worker_delay_s=inp.worker_delay_s)
    started = launch_apply.start(plan, runners, selected, checks, timeouts, dict(run.environ), run.say, False, None,
                                 inp.host_root, gates=inp.gates)
    after = serving(plan, runners)
    return {**stage.outputs, "run": after.run_id, "head_started_at": after.head_started_at,
            "record": str(started.record)}


def _launch_outputs(run: _Run) -> dict:
    launch = run.finished.get("launch")
    out = dict(launch.outputs) if launch is not None else {}
    return {"run": out.get("run"), "head_started_at": out.get("head_started_at")}


def _apply_verify(stage: Stage, run: _Run, advance) -> dict:
    from sparkstack.verify import run_verify, verdict

    from sparkstack.launch.apply import latest_record

    results = run_verify(stage.work, run.api_key,
                         on_result=lambda r: run.say(r.line()), record=latest_record())
    failed = verdict(results)
    if failed:
        raise SparkstackError(failed)
    return {**_launch_outputs(run), "checks": len(results), "temperature": stage.work.temperature,
            "warned": [r.check for r in results if r.status == "warn"]}


def _apply_bench(stage: Stage, run: _Run, advance) -> dict:
    from sparkstack.bench.run import run_bench
    from sparkstack.endpoint.client import Endpoint

    plan = stage.work
    endpoint = Endpoint(plan.settings.url, run.api_key, 60.0,
                        connections=max(plan.settings.concurrency))
    done = [0]

    def progress(label: str, requests_done: int, planned: int) -> None:
        if advance and requests_done > done[0]:
            advance(requests_done - done[0])
            done[0] = requests_done

    report = run_bench(plan, endpoint, on_progress=progress)
    for line in (*report.warnings, *(n for c in report.cells for n in c.notes())):
        run.say(line)
    doc = report.to_json()
    out = run.inp.bench_out
    out.parent.mkdir(parents=True, exist_ok=True)
    fsio.write_atomic(out, (json.dumps(doc, indent=2) + "\n").encode())  # before the verdict: a fault keeps its figures
    verdict = report.verdict()
    if verdict:
        raise SparkstackError(f"{verdict} (report: {out})")
    return {**_launch_outputs(run), "settings": plan.to_json()["settings"], "report": str(out)}


APPLIERS = {"fetch": _apply_fetch, "strip": _apply_strip, "build": _apply_build, "ship": _apply_ship,
            "tune": _apply_tune, "launch": _apply_launch, "verify": _apply_verify, "bench": _apply_bench}


def _progress_total(stage: Stage) -> int | None:
    if stage.name == "bench" and stage.work is not None:
        return stage.work.requests
    return stage.bytes or None


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


def _kept(stage: Stage, inp: UpInputs, last_run: Mapping[str, object] | None) -> StageRun | None:
    """A stage this run did not plan (after --until): the previous run's entry for it, which later runs still judge
    against the launch that serves then (a verify or bench of another run is never taken for this one's)."""
    if stage.state != SKIPPED or not last_run or STAGES.index(stage.name) < max(map(STAGES.index, inp.stages)):
        return None
    old = next((r for r in last_run.get("stages", []) if isinstance(r, dict) and r.get("stage") == stage.name), None)
    if not old or old.get("outcome") not in ("done", "up to date"):
        return None
    return StageRun(stage.name, old["outcome"], 0.0, str(old.get("detail", "")), str(old.get("rerun", "")),
                    dict(old.get("outputs") or {}))


def apply_up(plan: UpPlan, inp: UpInputs, environ: Mapping[str, str], view: View | None = None) -> UpResult:
    """Run every stage of `plan` that will run, in order; raises StageFailed at the first failure or block, and
    UpInterrupted on Ctrl-C, both after writing the record."""
    from sparkstack.endpoint.client import api_key_from

    view = view or View()
    run = _Run(inp, environ, view, {}, api_key_from(inp.api_key_env, environ))
    runs: list[StageRun] = []
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    path = record_path()
    _ready_record(path)

    def result() -> UpResult:
        return UpResult(plan.recipe, tuple(runs), path, started_at)

    def stop_after(i: int) -> None:
        """The stages after the one that stopped the run, then the record."""
        for s in plan.stages[i + 1:]:
            kept = _kept(s, inp, plan.last_run)
            runs.append(kept or StageRun(s.name, "skipped" if s.state == SKIPPED else "not started", 0.0, s.detail,
                                         shlex.join(s.rerun), dict(s.outputs)))
        _write_record(result())

    changed = False  # an earlier stage of this run acted: later plans are made again
    serving_already = (plan.stage("launch") is not None and plan.stage("launch").state == UP_TO_DATE)
    for i, planned in enumerate(plan.stages):
        stage = planned
        t0 = time.monotonic()
        try:
            if planned.state != SKIPPED and changed:
                stage = plan_stage(planned.name, inp, environ, run.finished, plan.last_run)
            if stage.name == "tune" and serving_already:
                stage = without_page_cache(stage)
            rerun = shlex.join(stage.rerun)
            if stage.state in (UP_TO_DATE, SKIPPED):
                runs.append(_kept(stage, inp, plan.last_run) or StageRun(
                    stage.name, "up to date" if stage.state == UP_TO_DATE else "skipped", 0.0, stage.detail, rerun,
                    dict(stage.outputs)))
                run.finished[stage.name] = stage
                view.finished(runs[-1])
                continue
            if stage.state == BLOCKED:
                runs.append(StageRun(stage.name, "blocked", 0.0, stage.detail, rerun, dict(stage.outputs)))
                view.finished(runs[-1])
                stop_after(i)
                raise StageFailed(result(), runs[i], shlex.join(stage.unblock or stage.rerun))
            assert stage.state == WILL_RUN
            advance = view.started(stage.name, _progress_total(stage))
            outputs = APPLIERS[stage.name](stage, run, advance)
        except KeyboardInterrupt:
            runs.append(StageRun(stage.name, "cut", time.monotonic() - t0, f"interrupted by {interrupt.name()}",
                                 shlex.join(stage.rerun), dict(stage.outputs)))
            view.finished(runs[-1])
            stop_after(i)
            raise UpInterrupted(result()) from None
        except StageFailed:
            raise
        except (SparkstackError, OSError) as exc:
            line = str(exc) if isinstance(exc, SparkstackError) else \
                f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}"
            runs.append(StageRun(stage.name, "failed", time.monotonic() - t0, run.said(line), shlex.join(stage.rerun),
                                 dict(stage.outputs)))
            view.finished(runs[-1])
            stop_after(i)
            raise StageFailed(result(), runs[i]) from None
        runs.append(StageRun(stage.name, "done", time.monotonic() - t0, stage.detail, rerun, outputs))
        run.finished[stage.name] = dataclasses.replace(stage, state=UP_TO_DATE, outputs=outputs)
        changed = True
        view.finished(runs[-1])
        _write_record(result())  # after every stage: a kill -9 leaves the stages done so far on record
    _write_record(result())
    return result()
