"""`sparkstack launch` (rank N, all, stop, status) and `sparkstack plan kv`: the command objects."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sparkstack.errors import SparkstackError, UsageError
from sparkstack.command import Command, View, argument, embed, option, request
from sparkstack.options import image_option, recipe_option
from sparkstack.tune.command import host_root_option, ssh_config_option

PROFILES = ("production", "lab")


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """How launch starts the ranks: `up` and `sweep` embed these, with these defaults and help."""

    image: str | None = image_option(
        help="A built OCI layout (loaded on the head where missing, run by its content-addressed tag) or an image "
             "reference. The IMAGE environment knob wins over it; it wins over the recipe.")
    profile: str = option("production", "--profile", kind=("choice", PROFILES), show_default=True,
                          help="lab drops --gpus, --ulimit memlock and --device /dev/infiniband, which the lab lacks.")
    gates: bool = option(True, "--gates", kind="toggle", show_default=True,
                         help="Before any rank starts, run in throwaway containers of the image (seconds, on the "
                              "head): its vLLM's own argument parser on every rank's engine argv, and its runtime "
                              "import gates (--gates is the default and still accepted; --no-gates skips them).")
    health_interval: float = option(10.0, "--health-interval", kind=("float", 0, 3600), env="HEALTH_INTERVAL",
                                    show_default=True, help="Seconds between /health polls.")
    health_attempts: int = option(360, "--health-attempts", kind=("int", 1, 1_000_000), env="HEALTH_ATTEMPTS",
                                  show_default=True, help="How many /health polls before giving up.")
    worker_delay: float = option(0.0, "--worker-delay", kind=("float", 0, 3600), env="WORKER_DELAY",
                                 show_default=True,
                                 help="Seconds to pause once the workers run, before the head starts (the blog "
                                      "paused 20; vLLM's rendezvous waits for either side).")


@request
class Request:
    target: str = argument(metavar="TARGET")
    action: str | None = argument(None, metavar="[stop]")  # `launch 1 stop`: stop that rank only, as the seed's launcher
    recipe: str | None = recipe_option()
    _image: object = embed(LaunchOptions, only=("image",))
    dry_run: bool = option(False, "--dry-run", kind="flag",
                           help="Print the plan and preflight from local facts; start or stop nothing.")
    as_json: bool = option(False, "--json", kind="flag")
    probe: bool = option(False, "--probe", kind="flag",
                         help="With --dry-run: also ask every rank's docker (over ssh) for image and containers.")
    _profile: object = embed(LaunchOptions, only=("profile",))
    host_root: Path = host_root_option("Read host facts (/sys, /proc) below this root.")
    ssh_config: Path | None = ssh_config_option()
    force: bool = option(False, "--force", kind="flag", help="Launch a recipe marked blocked.")
    _gates: object = embed(LaunchOptions, only=("gates",))
    drop_caches: bool = option(False, "--drop-caches", kind="flag",
                               help="sync and drop the page cache on every rank before starting it.")
    memory_guard: float | None = option(None, "--memory-guard", kind=("float?", 0, 1 << 20, 8.0), metavar="[=GIB]",
                                        help="While ranks boot, drop caches and compact memory on a rank whose "
                                             "MemFree falls under GIB (8 when no value is given).")
    _boot: object = embed(LaunchOptions, only=("health_interval", "health_attempts", "worker_delay"))


@dataclass(frozen=True)
class Plan:
    request: Request
    launch: object  # launch.plan.LaunchPlan
    runners: Mapping[int, object] = field(compare=False, repr=False)
    selected: tuple = ()  # a dry run of a launch: the ranks TARGET names ...
    checks: tuple = ()  # ... and preflight from local facts (and the ranks' docker, with --probe)
    stops: tuple = ()  # a dry run of stop: (rank, where, argv)
    stopping: tuple[int, ...] | None = None  # the ranks a stop acts on; None: every rank (up and sweep, relaunching)
    environ: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)  # secrets pass by name


def verb_of(r: Request) -> str:
    """What TARGET [ACTION] asks: "launch" (rank N or all), "stop" (`stop`, `N stop`, `all stop`) or "status"."""
    if r.action is None:
        return r.target if r.target in ("stop", "status") else "launch"
    if r.action != "stop" or r.target in ("stop", "status"):
        hint = ""
        if r.target in ("stop", "status") and (r.action.isdigit() or r.action == "all"):  # the words swapped
            hint = f"; did you mean `sparkstack launch {r.action} {r.target}`?" if r.target == "stop" else \
                f"; status shows every rank: `sparkstack launch status`"
        raise UsageError(f"TARGET [stop]: after a rank or `all` only `stop` may follow; got {r.target!r} {r.action!r}"
                         + hint)
    return "stop"


def stop_ranks(lp, r: Request) -> tuple[int, ...]:
    from sparkstack.deploy import select_ranks

    return tuple(rank.rank for rank in (lp.ranks if r.action is None else select_ranks(lp, r.target)))


def plan(request: Request, environ: Mapping[str, str], deployment=None) -> Plan:
    """`deployment`: the one `up` loaded already (with its image), else the request's."""
    from sparkstack.launch import apply as launch_apply
    from sparkstack.launch.plan import plan_launch

    r = request
    if deployment is None:
        from sparkstack.deploy import load_deployment

        deployment = load_deployment(r.recipe, environ, r.image)
    verb = verb_of(r)
    lp = plan_launch(deployment, environ, r.profile)
    runners = launch_apply.runners_for(lp, r.ssh_config)
    env = dict(environ)
    stopping = stop_ranks(lp, r) if verb == "stop" else None
    if verb == "launch":  # stop and status must work whatever the knobs say
        from sparkstack.launch.kv import pool_too_small
        from sparkstack.launch.preflight import context_refusal

        refused = context_refusal(lp, environ) or pool_too_small(lp, environ)
        if refused:
            raise SparkstackError(refused)
    if not r.dry_run or verb == "status":
        return Plan(r, lp, runners, environ=env, stopping=stopping)
    if verb == "stop":
        return Plan(r, lp, runners, stops=tuple(launch_apply.stop_commands(lp, runners, stopping)), environ=env,
                    stopping=stopping)
    selected, checks = launch_apply.preflight(lp, r.target, r.host_root, runners, r.probe, r.force, r.gates, env,
                                              True)
    return Plan(r, lp, runners, tuple(selected), tuple(checks), environ=env)


@dataclass(frozen=True)
class Stopped:
    events: tuple[str, ...]
    failures: tuple[str, ...]


@dataclass(frozen=True)
class Status:
    rows: tuple[Mapping[str, object], ...]
    last_run: Mapping[str, object] | None
    last_up: Mapping[str, object] | None
    planned_kv: object = None  # recipe.kv.KvPlan of the deployment as it stands (None: its argv gave none)


def stop(p: Plan, view: View) -> Stopped:
    from sparkstack.launch import apply as launch_apply

    events: list[str] = []

    def event(line: str) -> None:
        events.append(line)
        view.say(line)

    return Stopped(tuple(events), tuple(launch_apply.stop(p.launch, p.runners, event, p.stopping)))


def relaunch(p: Plan, view: View, stop_first: bool = True):
    """Stop what runs on the plan's ranks, then start them: the one stop-then-launch (`up`'s launch stage, each cell
    of `sweep`). A stop that fails ends it before anything starts."""
    if stop_first:
        stopped = stop(p, view)
        if stopped.failures:
            raise SparkstackError("; ".join(stopped.failures))
    return apply(p, view)


def status(p: Plan) -> Status:
    from sparkstack.launch import apply as launch_apply
    from sparkstack.state import read_up_record

    rows, last_run = launch_apply.status(p.launch, p.runners)
    return Status(tuple(rows), last_run, read_up_record(), _planned_kv(p.launch))


def _planned_kv(lp):
    """The KV plan status sets beside the last boot's measurement; None when the argv's KV flags do not read (status
    still shows the ranks)."""
    from sparkstack.launch.kv import plan_launch_kv

    try:
        return plan_launch_kv(lp)
    except SparkstackError:
        return None


def apply(p: Plan, view: View):
    from sparkstack.launch import apply as launch_apply

    r = p.request
    if verb_of(r) == "stop":
        return stop(p, view)
    if verb_of(r) == "status":
        return status(p)
    selected, checks = launch_apply.preflight(p.launch, r.target, r.host_root, p.runners, r.probe, r.force, r.gates,
                                              dict(p.environ), False)
    for c in checks:
        view.say(c.line())
    timeouts = launch_apply.Timeouts(health_interval_s=r.health_interval, health_attempts=r.health_attempts,
                                     worker_delay_s=r.worker_delay)
    try:
        return launch_apply.start(p.launch, p.runners, selected, checks, timeouts, dict(p.environ), view.say,
                                  r.drop_caches, r.memory_guard, r.host_root, gates=r.gates)
    except launch_apply.LaunchFailed as exc:
        for rank, text in sorted(exc.logs.items()):
            view.note(f"--- rank {rank} log (last lines) ---")
            for line in text.rstrip().splitlines():
                view.note(line)
        raise


def _plan_json(p: Plan) -> dict:
    from sparkstack.launch import report

    if verb_of(p.request) == "stop":
        return {"would_run": [{"rank": rank, "on": on, "argv": argv} for rank, on, argv in p.stops]}
    return report.dry_run_document(p.launch, p.request.target, list(p.selected), list(p.checks),
                                   p.request.drop_caches)


def _plan_lines(p: Plan) -> list[str]:
    from sparkstack.launch import report

    if verb_of(p.request) == "stop":
        return report.stop_lines(list(p.stops))
    return report.dry_run_lines(p.launch, list(p.selected), list(p.checks), p.request.drop_caches)


def _result_json(p: Plan, result) -> dict:
    if isinstance(result, Stopped):
        return {"stopped": list(result.events), "failures": list(result.failures)}
    if isinstance(result, Status):
        return {"ranks": list(result.rows), "last_run": result.last_run, "last_up": result.last_up}
    return {"record": str(result.record), "boot": None if result.boot is None else result.boot.to_json(),
            "memory_guard": None if result.guard is None else result.guard.fired}


def _result_lines(p: Plan, result) -> list[str]:
    from sparkstack.launch import report

    if isinstance(result, Stopped):
        return []  # said as they happened
    if isinstance(result, Status):
        return [*report.status_lines(list(result.rows), result.last_run, planned_kv=result.planned_kv),
                *report.last_up_lines(result.last_up)]
    return report.started_lines(result)


def _failure(p: Plan, result) -> str | None:
    if isinstance(result, Status):  # a rank not reached is not "absent": its state is unknown, said in its row
        from sparkstack.remote import UNREACHABLE

        lost = [str(row["rank"]) for row in result.rows if str(row["state"]).startswith(UNREACHABLE)]
        return f"status of rank(s) {', '.join(lost)} unknown: could not reach their docker (see above)" if lost else None
    return "; ".join(result.failures) if isinstance(result, Stopped) and result.failures else None


def _verdict(p: Plan):
    """A dry run of a launch: its preflight counted; stop's has no checks, so no verdict."""
    from sparkstack.checkline import Verdict

    if verb_of(p.request) == "stop":
        return None
    failed = next((c for c in p.checks if c.status == "fail"), None)
    return Verdict.of(f"sparkstack launch {p.request.target}", (c.status for c in p.checks),
                      "" if failed is None else failed.line().split(None, 1)[1])


COMMAND = Command(("launch",), Request, plan, apply, plan_lines=_plan_lines, plan_json=_plan_json,
                  result_lines=_result_lines, result_json=_result_json, failure=_failure, verdict=_verdict,
                  dry=lambda r: r.dry_run and verb_of(r) != "status")  # status only reads: --dry-run changes nothing


# ---------------------------------------------------------------- what serves now (for `up`)

@dataclass(frozen=True)
class Serving:
    """What the ranks run now, against what a launch plan would start."""

    run_id: str  # the run the plan would start
    image_id: str | None
    rows: tuple[Mapping[str, object], ...]  # launch status's rows
    last_run: Mapping[str, object] | None  # launch's latest run record

    @property
    def current(self) -> bool:
        """Every rank running the plan's image, under the plan's very run, and the head healthy."""
        return (bool(self.rows) and all(r["state"] == "running" and r["image_id"] == self.image_id for r in self.rows)
                and self.rows[0]["health"] == 200 and self.last_run is not None
                and self.last_run.get("id") == self.run_id)

    @property
    def head_started_at(self) -> object:
        return self.rows[0]["started_at"] if self.rows else None

    @property
    def present(self) -> tuple[int, ...]:
        from sparkstack.launch.apply import ABSENT

        return tuple(int(r["rank"]) for r in self.rows if r["state"] != ABSENT)


def serving(p: Plan) -> Serving:
    from sparkstack.launch import apply as launch_apply

    rows, last_run = launch_apply.status(p.launch, p.runners)
    image_id = p.launch.image_config_digest
    return Serving(launch_apply.run_id(p.launch, image_id or "unknown"), image_id, tuple(rows), last_run)


# ---------------------------------------------------------------- plan kv

@dataclass(frozen=True, kw_only=True)
class KvRequest:
    recipe: str | None = recipe_option()
    kv_bytes: int | None = option(None, "--kv-bytes", kind=("int", 0, None),
                                  help="KV pool bytes (default: the recipe's KV pin).")
    from_boot: str | None = option(None, "--from-boot", kind="path?", metavar="[LOG]",
                                   help="Put a boot's measured KV pool and tokens beside the plan: launch's latest run "
                                        "record (no value), or LOG (a run record, or the head's `docker logs`).")
    write: bool = option(False, "--write", kind="flag",
                         help="With --from-boot: record the measurement in the recipe as [kv.boot] (comments kept); "
                              "a pinned boot also becomes the recipe's per-token cost.")
    dry_run: bool = option(False, "--dry-run", kind="flag", help="With --write: say what it would write, write "
                                                                 "nothing (plan kv alone only ever plans).")
    as_json: bool = option(False, "--json", kind="flag")


@dataclass(frozen=True)
class KvCommandPlan:
    request: KvRequest
    kv: object  # recipe.kv.KvPlan
    calibration: object = None  # launch.calibrate.Calibration (--from-boot)
    entry: object = None  # recipe.KvBoot, what --write records
    recipe_path: Path | None = None


def _measure(from_boot: str):
    from sparkstack.errors import SparkstackError
    from sparkstack.launch.apply import latest_record
    from sparkstack.launch.calibrate import measure_record, read_boot_file
    from sparkstack.state import launch_runs_dir

    if from_boot:
        return read_boot_file(Path(from_boot))
    record = latest_record()
    if record is None:
        raise SparkstackError(f"no launch run record under {launch_runs_dir()}: launch first, or name a boot log: "
                              "--from-boot LOG")
    return measure_record(record)


def _plan_kv(request: KvRequest, environ: Mapping[str, str]) -> KvCommandPlan:
    import datetime

    from sparkstack.deploy import load_deployment
    from sparkstack.errors import UsageError
    from sparkstack.launch.calibrate import calibrate, kv_boot_entry
    from sparkstack.launch.kv import plan_launch_kv
    from sparkstack.launch.plan import plan_launch
    from sparkstack.recipe import refuse_installed_recipe

    r = request
    if r.write and r.from_boot is None:
        raise UsageError("--write records a boot's measurement: give --from-boot (the latest run) or --from-boot LOG")
    lp = plan_launch(load_deployment(r.recipe, environ), environ)
    kv = plan_launch_kv(lp, r.kv_bytes)
    if r.from_boot is None:
        return KvCommandPlan(r, kv)
    cal = calibrate(kv, _measure(r.from_boot))
    if not r.write:
        return KvCommandPlan(r, kv, cal)
    refuse_installed_recipe(lp.recipe, _rerun_on_copy(r))
    entry = kv_boot_entry(cal.measured, datetime.date.today().isoformat())
    return KvCommandPlan(r, kv, cal, entry, lp.recipe.path)


def _rerun_on_copy(request: KvRequest) -> tuple[str, ...]:
    """The command the user ran, written back without its --recipe: what to run on a copy of a recipe that cannot
    be written (the refusal adds the copy's --recipe)."""
    return PLAN_KV.argv(dataclasses.replace(request, recipe=None))


def _apply_kv(p: KvCommandPlan, view: View) -> bool:
    """--write: [kv.boot] into the recipe; whether the pinned pool also became its per-token cost."""
    from sparkstack.recipe import load_recipe, write_kv_boot

    return write_kv_boot(load_recipe(p.request.recipe), p.entry, _rerun_on_copy(p.request))


def _entry_line(p: KvCommandPlan, written: bool | None) -> str:
    e = p.entry
    table = ", ".join(f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {v}" for k, v in e.toml().items())
    cost = (f"; and [kv] measured_bytes = {e.pool_bytes}, measured_tokens = {e.tokens} (a pinned pool is exact: "
            "the plan's per-token cost from now on)") if e.pool == "pin" else ""
    said = "would write" if written is None else "wrote"
    return f"{said} [kv.boot] in {p.recipe_path}: {table}{cost}"


def _kv_lines(p: KvCommandPlan, written: bool | None = None) -> list[str]:
    lines = list(p.kv.lines())
    if p.calibration is not None:
        lines += ["", "from the boot:", *p.calibration.lines()]
    if p.entry is not None:
        lines.append(_entry_line(p, written))
    return lines


def _kv_json(p: KvCommandPlan, written: bool | None = None) -> dict:
    doc = p.kv.to_json()
    if p.calibration is None:
        return doc
    doc = {"plan": doc, "calibration": p.calibration.to_json()}
    if p.entry is not None:
        doc |= {"recipe": str(p.recipe_path), "kv_boot": p.entry.to_json(), "written": written is not None,
                "per_token_cost_moved": p.entry.pool == "pin"}
    return doc


PLAN_KV = Command(("plan", "kv"), KvRequest, _plan_kv, _apply_kv, plan_lines=_kv_lines, plan_json=_kv_json,
                  result_lines=_kv_lines, result_json=_kv_json, dry=lambda r: r.dry_run or not r.write)
