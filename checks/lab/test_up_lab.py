"""`sparkstack up` on the two-host lab: the runbook's twin (checks/lab/test_runbook.py), as one command.

From nothing (the world test_runbook builds: hub and registry stand-ins, host roots, recording tune tools):
1. `up --dry-run --json` with the base unpinned: build is blocked and names `pin base`; the test then runs exactly
   the command it names;
2. a full worker disk: `up --yes` does fetch, strip and build, then stops at ship in one line naming the command
   that re-runs ship alone; nothing lands on the worker;
3. the disk freed, `up` again, cut by Ctrl-C (SIGINT to its process group) while ship is mid-blob: it says what is
   done and what was cut;
4. `up` again: fetch, strip and build are up to date, ship resumes the cut blob from its verified prefix, then
   tune, launch and verify run; each checked on the thing itself, as test_runbook checks it;
5. `up` once more: every stage up to date, and nothing crosses the fabric (its veth counters) but ship's probe.

The hub stand-in listens inside the head's network namespace, where `up` runs (lab.in_netns).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
import shiplab
from clirun import assert_planned, sparkstack_cmd, start
from hub_standin import DRAFTER, MODEL, HubStandin, files_of
from huggingface_hub import scan_cache_dir
from lab import FABRIC_IF, in_netns, machine_processes, veth_bytes
from safetensors.numpy import save_file
from imagefix import layout_digests
from test_runbook import BASE_REF, STRIPPED, TUNE_ACTS, runbook_world  # noqa: F401 (runbook_world: the fixture)

import standins

BIG_BLOB = 160 << 20  # the drafter's extra shard: ship is still inside it when Ctrl-C comes


def up_argv(*extra: str) -> list[str]:
    return ["up", "--recipe", "my-recipe.toml", "--base", "base", "--overlay", "overlay", "--overlay-src", "src",
            "--pins", "pins.json", "--platform", "linux/amd64", "--link-base", "symlink", "--out", "image",
            "--ssh-config", "ssh_config", "--host-root", "hostroot", "--profile", "lab", "--streams", "1",
            "--worker-delay", "0.5", "--health-interval", "0.3", *extra]


def run_up(runbook_world, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess:
    lab, book = runbook_world["lab"], runbook_world["book"]
    proc = subprocess.run(["ip", "netns", "exec", lab.head.netns, *sparkstack_cmd(), *up_argv(*extra)],
                          cwd=runbook_world["work"], env=book.env, capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


def transcript(runbook_world, label: str, proc: subprocess.CompletedProcess, stdout: bool = True) -> None:
    """With SPARKSTACK_UP_TRANSCRIPT=FILE, each shown run's command and output (docs/runbook-lab.md shows them)."""
    path = os.environ.get("SPARKSTACK_UP_TRANSCRIPT")
    if path:
        shown = runbook_world["book"].shown
        with open(path, "a") as f:
            f.write(f"\n## {label} (exit {proc.returncode})\n$ sparkstack {' '.join(proc.args[proc.args.index('up'):])}\n"
                    f"{shown(proc.stdout) if stdout else '[the --json document]' + chr(10)}{shown(proc.stderr)}")


def states(doc: dict) -> dict[str, str]:
    return {s["stage"]: s["state"] for s in doc["stages"]}


def outcomes(doc: dict) -> dict[str, str]:
    return {s["stage"]: s["outcome"] for s in doc["result"]["stages"]}


def big_drafter(runbook_world) -> str:
    """A new drafter commit on the hub with a BIG_BLOB shard beside its own files (written by safetensors)."""
    repo = runbook_world["hub"].repos[DRAFTER]
    files = dict(repo.commits[repo.refs["main"]])
    path = runbook_world["work"] / "big.safetensors"
    save_file({"extra": np.frombuffer(os.urandom(BIG_BLOB), dtype=np.uint8)}, str(path))
    files["extra.safetensors"] = path.read_bytes()
    return repo.commit(files)


@pytest.fixture
def up_world(runbook_world):
    """test_runbook's runbook_world, with the hub stand-in moved into the head's namespace (up fetches from there)."""
    lab = runbook_world["lab"]
    runbook_world["hub"].stop()
    hub = in_netns(lab.head.netns, lambda: HubStandin(runbook_world["hub"].repos).start())
    runbook_world["hub"] = hub
    runbook_world["book"].env["HF_ENDPOINT"] = hub.url
    try:
        yield runbook_world
    finally:
        hub.stop()
        runbook_world["hub"] = HubStandin({}).start()  # what test_runbook's teardown stops


def test_up_from_nothing_through_a_full_disk_and_a_ctrl_c_to_a_verified_pair(up_world):
    runbook_world = up_world
    lab, work, home, book = runbook_world["lab"], runbook_world["work"], runbook_world["home"], runbook_world["book"]
    hf_hub = home / ".cache/huggingface/hub"
    drafter_commit = big_drafter(runbook_world)
    # What up never does itself: the recipe's commits and the overlay's hashes are pinned in the checkout first.
    book.run("fetch --resolve", "fetch", "--resolve", "--recipe", "my-recipe.toml", on_head=True)
    book.run("pin overlay", "pin", "overlay", "--overlay", "overlay", "--overlay-src", "src")
    recipe = tomllib.loads((work / "my-recipe.toml").read_text())
    assert recipe["drafter"]["revision"] == drafter_commit

    # 1. The base unpinned: build is blocked, and names the command that unblocks it; so are the stages needing it.
    shipped = Path(__file__).resolve().parents[2] / "nix/pins.json"  # as the checkout ships it: nothing resolved
    assert json.loads(shipped.read_text())["platforms"] == {}
    (work / "pins.json").write_text(shipped.read_text())
    proc = run_up(runbook_world, "--dry-run", "--json")
    assert_planned(proc)
    plan = json.loads(proc.stdout)
    assert states(plan) == {"fetch": "will run", "strip": "will run", "build": "blocked", "ship": "blocked",
                            "tune": "will run", "launch": "blocked", "verify": "blocked"}, plan
    build = next(s for s in plan["stages"] if s["stage"] == "build")
    # absolute, so that it runs from any directory; shown() takes the lab's work dir off again
    assert build["unblock"] == f"sparkstack pin base {BASE_REF} --platform linux/amd64 --pins {work}/pins.json"
    assert not hf_hub.exists() and not (work / "image").exists()  # a dry run wrote nothing
    book.run("pin base (the unblock command)", *build["unblock"].split()[1:],
             shown_env={"SPARKSTACK_REGISTRY_MIRROR": runbook_world["registry"].url})
    transcript(runbook_world, "up --dry-run (a fresh lab, the base pinned)", run_up(runbook_world, "--dry-run"))
    proc = run_up(runbook_world, "--dry-run", "--json")
    plan = json.loads(proc.stdout)
    assert states(plan) == {"fetch": "will run", "strip": "will run", "build": "will run", "ship": "will run",
                            "tune": "will run", "launch": "will run", "verify": "will run"}, plan
    fetch = next(s for s in plan["stages"] if s["stage"] == "fetch")
    assert fetch["bytes"] > BIG_BLOB and fetch["plan"]["entries"]  # fetch's own plan document, as its dry run has it

    # 2. A full worker disk: fetch, strip and build run; ship stops up with one line; the worker holds nothing new.
    filler = lab.worker.home_mount / "filler"
    free = os.statvfs(lab.worker.home_mount)
    subprocess.run(["fallocate", "-l", str(free.f_bavail * free.f_frsize - (4 << 20)), str(filler)], check=True)
    try:
        proc = run_up(runbook_world, "--yes", "--json")
    finally:
        filler.unlink()
    transcript(runbook_world, "up --yes --json (the worker's disk full)", proc, stdout=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("sparkstack: error:")]
    assert len(errors) == 1 and "up: ship " in errors[0] and "not enough room" in errors[0], proc.stderr
    # a blocked stage names what unblocks it (ship's own dry run, once there is room), not a rerun
    assert ("unblock it: sparkstack ship --recipe my-recipe.toml --ssh-config ssh_config --image image"
            in book.shown(errors[0])), errors[0]
    done = json.loads(proc.stdout)
    assert outcomes(done) == {"fetch": "done", "strip": "done", "build": "done", "ship": "blocked",
                              "tune": "not started", "launch": "not started", "verify": "not started"}
    image = layout_digests(work / "image")
    assert (hf_hub / STRIPPED / "refs/main").read_text() == recipe["model_revision"]
    assert not lab.worker.path(f"{shiplab.WORKER_HUB}/{STRIPPED}").exists()

    # 3. Disk freed; up again, cut by Ctrl-C while the big blob is on its way.
    fab0 = veth_bytes(lab.head, FABRIC_IF)
    proc = start(["ip", "netns", "exec", lab.head.netns, *sparkstack_cmd(), *up_argv("--yes")],
                 cwd=work, env=book.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                 start_new_session=True)
    drafter_blobs = lab.worker.path(f"{shiplab.WORKER_HUB}/models--incoai--GLM-5.3-Flash-DFlash2/blobs")

    def partials() -> list:
        return sorted(drafter_blobs.glob(".*.sparkstack-partial")) if drafter_blobs.is_dir() else []

    deadline = time.monotonic() + 120
    try:
        while True:
            if any(p.exists() and p.stat().st_size >= 16 << 20 for p in partials()):
                break
            assert proc.poll() is None, "up ended before it could be cut: " + proc.communicate()[1]
            assert time.monotonic() < deadline, "ship never began the big blob"
            time.sleep(0.005)
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group, ssh included
    out, err = proc.communicate(timeout=60)
    transcript(runbook_world, "up --yes (Ctrl-C while ship is inside the big blob)",
               subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err
    assert "up: done: " not in err  # nothing was done in this run before ship: earlier stages were up to date
    assert "up to date: fetch, strip, build" in err and "cut: ship" in err, err
    assert "not started: tune, launch, verify" in err and "run `sparkstack up` again" in err, err
    deadline = time.monotonic() + 60
    while machine_processes(lab.worker, b"sparkstack-ship-helper"):
        assert time.monotonic() < deadline, "the cut ship's helper never exited on the worker"
        time.sleep(0.05)
    left = partials()
    assert left and all(0 < p.stat().st_size < BIG_BLOB for p in left), left
    prefix = sum(p.stat().st_size for p in left)

    # 4. Resumed (as a person runs it: no --json; the record holds the same document): the earlier stages up to
    # date, ship from the cut blob's verified prefix, then the rest.
    proc = run_up(runbook_world, "--yes")
    transcript(runbook_world, "up --yes (resumed after the Ctrl-C)", proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    done = {"result": json.loads((home / ".local/state/sparkstack/up/last.json").read_text())}
    assert outcomes(done) == {"fetch": "up to date", "strip": "up to date", "build": "up to date", "ship": "done",
                              "tune": "done", "launch": "done", "verify": "done"}, done
    ship = next(s for s in done["result"]["stages"] if s["stage"] == "ship")
    total_sent = ship["outputs"]["bytes_sent"]["worker"]
    assert ship["outputs"]["bytes_resumed"]["worker"] == prefix > 0
    assert total_sent <= shiplab_total(work, hf_hub) - prefix  # nothing verified before the cut was sent again
    assert partials() == []
    assert veth_bytes(lab.head, FABRIC_IF) - fab0 >= total_sent  # it really crossed the fabric
    held = lab.worker.docker("image", "inspect", "--format", "{{.Id}}", image["config"], check=False)
    assert held.stdout.strip() == image["config"], held.stderr
    scan = scan_cache_dir(lab.worker.path(shiplab.WORKER_HUB))
    assert scan.warnings == []
    assert {r.repo_id: {x.commit_hash for x in r.revisions} for r in scan.repos} == \
        {MODEL + "-no-MTP": {recipe["model_revision"]}, DRAFTER: {drafter_commit}}
    for machine, root in runbook_world["roots"].items():
        acts = [r for r in standins.recorded(work / f"{machine}-record.jsonl") if "--query-gpu" not in " ".join(r)]
        assert acts == TUNE_ACTS, (machine, acts)
        assert (root / "proc/sys/vm/swappiness").read_text() == "0\n"
    for host, name in ((lab.head, "glm53-tony-rank0"), (lab.worker, "glm53-tony-rank1")):
        state = host.docker("inspect", "--format", "{{.State.Status}} {{.Image}}", name).stdout.split()
        assert state == ["running", image["config"]], (name, state)
    verify = next(s for s in done["result"]["stages"] if s["stage"] == "verify")
    assert verify["outputs"]["checks"] >= 6 and verify["outputs"]["run"] == \
        next(s for s in done["result"]["stages"] if s["stage"] == "launch")["outputs"]["run"]

    # launch status reads the record too.
    status = subprocess.run(["ip", "netns", "exec", lab.head.netns, *sparkstack_cmd(), "launch", "status", "--recipe",
                             "my-recipe.toml", "--ssh-config", "ssh_config", "--json"], cwd=work, env=book.env,
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert [s["outcome"] for s in json.loads(status.stdout)["last_up"]["stages"]][-1] == "done"

    # 5. Once more: all up to date, and the fabric carries only ship's probe (no blob, no image).
    transcript(runbook_world, "up --dry-run (the finished lab)", run_up(runbook_world, "--dry-run"))
    proc = run_up(runbook_world, "--dry-run", "--json")
    assert set(states(json.loads(proc.stdout)).values()) == {"up to date"}, proc.stdout
    fab1 = veth_bytes(lab.head, FABRIC_IF)
    proc = run_up(runbook_world, "--yes")
    assert proc.returncode == 0, proc.stderr
    assert "nothing to do" in proc.stdout, proc.stdout
    assert veth_bytes(lab.head, FABRIC_IF) - fab1 < 64 << 10
    acts = [r for r in standins.recorded(work / "head-record.jsonl") if "--query-gpu" not in " ".join(r)]
    assert acts == TUNE_ACTS  # tune did not run again (the page cache is not dropped under a serving pair)


def shiplab_total(work, hf_hub) -> int:
    """Bytes ship has to send in all: the image's blobs and both entries' blobs (the worker held none of them)."""
    image = sum(p.stat().st_size for p in (work / "image/blobs/sha256").iterdir())
    entries = sum(p.stat().st_size for name in (STRIPPED, "models--incoai--GLM-5.3-Flash-DFlash2")
                  for p in (hf_hub / name / "blobs").iterdir())
    return image + entries
