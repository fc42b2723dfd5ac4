"""`sparkstack sweep`: the blog's by-hand experiments as one command. It composes launch and bench (their command
objects, as `up` does) over every cell of the knobs' product, and keeps a record per sweep (sweep/state.py) so a
second run resumes."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sparkstack.bench import command as bench_cmd
from sparkstack.command import Command, View, embed, option, request, request_from
from sparkstack.errors import SparkstackError
from sparkstack.launch import command as launch_cmd
from sparkstack.options import SamplingOptions, recipe_option
from sparkstack.tune.command import host_root_option, ssh_config_option
from sparkstack.verify.command import api_key_env_option


@request
class Request:
    recipe: str | None = recipe_option()
    vary: tuple[str, ...] = option((), "--vary", kind="many", metavar="KNOB=V1,V2", required=True,
                                   help="A knob and the values to try (repeatable: the cells are the product).")
    _image: object = embed(launch_cmd.LaunchOptions, only=("image", "profile"))
    host_root: Path = host_root_option("Host facts below this root, on every rank (as launch takes it).")
    ssh_config: Path | None = ssh_config_option()
    _boot: object = embed(launch_cmd.LaunchOptions,
                          only=("gates", "health_interval", "health_attempts", "worker_delay"))
    _bench: object = embed(bench_cmd.BenchOptions, prefix="bench",
                           only=("concurrency", "rounds", "category", "max_tokens"))
    _sampling: object = embed(SamplingOptions, only=("temperature",))
    api_key_env: str = api_key_env_option()
    leave_last_up: bool = option(False, "--leave-last-up", kind="flag",
                                 help="Leave the last cell serving (default: relaunch the recipe as it stands).")
    plot: Path | None = option(None, "--plot", kind="path", metavar="PNG",
                               help="Also draw the table: knob values against steps/s and acceptance length.")
    yes: bool = option(False, "--yes", kind="flag", help="Apply without asking (needed off a terminal).")
    dry_run: bool = option(False, "--dry-run", kind="flag",
                           help="Print the cells, their order and their estimated time; stop and start nothing.")
    as_json: bool = option(False, "--json", kind="flag", help="Print the plan (and the table) as JSON.")


@dataclass(frozen=True)
class Plan:
    request: Request
    sweep: object  # sweep.plan.SweepPlan
    baseline: object  # launch's command plan of the recipe as it stands
    cells: Mapping[int, object] = field(compare=False, repr=False)  # each cell's launch command plan, by index
    bench: object = field(compare=False, repr=False)  # bench's command plan (its salt replaced by the sweep's)
    settings: Mapping[str, object] = field(default_factory=dict)  # bench's settings: every cell's
    state_file: Path | None = None
    state: Mapping[str, object] | None = None  # the record of an earlier run of this sweep (resume)
    serving: str | None = None  # the run that serves now, healthy

    def done_already(self, cell) -> bool:
        return cell.finished  # the plan's: its key is a finished cell's in the record


def _image_id(p) -> str | None:
    """The image's ID: the layout's config digest, else what the head's docker says of the reference."""
    if p.launch.image_config_digest:
        return p.launch.image_config_digest
    try:
        proc = p.runners[0].run_docker("image", "inspect", "--format", "{{.Id}}", p.launch.image, timeout=30)
    except OSError:
        return None  # no docker here: the cells' content keys wait for it (no resume)
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def plan(request: Request, environ: Mapping[str, str]) -> Plan:
    from sparkstack.sweep.plan import CellLaunch, parse_vary, plan_sweep, product
    from sparkstack.sweep.state import finished_keys, read_run_records, read_state, recover, state_path, sweep_id

    r = request
    varies = parse_vary(r.vary)
    launch = request_from(launch_cmd.Request, r, target="all", recipe=r.recipe, host_root=r.host_root,
                          ssh_config=r.ssh_config, dry_run=r.dry_run)  # a dry run: each cell's preflight
    baseline = launch_cmd.plan(launch, environ)
    cells = {i: launch_cmd.plan(launch, {**environ, **dict(knobs)}) for i, knobs in enumerate(product(varies))}
    image_id = _image_id(baseline)
    now = launch_cmd.serving(baseline)
    healthy = bool(now.rows) and all(row["state"] == "running" for row in now.rows) and now.rows[0]["health"] == 200
    serving = str(now.last_run["id"]) if healthy and now.last_run else None
    bench = bench_cmd.plan(request_from(bench_cmd.Request, r, url=f"http://127.0.0.1:{baseline.launch.api_port}",
                                        api_key_env=r.api_key_env), environ)
    settings = bench.bench.to_json()["settings"]
    path = state_path(sweep_id(baseline.launch.recipe.name, varies, settings))
    state = read_state(path)
    if state is not None:
        state = recover(state, _now())
    sweep = plan_sweep(baseline.launch.recipe.name, varies, CellLaunch.of(baseline.launch),
                       tuple(CellLaunch.of(cells[i].launch) for i in sorted(cells)), image_id=image_id,
                       serving=serving, records=read_run_records(), bench=settings, leave_last_up=r.leave_last_up,
                       finished=() if state is None else finished_keys(state))
    if r.plot is not None:
        from sparkstack.sweep.plot import check_plot

        check_plot(r.plot)
    return Plan(r, sweep, baseline, cells, bench, settings, path, state, serving)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass(frozen=True)
class Result:
    state: Mapping[str, object]
    report: object | None  # sweep.report.SweepReport (None when cut)
    serving: str  # what serves at the end, in words
    cut: bool = False
    failure: str | None = None  # the final relaunch's, if it failed


def _boot(p: Plan, launch_plan, view: View) -> tuple[str, dict | None]:
    """Stop what runs, start `launch_plan`'s ranks, watch the boot: its run id and boot document."""
    started = launch_cmd.relaunch(launch_plan, view)
    return started.record.stem, None if started.boot is None else started.boot.to_json()


def _bench(p: Plan, index: int, view: View) -> tuple[Path, str | None]:
    """The cell's bench, with the sweep's salt and options, its document beside the record."""
    from sparkstack.sweep.state import report_path

    out = report_path(p.state_file, index)
    request = dataclasses.replace(p.bench.request, out=out)
    salted = dataclasses.replace(p.bench, request=request, bench=dataclasses.replace(p.bench.bench, salt=_salt(p)))
    result = bench_cmd.COMMAND.apply(salted, view)
    return out, bench_cmd.COMMAND.failure(salted, result)


def _salt(p: Plan) -> str:
    return str((p.state or {}).get("salt") or p.bench.bench.salt)


def apply(p: Plan, view: View) -> Result:
    """Each cell in the plan's order: boot it (unless it reuses the boot before, or what serves), bench it, record
    it. A cell that fails to boot is a failed row, not the end; Ctrl-C records the cut cell and leaves the pair as
    it is; at the end the recipe as it stands is relaunched (unless the last cell is it, or --leave-last-up)."""
    from sparkstack.sweep.state import cut, mark, new_state, progress_lines, write_state

    view.hide(p.bench.api_key)
    state = dict(p.state) if p.state is not None else new_state(p.sweep, _salt(p), p.settings, _now())
    write_state(p.state_file, state)
    # what serves now: its boot identity (a cell reuses it only when equal) and its launch run record's id
    current, run = p.serving, p.serving
    for n, cell in enumerate(p.sweep.cells, 1):
        if p.done_already(cell):
            view.say(f"cell {cell.index + 1} ({cell.label}): finished in an earlier run: kept")
            continue
        try:  # the mark too: a Ctrl-C while it is written (the record says "booting" already) is this cell's cut
            state = mark(state, cell.index, _now(), status="booting", key=cell.key)
            write_state(p.state_file, state)
            if current is not None and current == cell.boot:
                view.say(f"cell {cell.index + 1} ({cell.label}): the pair serves this boot already (run {run})")
                run_id, boot = run, _boot_of(run)
            else:
                view.say(f"cell {cell.index + 1} ({cell.label}): booting")
                current = run = None
                run_id, boot = _boot(p, p.cells[cell.index], view)
                current, run = cell.boot, run_id
            state = mark(state, cell.index, _now(), status="benching", run_id=run_id, boot=boot)
            write_state(p.state_file, state)
            report, fault = _bench(p, cell.index, view)
            state = mark(state, cell.index, _now(), status="done", report=str(report),
                         failure=None if not fault else {"line": fault, "diagnosis": "bench found a fault"})
        except KeyboardInterrupt:
            state = cut(state, cell.index, _now())
            write_state(p.state_file, state)
            for line in progress_lines(state):
                view.note(line)
            view.note(f"the pair is left as it is; run the same sweep again to go on (record: {p.state_file})")
            return Result(state, None, "as it was left", cut=True)
        except SparkstackError as exc:
            failure = getattr(exc, "fatal", None) or {"line": str(exc), "diagnosis": "", "at_s": None, "rank": None}
            view.say(f"cell {cell.index + 1} ({cell.label}): failed: {failure['line']}")
            state = mark(state, cell.index, _now(), status="failed", failure=failure)
            current = run = None
        write_state(p.state_file, state)
    serving, failure = _finish(p, current, run, view)
    state = {**state, "serving": serving}
    write_state(p.state_file, state)
    return Result(state, _report(p, state), _serving_words(serving), failure=failure)


def _boot_of(run_id: str) -> dict | None:
    from sparkstack.launch.apply import latest_record

    record = latest_record()
    return record.get("boot") if record and record.get("id") == run_id else None


def _finish(p: Plan, current: str | None, run: str | None, view: View) -> tuple[dict | None, str | None]:
    """The relaunch of the recipe as it stands, unless the last cell is it, or it is to stay up."""
    last = p.sweep.cells[-1] if p.sweep.cells else None
    if p.request.leave_last_up:
        return ({"what": "cell", "cell": last.index, "run_id": run} if run and last else None), None
    if current is not None and current == p.sweep.baseline:
        return {"what": "recipe", "cell": None, "run_id": run}, None
    view.say("relaunching the recipe as it stands")
    try:
        run_id, _ = _boot(p, p.baseline, view)
    except SparkstackError as exc:
        return None, f"the relaunch of the recipe as it stands failed: {exc}"
    return {"what": "recipe", "cell": None, "run_id": run_id}, None


def _serving_words(serving: dict | None) -> str:
    if not serving:
        return "nothing sparkstack started"
    what = "the recipe as it stands" if serving["what"] == "recipe" else f"cell {serving['cell'] + 1}"
    return f"{what} (run {serving['run_id']})"


def _report(p: Plan, state: Mapping):
    from sparkstack.sweep.report import load_reports, sweep_report

    report = sweep_report(dict(state), load_reports(dict(state)))
    if p.request.plot is not None:
        from sparkstack.sweep.plot import write_plot

        write_plot(report, p.request.plot)
    return report


def preflight_rows(p: Plan) -> list[tuple[str, object]]:
    """Each cell's preflight (a dry run's, from local facts), as (where, check): a check every cell meets alike is
    one row (where ""), the rest one row per cell that meets it."""
    cells = [(c, p.cells[c.index].checks) for c in p.sweep.cells if not p.done_already(c)]
    if not cells:
        return []
    shared = [c for c in cells[0][1] if all(c in checks for _, checks in cells)]
    rows = [("", c) for c in shared]
    for cell, checks in cells:
        rows += [(f"cell {cell.index + 1} ({cell.label})", c) for c in checks if c not in shared]
    return rows


def _verdict(p: Plan):
    from sparkstack.checkline import Verdict

    if not p.request.dry_run:
        return None
    rows = preflight_rows(p)
    failed = next((f"{where + ': ' if where else ''}{c.line().split(None, 1)[1]}" for where, c in rows
                   if c.status == "fail"), "")
    todo = [c for c in p.sweep.cells if not p.done_already(c)]
    failing = [c for c in todo if any(check.status == "fail" for check in p.cells[c.index].checks)]
    refusal = ("would boot no cell: each would fail its preflight" if len(failing) == len(todo) else
               f"would run, but cell(s) {', '.join(str(c.index + 1) for c in failing)} would fail their preflight "
               "(failed rows)")
    return Verdict.of("sparkstack sweep", (c.status for _, c in rows), failed, refusal)


def _plan_lines(p: Plan) -> list[str]:
    lines = p.sweep.lines()
    kept = [c for c in p.sweep.cells if p.done_already(c)]
    if kept:
        lines.append(f"resumes {p.state_file}: cells {', '.join(str(c.index + 1) for c in kept)} finished already")
    if p.serving:
        lines.append(f"serving now: run {p.serving}")
    if p.request.dry_run:
        rows = preflight_rows(p)
        lines.append("preflight of every cell (from this machine's facts; a cell that fails it is a failed row):")
        lines += [f"  {c.line()}" + (f"   <- {where}" if where else "") for where, c in rows]
    return lines


def _plan_json(p: Plan) -> dict:
    return {**p.sweep.to_json(), "record": str(p.state_file), "salt": _salt(p),
            "finished_already": [c.index for c in p.sweep.cells if p.done_already(c)], "serving_now": p.serving,
            "dry_run": p.request.dry_run,
            "preflight": [{**c.to_json(), "cell": where or None} for where, c in preflight_rows(p)]
            if p.request.dry_run else None}


def _result_lines(p: Plan, r: Result) -> list[str]:
    if r.cut:
        return []
    return [*r.report.lines(), f"serving: {r.serving}", f"record: {p.state_file}"]


def _result_json(p: Plan, r: Result) -> dict:
    return {"record": str(p.state_file), "state": dict(r.state), "serving": r.serving,
            "table": None if r.report is None else r.report.to_json()}


COMMAND = Command(("sweep",), Request, plan, apply, plan_lines=_plan_lines, plan_json=_plan_json,
                  result_lines=_result_lines, result_json=_result_json, failure=lambda p, r: r and r.failure,
                  verdict=_verdict,
                  cut=lambda p, r: "" if r is not None and r.cut else None, preview=True,
                  consent=lambda p: any(not p.done_already(c) for c in p.sweep.cells) or p.sweep.final_boot)
