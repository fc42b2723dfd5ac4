"""Apply a launch plan: workers first, then the head; watch the boot; prove the model generates; record the run."""

from __future__ import annotations

import hashlib
import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sparkstack import fsio
from sparkstack.endpoint.client import Endpoint, EndpointError
from sparkstack.errors import SparkstackError
from sparkstack.launch.confirm import Confirmed, Expected, judge, plan_expectations
from sparkstack.deploy import Deployment, runner_for, select_ranks
from sparkstack.launch.plan import LaunchPlan, RankPlan
from sparkstack.launch.preflight import PreflightCheck, all_gate_checks, gate_rank, run_preflight
from sparkstack.launch.report import preflight_verdict
from sparkstack.launch.timeline import (
    KvPool,
    RankTimeline,
    docker_time,
    kv_pool,
    last_lines,
    parse_rank,
    secs,
)
from sparkstack.oci.load import apply_load, plan_load
from sparkstack.remote import FOUND, NOT_THERE, UNREACHABLE, Runner, docker_answer, failure_line, unreachable_reason
from sparkstack.state import launch_runs_dir
from sparkstack.tune.pagecache import drop_page_cache


ABSENT = NOT_THERE  # a rank's state when its docker answered that it has no container of the rank's name


@dataclass(frozen=True)
class Timeouts:
    health_interval_s: float = 10.0
    health_attempts: int = 360
    worker_start_s: float = 120.0
    worker_delay_s: float = 0.0
    log_tail: int = 80


class LaunchFailed(SparkstackError):
    def __init__(self, message: str, logs: dict[int, str], fatal: dict | None = None) -> None:
        super().__init__(message)
        self.logs = logs
        self.fatal = fatal  # a fatal boot line: {"line", "diagnosis", "at_s", "rank"} (sweep's row of a failed cell)


@dataclass
class Boot:
    port_open_s: float | None = None
    health_s: float | None = None
    ttft_s: float | None = None
    seen_lines: list[str] = field(default_factory=list)
    timeline: list[RankTimeline] = field(default_factory=list)
    kv_pool: KvPool | None = None
    expected: tuple[Expected, ...] = ()  # the recipe's expected boot lines, derived for this argv
    confirm: tuple[Confirmed, ...] = ()  # each judged against the head's log once it is healthy

    def to_json(self) -> dict:
        return {"port_open_s": self.port_open_s, "health_s": self.health_s, "ttft_s": self.ttft_s,
                "seen_lines": self.seen_lines, "timeline": [t.to_json() for t in self.timeline],
                "kv_pool": self.kv_pool.to_json() if self.kv_pool else None,
                "confirm": [c.to_json() for c in self.confirm]}


def _docker_run(rank: RankPlan, runner: Runner) -> list[str]:
    argv = list(rank.docker_run)
    if rank.hub.startswith("~"):  # a remote rank's HF_HOME default: expand it on that machine, as the old launcher did
        home = runner.run(["printenv", "HOME"], timeout=30).stdout.strip()
        if not home.startswith("/"):
            raise LaunchFailed(f"rank {rank.rank}: cannot read $HOME on {runner.label} to expand {rank.hub}", {})
        argv = [a.replace(rank.hub, home + rank.hub[1:], 1) if a.startswith(rank.hub + ":") else a for a in argv]
    return runner.docker(*argv[1:])


def _state(runner: Runner, name: str) -> tuple[str, str | None]:
    proc = runner.run_docker("inspect", "--format", "{{.State.Status}} {{.State.StartedAt}}", name, timeout=30)
    if proc.returncode != 0:
        return ABSENT, None
    status, _, started = proc.stdout.strip().partition(" ")
    return status, started


def _logs(runner: Runner, name: str, tail: int) -> str:
    proc = runner.run_docker("logs", "--tail", str(tail), name, timeout=30)
    return (proc.stdout + proc.stderr) if proc.returncode == 0 else f"(no logs: {failure_line(proc)})"


def _started_epoch(started: str | None) -> float:
    return docker_time(started) if started else time.time()


def all_logs(plan: LaunchPlan, runners: dict[int, Runner], tail: int) -> dict[int, str]:
    return {r.rank: _logs(runners[r.rank], r.name, tail) for r in plan.ranks}


def remove_leftover(rank: RankPlan, runner: Runner, on_event: Callable[[str], None]) -> None:
    """The container of this rank's name that an earlier launch left (its rank label, not running), removed as the
    seed's launcher did with `docker rm -f`; preflight refused every other kind already."""
    found = rank_container(runner, rank.name)
    if found.answer == FOUND and found.label == str(rank.rank) and found.state != "running":
        proc = runner.run_docker("rm", "-f", rank.name, timeout=60)
        if proc.returncode != 0:
            raise LaunchFailed(f"rank {rank.rank}: cannot remove {rank.name} left from an earlier launch: "
                               f"{failure_line(proc)}", {})
        on_event(f"rank {rank.rank}: removed {rank.name} ({found.state}), left from an earlier launch")


def start_rank(rank: RankPlan, runner: Runner, env: dict) -> list[str]:
    """Start one rank's container; returns the docker argv that ran (a remote `~` expanded)."""
    argv = _docker_run(rank, runner)
    proc = runner.run(argv, timeout=300, env=env)
    if proc.returncode != 0:
        raise LaunchFailed(f"rank {rank.rank} did not start on {runner.label}: {failure_line(proc)}", {})
    return argv


def drop_caches(plan: LaunchPlan, runners: dict[int, Runner], ranks: list[int],
                on_event: Callable[[str], None]) -> None:
    """sync and drop the page cache on every rank being started (the seed launcher does it on both nodes):
    on unified memory, the page cache counts against the GPU's free memory at engine start."""
    for rank in ranks:
        runner = runners[rank].for_root()  # `sudo -n` where the user is not root, as tune and the guard
        failed = drop_page_cache(runner)
        if failed:
            argv, proc = failed
            raise LaunchFailed(f"rank {rank}: `{' '.join(argv)}` failed on {runner.label}: {failure_line(proc)}", {})
        on_event(f"rank {rank}: page cache dropped on {runner.label}")


def wait_running(rank: RankPlan, runner: Runner, t: Timeouts) -> None:
    deadline = time.monotonic() + t.worker_start_s
    while time.monotonic() < deadline:
        status, started = _state(runner, rank.name)
        if status == "running":
            return
        if status in ("exited", "dead", ABSENT):
            # A container that died of a fatal line before we looked gets that line's diagnosis, as in the boot wait.
            proc = runner.run_docker("logs", "--timestamps", rank.name, timeout=60)
            logs = proc.stdout + proc.stderr if proc.returncode == 0 else ""
            tl = parse_rank(rank.rank, logs, _started_epoch(started))
            if tl.fatal:
                raise _fatal_line(rank.rank, tl.fatal, logs, t)
            raise LaunchFailed(f"rank {rank.rank} container {rank.name} is {status} right after start",
                               {rank.rank: _logs(runner, rank.name, t.log_tail)})
        time.sleep(0.5)
    raise LaunchFailed(f"rank {rank.rank} container {rank.name} not running after {t.worker_start_s:.0f} s",
                       {rank.rank: _logs(runner, rank.name, t.log_tail)})


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _head(plan: LaunchPlan, api_key: str | None = None, timeout: float = 120.0) -> Endpoint:
    return Endpoint(f"http://127.0.0.1:{plan.api_port}", api_key, timeout)


def head_health_code(plan: LaunchPlan) -> int:
    """The head's /health status within 5 s; EndpointError when nothing answers."""
    head = _head(plan)
    try:
        return head.health_code(timeout=5)
    finally:
        head.close()


def first_token_s(plan: LaunchPlan, api_key: str | None) -> float:
    """One streamed chat request to the head; seconds until its first generated token (reasoning counts: GLM thinks
    first, and 8 tokens may hold no content at all)."""
    body = {"model": plan.knobs["SERVED_NAME"], "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 8, "temperature": 1.0, "top_p": 0.95}
    head = _head(plan, api_key)
    try:
        result = head.stream_chat(body)
    finally:
        head.close()
    if result.first_token_s is None:
        raise SparkstackError("chat stream ended without a token")
    return result.first_token_s


def read_timeline(plan: LaunchPlan, runners: dict[int, Runner]) -> dict[int, tuple[RankTimeline, str, str]]:
    """Each rank's timeline so far, with its container state and its whole timestamped log."""
    out = {}
    for rank in plan.ranks:
        runner = runners[rank.rank]
        status, started = _state(runner, rank.name)
        proc = runner.run_docker("logs", "--timestamps", rank.name, timeout=60)
        logs = proc.stdout + proc.stderr if proc.returncode == 0 else ""
        out[rank.rank] = (parse_rank(rank.rank, logs, _started_epoch(started)), status, logs)
    return out


def _report_progress(boot: Boot, now: dict[int, tuple[RankTimeline, str, str]], on_event: Callable[[str], None]) -> None:
    """Announce what each rank reached since the last poll: new phases, new warnings, the head's confirm lines."""
    before = {t.rank: t for t in boot.timeline}
    for rank, (tl, _, logs) in sorted(now.items()):
        old = before.get(rank)
        for phase, at in tl.phases:
            if old is None or phase not in dict(old.phases):
                kv = f" (Available KV cache memory: {tl.kv_gib} GiB)" if phase == "KV profiled" and tl.kv_gib else ""
                on_event(f"rank {rank}: {phase} at {secs(at)}{kv}")
        for w in tl.warnings[len(old.warnings) if old else 0:]:
            on_event(f"rank {rank}: warning at {secs(w.at_s)}: {w.text} ({w.diagnosis})")
        if rank == 0:
            for c in judge(boot.expected, logs):
                if c.status == "seen" and c.line not in boot.seen_lines:
                    boot.seen_lines.append(c.line)
                    on_event(f"seen: {c.line}")
    boot.timeline = [tl for _, (tl, _, _) in sorted(now.items())]


def _fatal_line(rank: int, fatal, logs: str, t: Timeouts) -> LaunchFailed:
    return LaunchFailed(f"rank {rank}: fatal boot line at {secs(fatal.at_s)}: {fatal.text[:200]!r}: {fatal.diagnosis}",
                        {rank: last_lines(logs, t.log_tail)},
                        {"line": fatal.text[:200], "diagnosis": fatal.diagnosis, "at_s": fatal.at_s, "rank": rank})


def _check_boot(plan: LaunchPlan, runners: dict[int, Runner], now: dict[int, tuple[RankTimeline, str, str]],
                t: Timeouts) -> None:
    """A fatal line ends the wait at once, with that rank's last lines; so does a container that is not running."""
    for rank, (tl, status, logs) in sorted(now.items()):
        if tl.fatal:
            raise _fatal_line(rank, tl.fatal, logs, t)
    for rank, (tl, status, logs) in sorted(now.items()):
        if status != "running":
            name = plan.ranks[rank].name
            raise LaunchFailed(f"rank {rank} container {name} is {status} during boot", all_logs(plan, runners, t.log_tail))


# How often the boot watch reads every rank's log and state (a `docker logs` and an inspect each, over ssh for a
# worker). /health is asked every --health-interval; reading the logs that often took CPU from the boot it watched
# on a small machine (on the lab's pair, at a 0.5 s interval, the head reached /health 5-6 s after a bare start of
# the same two containers). So the looks spread out as the boot ages: a fatal line is seen within a tenth of the
# boot's age (early deaths, the common ones, at once), and never more than BOOT_LOOK_MAX_S late.
BOOT_LOOK_MAX_S = 3.0
BOOT_LOOK_SHARE = 0.1


def next_look_gap(age_s: float, interval_s: float) -> float:
    """Seconds from this look at the ranks' logs to the next, `age_s` into the boot watch."""
    return min(BOOT_LOOK_MAX_S, max(interval_s, BOOT_LOOK_SHARE * age_s))


def watch_boot(plan: LaunchPlan, runners: dict[int, Runner], t: Timeouts, api_key: str | None,
               on_event: Callable[[str], None], on_poll: Callable[[], None] | None = None) -> Boot:
    """`on_poll` runs once per round, before the ranks are looked at (the memory guard)."""
    head = plan.ranks[0]
    _, started = _state(runners[0], head.name)
    t0 = _started_epoch(started)
    boot = Boot(expected=plan_expectations(plan))
    watching = time.monotonic()
    look_at = watching  # when the ranks' logs and states are read next
    for _ in range(t.health_attempts):
        if on_poll is not None:
            on_poll()
        if time.monotonic() >= look_at:
            now_s = time.monotonic()
            look_at = now_s + next_look_gap(now_s - watching, t.health_interval_s)
            now = read_timeline(plan, runners)
            _report_progress(boot, now, on_event)
            _check_boot(plan, runners, now, t)
        if boot.port_open_s is None and _port_open(plan.api_port):
            boot.port_open_s = round(time.time() - t0, 3)
            on_event(f"port {plan.api_port} open after {boot.port_open_s:.1f} s")
        try:
            healthy = head_health_code(plan) == 200
        except EndpointError:
            healthy = False
        if healthy:  # /health, never /v1/models: that one answers 200 with a dead engine
            boot.health_s = round(time.time() - t0, 3)
            on_event(f"/health 200 after {boot.health_s:.1f} s")
            try:
                ttft = first_token_s(plan, api_key)
            except SparkstackError as exc:
                raise LaunchFailed(f"healthy, but no first token: {exc}", all_logs(plan, runners, t.log_tail)) from None
            boot.ttft_s = round(time.time() - t0, 3)
            on_event(f"first token after {boot.ttft_s:.1f} s (request itself {ttft:.2f} s)")
            now = read_timeline(plan, runners)
            _report_progress(boot, now, on_event)  # the lines printed since the last poll
            boot.kv_pool = kv_pool(plan, boot.timeline)
            boot.confirm = judge(boot.expected, now[0][2]) if 0 in now else ()
            for c in boot.confirm:
                if c.status != "seen":  # verify judges them (fail or warn, as the recipe says); launch reports
                    on_event(f"{c.status}: {c.expected.text}" + (f" (the boot says {c.line!r})" if c.line else "")
                             + f"; verify will {c.expected.missing}")
            return boot
        time.sleep(t.health_interval_s)
    now = read_timeline(plan, runners)  # a last look: a fatal line since then is the better diagnosis
    _report_progress(boot, now, on_event)
    _check_boot(plan, runners, now, t)
    raise LaunchFailed(f"no /health 200 after {t.health_attempts} x {t.health_interval_s:g} s",
                       all_logs(plan, runners, t.log_tail))


def boot_id(image_id: str, model_revision: str | None, drafter_revision: str | None,
            argvs: list[list[str]] | tuple[tuple[str, ...], ...]) -> str:
    """A boot's identity: the image's ID, the served revisions and every rank's planned docker argv. Two launches
    with the same id boot the same thing (sweep reuses a boot on it)."""
    doc = {"image": image_id, "model": model_revision, "drafter": drafter_revision, "argv": [list(a) for a in argvs]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def run_id(plan: LaunchPlan, image_id: str) -> str:
    return boot_id(image_id, plan.model_revision, plan.drafter_revision, [list(r.docker_run) for r in plan.ranks])


def write_record(plan: LaunchPlan, image_id: str, boot: Boot | None, ran: dict[int, list[str]]) -> Path:
    """`ran` is the argv each started rank really ran (after a remote `~` was expanded)."""
    rid = run_id(plan, image_id)
    record = {
        "id": rid, "recipe": plan.recipe.name, "image": plan.image, "image_id": image_id,
        "model_revision": plan.model_revision, "drafter_revision": plan.drafter_revision,
        "ranks": [{"rank": r.rank, "host": r.host, "name": r.name, "docker_run": ran[r.rank]}
                  for r in plan.ranks if r.rank in ran],
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "boot": None if boot is None else boot.to_json(),
        # What verify reports of the running pair beside what it asks the API.
        "api_port": plan.api_port, "model": plan.recipe.model, "served_name": plan.knobs["SERVED_NAME"],
        "drafter": {"repo": plan.recipe.drafter_repo, "licence": plan.recipe.drafter_licence},
    }
    d = launch_runs_dir()
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{rid}.json"
    try:  # `launch 1`, then `launch 0`: one run (the same id), so the record keeps the ranks started before
        earlier = json.loads(path.read_text())
    except (OSError, ValueError):
        earlier = None
    if isinstance(earlier, dict) and isinstance(earlier.get("ranks"), list):
        kept = [r for r in earlier["ranks"] if isinstance(r, dict) and r.get("rank") not in ran]
        record["ranks"] = sorted(kept + record["ranks"], key=lambda r: r["rank"])
    fsio.write_atomic(path, (json.dumps(record, indent=2) + "\n").encode())
    fsio.write_atomic(d / "latest", rid.encode())
    return path


def latest_record() -> dict | None:
    d = launch_runs_dir()
    try:
        return json.loads((d / f"{(d / 'latest').read_text().strip()}.json").read_text())
    except (OSError, ValueError):
        return None


def load_built_image(plan: LaunchPlan, runner: Runner, on_event: Callable[[str], None]) -> None:
    """`launch --image LAYOUT`: stream the built image into the head's engine unless it already holds it."""
    lp = plan_load(plan.image_layout, "docker", runner)
    if lp.up_to_date:
        on_event(f"rank 0: {plan.image} is already loaded")
        return
    on_event(f"rank 0: {lp.action} {plan.image_layout} into docker on {runner.label}")
    apply_load(lp, runner)


def launch(plan: LaunchPlan, runners: dict[int, Runner], ranks: list[int], t: Timeouts, environ: dict,
           on_event: Callable[[str], None], drop: bool = False,
           on_poll: Callable[[], None] | None = None) -> tuple[Path, Boot | None]:
    """Start `ranks` (workers first, then the head) and, when the head is among them, wait for readiness
    (calling `on_poll` once per round of that wait)."""
    env = dict(environ)
    if plan.image_layout is not None and 0 in ranks:
        load_built_image(plan, runners[0], on_event)  # before dropping caches: loading fills the page cache
    if drop:
        drop_caches(plan, runners, ranks, on_event)
    ran: dict[int, list[str]] = {}
    for rank in sorted((r for r in plan.ranks if r.rank in ranks and r.rank != 0), key=lambda r: r.rank):
        remove_leftover(rank, runners[rank.rank], on_event)
        on_event(f"starting rank {rank.rank} on {runners[rank.rank].label}")
        ran[rank.rank] = start_rank(rank, runners[rank.rank], env)
        wait_running(rank, runners[rank.rank], t)
        on_event(f"rank {rank.rank} running")
    boot = None
    if 0 in ranks:
        if ran and t.worker_delay_s > 0:  # the workers run already (wait_running); a pause only when asked for
            on_event(f"waiting {t.worker_delay_s:g} s before the head")
            time.sleep(t.worker_delay_s)
        remove_leftover(plan.ranks[0], runners[0], on_event)
        on_event("starting rank 0 (head)")
        ran[0] = start_rank(plan.ranks[0], runners[0], env)
        boot = watch_boot(plan, runners, t, environ.get("VLLM_API_KEY"), on_event, on_poll)
    proc = runners[ranks[0]].run_docker("image", "inspect", "--format", "{{.Id}}", plan.image, timeout=30)
    image_id = proc.stdout.strip() if proc.returncode == 0 else "unknown"
    return write_record(plan, image_id, boot, ran), boot


# ---------------------------------------------------------------- the command: what `sparkstack launch` runs


def runners_for(plan: LaunchPlan, ssh_config: Path | None) -> dict[int, Runner]:
    """One runner per rank: here for the head, over ssh (with `ssh_config`) for the others."""
    return {rank.rank: runner_for(rank, ssh_config) for rank in plan.ranks}


def preflight(plan: LaunchPlan, target: str, host_root: Path, runners: dict[int, Runner], probe: bool, force: bool,
              gates: bool, environ: dict, dry_run: bool) -> tuple[list[RankPlan], list[PreflightCheck]]:
    """The ranks TARGET names, and the preflight checks. The ranks (their docker, over ssh) are asked only on a
    real run, or on a dry run with --probe."""
    selected = select_ranks(plan, target)
    checks = run_preflight(plan, host_root, runners if (probe or not dry_run) else None, force, gates, dict(environ),
                           dry_run=dry_run, launching=tuple(r.rank for r in selected))
    return selected, checks


@dataclass(frozen=True)
class Started:
    record: Path
    boot: Boot | None
    guard: object | None  # the memory guard that watched the boot (launch.guard.MemoryGuard), if asked for


def late_gates(plan: LaunchPlan, runners: dict[int, Runner], checks: list[PreflightCheck],
               on_event: Callable[[str], None], launching: list[int]) -> None:
    """The gates preflight left for later because the head did not hold the image yet (`--image LAYOUT`, as `up`
    passes it): load the image there now and run them, in seconds, before any rank starts a 15-minute boot."""
    if plan.image_layout is None or not any(c.name == "gate" and c.status == "skip" for c in checks):
        return
    if gate_rank(tuple(launching)) != 0:  # a worker without the image failed preflight's image check already
        return
    load_built_image(plan, runners[0], on_event)
    proc = runners[0].run_docker("image", "inspect", "--format", "{{.Id}}", plan.image, timeout=30)
    late = all_gate_checks(plan, runners[0], proc.stdout.strip() if proc.returncode == 0 else None)
    for c in late:
        on_event(c.line())
    verdict = preflight_verdict(late)
    if verdict:
        raise SparkstackError(verdict)


def start(plan: LaunchPlan, runners: dict[int, Runner], selected: list[RankPlan], checks: list[PreflightCheck], t: Timeouts,
          environ: dict, on_event: Callable[[str], None], drop: bool, memory_guard_gib: float | None,
          host_root: Path, gates: bool = False) -> Started:
    """A failed preflight is the error; else start the selected ranks, with the memory guard polled while they
    boot when asked for (`memory_guard_gib`)."""
    verdict = preflight_verdict(checks)
    if verdict:
        raise SparkstackError(verdict)
    ranks = [r.rank for r in selected]
    if gates:
        late_gates(plan, runners, checks, on_event, ranks)
    guard = None
    if memory_guard_gib is not None:
        from sparkstack.launch.guard import memory_guard

        guard = memory_guard(runners, ranks, str(host_root.absolute()), memory_guard_gib, on_event)
    record, boot = launch(plan, runners, ranks, t, dict(environ), on_event, drop=drop, on_poll=guard)
    return Started(record, boot, guard)


def stop_commands(plan: LaunchPlan, runners: dict[int, Runner],
                  ranks: tuple[int, ...] | None = None) -> list[tuple[int, str, list[str]]]:
    """What `stop` runs, as data: (rank, where, argv), head first, then the workers over the management network.
    `ranks`: only these (`launch N stop`); None: every rank."""
    return [(rank.rank, runners[rank.rank].label, runners[rank.rank].docker("rm", "-f", rank.name)) for rank in plan.ranks
            if ranks is None or rank.rank in ranks]


RANK_LABEL = "org.sparkstack.rank"  # set on every container launch starts (plan.docker_run)
_LABELLED = f'{{{{.State.Status}}}} {{{{index .Config.Labels "{RANK_LABEL}"}}}}'


@dataclass(frozen=True)
class Container:
    """What a rank's docker said of the container of its name: `answer` is remote's FOUND, NOT_THERE or
    UNREACHABLE; with FOUND its state and rank label ("" when sparkstack did not start it); with UNREACHABLE why."""

    answer: str
    state: str = ""
    label: str = ""
    reason: str = ""


def rank_container(runner: Runner, name: str) -> Container:
    proc = runner.run_docker("inspect", "--type", "container", "--format", _LABELLED, name, timeout=30)
    answer = docker_answer(proc)
    if answer == NOT_THERE:
        return Container(NOT_THERE)
    if answer == UNREACHABLE:
        return Container(UNREACHABLE, reason=unreachable_reason(runner, proc))
    state, _, label = proc.stdout.strip().partition(" ")
    return Container(FOUND, state, "" if label == "<no value>" else label)


def stop(plan: LaunchPlan, runners: dict[int, Runner], on_event: Callable[[str], None],
         ranks: tuple[int, ...] | None = None) -> list[str]:
    """Carry out stop_commands, removing only containers launch started for that rank. Each rank's line says
    "removed", "not there" (its docker answered so) or "could not reach" with the reason and the command to run by
    hand. Returns the failures: a rank not reached, or a container sparkstack did not start, is never "stopped"."""
    failures = []
    for rank_no, where, argv in stop_commands(plan, runners, ranks):
        rank, runner = plan.ranks[rank_no], runners[rank_no]
        found = rank_container(runner, rank.name)
        if found.answer == NOT_THERE:
            on_event(f"rank {rank_no} on {where}: {rank.name} not there")
            continue
        if found.answer == FOUND and found.label != str(rank_no):
            failures.append(f"rank {rank_no} on {where}: a container named {rank.name} exists but sparkstack did not "
                            f"start it as rank {rank_no} ({RANK_LABEL}={found.label or 'absent'}); left as it is")
            on_event(f"rank {rank_no} on {where}: {rank.name} left as it is (not started by sparkstack)")
            continue
        proc = runner.run(argv, timeout=60) if found.answer == FOUND else None
        if proc is not None and docker_answer(proc) != UNREACHABLE:
            on_event(f"rank {rank_no} on {where}: {rank.name} {'removed' if proc.returncode == 0 else 'not there'}")
            continue
        if proc is not None and proc.returncode == 1 and "Error response from daemon" in (proc.stderr or ""):
            refused = failure_line(proc)  # docker answered, and would not remove it: reached, not removed
            on_event(f"rank {rank_no} on {where}: {rank.name} not removed: docker refused: {refused}")
            on_event(f"  stop it by hand: {runner.by_hand(argv)}")
            failures.append(f"rank {rank_no} on {where}: docker refused to remove {rank.name} ({refused}); "
                            f"stop it by hand: {runner.by_hand(argv)}")
            continue
        reason = found.reason if proc is None else unreachable_reason(runner, proc)
        on_event(f"rank {rank_no} on {where}: could not reach: {reason}")
        on_event(f"  stop it by hand: {runner.by_hand(argv)}")
        failures.append(f"rank {rank_no} on {where}: could not reach its docker; {rank.name} may still run "
                        f"(stop it by hand: {runner.by_hand(argv)})")
    return failures


def status(plan: LaunchPlan | Deployment, runners: dict[int, Runner]) -> tuple[list[dict], dict | None]:
    """Each rank's state, image ID, uptime and (head) health; and the last run record."""
    out = []
    record = latest_record()
    for rank in plan.ranks:
        r = runners[rank.rank]
        proc = r.run_docker("inspect", "--type", "container", "--format",
                            "{{.State.Status}} {{.State.StartedAt}} {{.Image}}", rank.name, timeout=30)
        row = {"rank": rank.rank, "host": rank.host, "name": rank.name, "state": ABSENT, "image_id": None,
               "started_at": None, "uptime_s": None, "health": None}
        fields = proc.stdout.split() if proc.returncode == 0 else []
        answer = docker_answer(proc)
        if answer == FOUND and len(fields) == 3:
            state, started, image = fields
            row.update(state=state, image_id=image)
            if state == "running":  # started_at exactly as docker says it (soak compares two of them)
                row.update(started_at=_started_epoch(started), uptime_s=round(time.time() - _started_epoch(started)))
        elif answer != NOT_THERE:  # not reached, or an answer that does not read: nothing is known of the rank
            why = unreachable_reason(r, proc) if answer == UNREACHABLE else f"docker said {proc.stdout.strip()!r}"
            row["state"] = f"{UNREACHABLE}: {why}"
        if rank.rank == 0 and row["state"] == "running":
            try:
                row["health"] = head_health_code(plan)
            except EndpointError as exc:
                row["health"] = f"unreachable ({exc.kind})"
        out.append(row)
    return out, record
