"""`--dry-run` never acts, for any command.

The command list comes from the click group itself, so a new command without an
entry here fails `test_every_command_is_covered`. Recording stand-ins for docker,
ssh, rsync, nvidia-smi, sysctl and sync sit first on PATH; under --dry-run only
read-only calls may reach them, and no file may change in the working dir,
HOME, the state and cache dirs, the HF hub, or the source and destination trees.
The same commands without --dry-run must act (a recorded write call, or a
changed tree): that proves the recorder and the snapshots can see an act.
"""

import hashlib
import json
import os
import shlex
import stat
import subprocess
from pathlib import Path

import click
import pytest

import hostfix
import imagefix as fx
import standins
import synth
from inprocess_engine import serving
from hub_standin import DRAFTER, MODEL, HubStandin, recipe_copy, synthetic_repos
from registry_standin import Standin, fixture_repo
from clirun import sparkstack_cmd
from sparkstack.cli import main

# Calls that only read. Anything else recorded under --dry-run is an act.
READ_ONLY_DOCKER = {"inspect", "ps", "images", "logs", "version"}
READ_ONLY_PROGRAMS = {"printenv", "id"}


# command path -> (argument lists, each run with and without --dry-run; True when the command never acts)
INVOCATIONS = {
    ("strip",): ([["{model}", "--out", "{strip_out}"]], False),
    ("image", "build"): ([["--base", "{base}", "--overlay", "{overlay}", "--overlay-src", "{src}", "--out", "{image_out}"]], False),
    ("image", "verify"): ([["{base}"]], True),
    ("patch", "check"): ([["--base", "{base}", "--overlay", "{overlay}", "--overlay-src", "{src}"]], True),
    ("pin", "overlay"): ([["--overlay", "{unpinned_overlay}", "--overlay-src", "{src}"]], False),
    # pin base/fetch talk to the registry stand-in (SPARKSTACK_REGISTRY_MIRROR): reads only under --dry-run.
    ("pin", "base"): ([["--pins", "{pins_unresolved}"], ["{registry_ref}", "--platform", "linux/amd64",
                                                          "--pins", "{pins_unresolved}"]], False),
    ("pin", "fetch"): ([["{pinned_layer}", "--pins", "{pins_resolved}", "--out", "{fetch_out}"]], False),
    ("image", "pull"): ([["--pins", "{pins_resolved}", "--out", "{pull_out}"]], False),
    ("image", "load"): ([["{base}"], ["{base}", "--host", "rank1"], ["{base}", "--engine", "podman"]], False),
    ("launch",): ([["0", "{launch}"], ["all", "{launch}"], ["all", "--drop-caches", "{launch}"], ["stop", "{launch}"],
                   ["0", "--probe", "--gates", "{launch}"]], False),
    # plan kv only plans, unless --write records a boot's measurement in the recipe (a copy here).
    ("plan", "kv"): ([["--from-boot", "{kv_boot_log}", "--write", "--recipe", "{unpinned_recipe}"]], False),
    # ssh runs the helper here (the stand-in); under --dry-run it may only ask docker version/inspect and read.
    ("ship",): ([["rank1", "--image", "{base}"], ["rank1", "--image", "{base}", "--no-weights", "--streams", "1"]], False),
    # verify only asks the API stand-in (world's engine); under --dry-run it may not even ask (checked below).
    ("verify",): ([["{engine_url}"]], True),
    # tune reads files, `id -u` and `nvidia-smi --query-gpu` under --dry-run; rank 1 over ssh, as a non-root user.
    ("tune",): ([["--host-root", "{untuned_root}"], ["1", "--host-root", "{untuned_root}"]], False),
    # soak's real run sends chat requests (the engine counts them) and writes its log; top only reads /metrics.
    ("soak",): ([["{engine_url}", "--duration", "2s", "--max-requests", "2", "--health-interval", "0.2"]], False),
    ("top",): ([["{engine_url}", "--once", "--interval", "0.1"]], True),
    # bench streams chats to the API stand-in and writes its plot; under --dry-run it may not even ask (below).
    ("bench",): ([["{engine_url}", "--concurrency", "1,2", "--rounds", "1", "--category", "count",
                   "--plot", "{bench_plot}"]], False),
    ("compare",): ([["{bench_report}", "{bench_report}"]], True),
    # fetch talks to the hub stand-in (HF_ENDPOINT): under --dry-run it may only ask (model_info), never write.
    ("fetch",): ([["--recipe", "{pinned_recipe}"], ["--recipe", "{unpinned_recipe}", "--resolve"]], False),
    # up plans every stage (tune and ship ask rank 1 over ssh, launch its docker: reads) and, for real, fetches.
    ("up",): ([["--recipe", "{pinned_recipe}", "--until", "fetch", "--yes", "--host-root", "{host_root}"]], False),
    # sweep plans every cell's launch and asks the ranks' docker what serves (reads); for real, stops and starts.
    ("sweep",): ([["--vary", "NUM_SPEC_TOKENS=2,4", "--yes", "--bench-rounds", "1", "{launch}"]], False),
}
LAUNCH_OPTS = ["--host-root", "{host_root}", "--health-attempts", "1", "--health-interval", "0", "--worker-delay", "0"]


def command_paths(group: click.Group, prefix=()) -> set[tuple[str, ...]]:
    """Every leaf, through click's own listing (the lazy group loads each as it is named)."""
    paths = set()
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            paths |= command_paths(cmd, prefix + (name,))
        else:
            paths.add(prefix + (name,))
    return paths


def lookup(path: tuple[str, ...]) -> click.Command:
    cmd = main
    for name in path:
        cmd = cmd.get_command(click.Context(cmd), name)
    return cmd


def test_every_command_is_covered():
    assert command_paths(main) == set(INVOCATIONS), "add the new command to INVOCATIONS"


@pytest.mark.parametrize("path", sorted(INVOCATIONS))
def test_every_command_takes_dry_run(path):
    assert "dry_run" in {p.name for p in lookup(path).params}, f"{' '.join(path)} has no --dry-run"


@pytest.fixture
def all_commands_world(tmp_path):
    w = {"tmp": tmp_path}
    bin_dir = tmp_path / "bin"
    standins.install(bin_dir)
    home = tmp_path / "home"
    home.mkdir()
    hostfix.write_hub(tmp_path / "hf")
    synth.write_model_dir(tmp_path / "flat")
    entry = synth.cache_from_dir(tmp_path / "flat", tmp_path / "models" / "hub", repo_id="org/model")
    base = tmp_path / "base"
    fx.write_base(base)
    src = fx.write_overlay_source(tmp_path / "src")
    w.update(
        bin=bin_dir, home=home, work=tmp_path / "work", log=tmp_path / "calls.jsonl",
        model=entry, strip_out=tmp_path / "stripped", base=base, src=src, image_out=tmp_path / "image",
        overlay=fx.write_overlay(tmp_path / "overlay", pinned_from=src / "overlay-dflash2"),
        unpinned_overlay=fx.write_overlay(tmp_path / "overlay-unpinned"),
        host_root=hostfix.write_host(tmp_path / "hostroot"),
        untuned_root=hostfix.write_host(tmp_path / "untuned-hostroot", tuned=False),
    )
    w["work"].mkdir()
    repos, served = fixture_repo(tmp_path / "registry")
    standin = Standin(repos).start()
    arm = served.platforms["linux/arm64"]
    layer = served.layouts["linux/arm64"] / "blobs/sha256" / arm["layers"][0].split(":")[1]
    desc = lambda d, size=1: {"digest": d, "mediaType": "application/octet-stream", "size": size}  # noqa: E731
    ref = f"ghcr.io/{served.repo}:{served.tag}"
    w.update(registry_ref=ref, pinned_layer=arm["layers"][0], fetch_out=tmp_path / "fetched-layer", pull_out=tmp_path / "pulled",
             pins_unresolved=tmp_path / "pins-unresolved.json", pins_resolved=tmp_path / "pins-resolved.json")
    stale = {"digest": "sha256:" + "0" * 64, "mediaType": None, "size": None}
    w["pins_unresolved"].write_text(json.dumps({"reference": ref, "registry": "ghcr.io", "repository": served.repo,
                                                "resolved": stale, "platforms": {}}))
    w["pins_resolved"].write_text(json.dumps({
        "reference": ref, "registry": "ghcr.io", "repository": served.repo,
        "resolved": {"digest": served.index, "mediaType": "application/vnd.oci.image.index.v1+json",
                     "size": served.index_size},
        "platforms": {"linux/arm64": {"manifest": desc(arm["manifest"]), "config": desc(arm["config"]),
                                      "layers": [desc(arm["layers"][0], layer.stat().st_size)]}}}))
    w["env"] = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD_LOG": str(w["log"]), "HOME": str(home),
        "HF_HOME": str(tmp_path / "hf"), "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"), "SPARKSTACK_CACHE_DIR": str(tmp_path / "cache" / "sparkstack"),
        "SPARKSTACK_STATE_DIR": str(tmp_path / "state" / "sparkstack"), "SOURCE_DATE_EPOCH": "0",
        "STANDIN_REMOTE_UID": "1000",
    }
    for knob in ("VLLM_API_KEY", "SPARKSTACK_RECIPES", "SPARKSTACK_OVERLAY_SRC"):
        w["env"][knob] = ""
    w["env"]["SPARKSTACK_REGISTRY_MIRROR"] = standin.url
    w.update(bench_plot=tmp_path / "bench.png", bench_report=tmp_path / "bench.json")
    w["bench_report"].write_text(json.dumps({"suite_version": "1", "settings": {
        "url": "http://127.0.0.1:8888", "model": "m", "concurrency": [1], "rounds": 1, "max_tokens": 8,
        "temperature": 1.0, "top_p": 0.95, "categories": []}, "cells": []}))
    repos = synthetic_repos(tmp_path / "hub-repos")
    hub = HubStandin(repos).start()
    w["env"]["HF_ENDPOINT"] = hub.url
    w["pinned_recipe"] = recipe_copy(tmp_path / "pinned.toml", repos[MODEL].refs["main"], repos[DRAFTER].refs["main"])
    w["unpinned_recipe"] = recipe_copy(tmp_path / "unpinned.toml")
    w["kv_boot_log"] = tmp_path / "head.log"
    w["kv_boot_log"].write_text("INFO 09-01 10:08:45 [gpu_worker.py:227] Available KV cache memory: 4.60 GiB\n"
                                "INFO 09-01 10:08:46 [kv_cache_utils.py:716] GPU KV cache size: 481,488 tokens\n")
    with serving() as engine:  # the API server commands that verify, bench or watch an endpoint talk to
        w.update(engine=engine, engine_url=engine.url)
        yield w
    standin.stop()
    hub.stop()


def expand(args: list[str], w: dict) -> list[str]:
    out = []
    for a in args:
        if a == "{launch}":
            out += expand(LAUNCH_OPTS, w)
        elif a.startswith("{") and a.endswith("}"):
            out.append(str(w[a[1:-1]]))
        else:
            out.append(a)
    return out


def tree_state(root: Path) -> dict[str, tuple]:
    """Every entry under `root`: its type, size, mtime and content hash (or link target)."""
    state = {}
    if not root.exists():
        return state
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                state[str(p)] = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                state[str(p)] = ("file", st.st_size, st.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            else:
                state[str(p)] = ("dir", st.st_mtime_ns)
    return state


def snapshot(w: dict) -> dict[str, tuple]:
    """The whole tmp tree except the stand-ins' own log: cwd, HOME, state, cache, hub, sources and destinations."""
    state = tree_state(w["tmp"])
    state.pop(str(w["log"]), None)
    return state


def recorded(w: dict) -> list[list[str]]:
    return standins.recorded(w["log"])


def is_read_only(call: list[str]) -> bool:
    name, args = call[0], call[1:]
    if name == "ssh":
        return True  # its remote command is recorded (and judged) separately, as the stand-in runs it here
    if name in READ_ONLY_PROGRAMS:
        return True
    if name == "nvidia-smi":
        return all(a.startswith(("--query-gpu=", "--format=")) for a in args)
    if name not in ("docker", "podman"):  # podman's version/inspect/images read like docker's
        return False
    if args[:1] == ["-H"]:
        args = args[2:]
    if args[:1] == ["image"]:
        args = args[1:]
    return bool(args) and args[0] in READ_ONLY_DOCKER


def run(w: dict, path: tuple[str, ...], args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **w["env"], **(env or {}))
    return subprocess.run(sparkstack_cmd() + list(path) + args, cwd=w["work"], env=env, capture_output=True,
                          text=True, timeout=300)


CASES = [(path, i) for path, (arg_lists, _) in sorted(INVOCATIONS.items()) for i in range(len(arg_lists))]


@pytest.mark.parametrize("path,case", CASES, ids=[" ".join(p) + f"#{i}" for p, i in CASES])
def test_dry_run_acts_on_nothing_and_the_real_run_acts(all_commands_world, path, case):
    arg_lists, read_only = INVOCATIONS[path]
    args = expand(arg_lists[case], all_commands_world)
    before = snapshot(all_commands_world)
    proc = run(all_commands_world, path, args + ["--dry-run"])
    assert proc.returncode in (0, 1), proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    acts = [c for c in recorded(all_commands_world) if not is_read_only(c)]
    assert acts == [], f"--dry-run acted: {acts}"
    assert all_commands_world["engine"].requests_seen == [], "--dry-run sent requests to the API server"
    after = snapshot(all_commands_world)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert changed == [], f"--dry-run changed files: {changed[:5]}"

    # The same command for real: the recorder or the snapshot must see it act (unless it only ever reads).
    all_commands_world["log"].unlink(missing_ok=True)
    proc = run(all_commands_world, path, args)
    assert "Traceback" not in proc.stderr, proc.stderr
    acts = [c for c in recorded(all_commands_world) if not is_read_only(c)]
    real_after = snapshot(all_commands_world)
    changed = sorted(k for k in set(after) | set(real_after) if after.get(k) != real_after.get(k))
    sent = all_commands_world["engine"].c["requests"]
    if read_only:  # it may fill its cache, but acts on nothing else
        cache = str(all_commands_world["tmp"] / "cache")
        assert acts == [] and [c for c in changed if not c.startswith(cache)] == [], (acts, changed[:5])
    else:
        assert acts or changed or sent, f"{' '.join(path)} without --dry-run did nothing visible: {proc.stderr}"


def test_recorder_sees_each_rank_drop_caches_and_stop(all_commands_world):
    """The acts a real `launch all --drop-caches` and `launch stop` make, rank by rank (one rank over ssh)."""
    run(all_commands_world, ("launch",), ["all", "--drop-caches", *expand(["{launch}"], all_commands_world)])
    calls = recorded(all_commands_world)
    drops = [c for c in calls if c[:3] == ["sysctl", "-w", "vm.drop_caches=3"]]
    ssh_drops = [c for c in calls if c[0] == "ssh" and shlex.split(c[-1]) == ["sudo", "-n", "sysctl", "-w", "vm.drop_caches=3"]]
    assert len(drops) == 2 and len(ssh_drops) == 1, calls  # head locally, the worker through ssh (not root there: sudo -n)
    # The gates' throwaway containers come first (preflight, `--rm`); the ranks' own start detached.
    first_run = next(i for i, c in enumerate(calls) if "run" in c and "-d" in c and c[0] == "docker")
    assert max(calls.index(d) for d in drops) < first_run  # caches dropped before any rank's container starts
    all_commands_world["log"].unlink()
    run(all_commands_world, ("launch",), ["stop", *expand(["{launch}"], all_commands_world)])
    rms = [c for c in recorded(all_commands_world) if c[0] == "docker" and "rm" in c]
    assert [c[-1] for c in rms] == ["glm53-tony-rank0", "glm53-tony-rank1"]


def test_stop_never_removes_a_container_it_did_not_start(all_commands_world):
    """NAME=postgres: a container by that name exists on every rank, but without launch's rank label."""
    proc = run(all_commands_world, ("launch",), ["stop", *expand(["{launch}"], all_commands_world)], env={"NAME": "postgres"})
    assert proc.returncode == 1 and "sparkstack did not start it" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert [c for c in recorded(all_commands_world) if "rm" in c] == []


@pytest.mark.parametrize("label", ["[[]]", "[1]", "null", '"abc"', "[[\"\"]]", "{}"])
def test_a_hostile_gates_label_is_refused_not_run(all_commands_world, label):
    proc = run(all_commands_world, ("launch",), ["0", "--gates", *expand(["{launch}"], all_commands_world)], env={"STANDIN_GATES_LABEL": label})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "is not a list of argv lists" in proc.stdout + proc.stderr
    # Nothing the label names runs; the vLLM argv gate (preflight's own script, not the label's) may.
    from sparkstack.launch.preflight import ARGV_GATE
    assert [c for c in recorded(all_commands_world) if c[0] == "docker" and "run" in c and ARGV_GATE not in c] == []


# The plans that ask no host anything: they read local files, the hub's or a registry's HTTP API, or nothing, and
# start no process (not even a read-only one). The others ask read-only and say so in ARCHITECTURE.md: launch reads
# the head's nvidia-smi (and, with --probe, each rank's docker over ssh), tune each rank's facts, ship what each
# host has, image load the engine's version and images, and up and sweep plan launch (up with --probe).
PLANS_RUN_NO_PROCESS = [
    ("bench",), ("compare",), ("fetch",), ("image", "build"), ("image", "pull"), ("image", "verify"),
    ("patch", "check"), ("pin", "base"), ("pin", "fetch"), ("pin", "overlay"), ("plan", "kv"), ("soak",),
    ("strip",), ("top",), ("verify",),
]
NO_PROCESS_CASES = [(path, i) for path, i in CASES if path in PLANS_RUN_NO_PROCESS] + [(("launch",), 3)]  # stop


def dry_run_in_process(w: dict, path: tuple[str, ...], args: list[str], monkeypatch) -> list[list[str]]:
    """The command's --dry-run through the click group in this process; returns every process it started
    (Popen's one way in, so subprocess.run, plumbum and remote.Runner are all seen)."""
    from click.testing import CliRunner

    started = []
    real = subprocess.Popen._execute_child

    def recording(self, argv, *rest, **kw):
        started.append([argv] if isinstance(argv, (str, bytes)) else [str(a) for a in argv])
        return real(self, argv, *rest, **kw)

    monkeypatch.setattr(subprocess.Popen, "_execute_child", recording)
    monkeypatch.chdir(w["work"])
    result = CliRunner().invoke(main, [*path, *args, "--dry-run"], env=w["env"], catch_exceptions=False)
    assert result.exit_code in (0, 1), result.output
    return started


@pytest.mark.parametrize("path,case", NO_PROCESS_CASES, ids=[" ".join(p) + f"#{i}" for p, i in NO_PROCESS_CASES])
def test_these_plans_run_no_process(all_commands_world, path, case, monkeypatch):
    args = expand(INVOCATIONS[path][0][case], all_commands_world)
    assert dry_run_in_process(all_commands_world, path, args, monkeypatch) == []


def test_the_process_recorder_sees_a_probing_plan(all_commands_world, monkeypatch):
    """`launch 0 --probe --dry-run` asks the ranks' docker over ssh: the recorder must see it, or the test above
    proves nothing."""
    args = expand(INVOCATIONS[("launch",)][0][4], all_commands_world)
    assert "--probe" in args
    started = dry_run_in_process(all_commands_world, ("launch",), args, monkeypatch)
    assert any(Path(c[0]).name == "ssh" for c in started), started
