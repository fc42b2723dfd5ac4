"""`sparkstack up` on one machine: the plan's states and what blocks what, the run record, and a real fetch and
strip through `up` against the hub stand-in. The two-host run is checks/lab/test_up_lab.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from clirun import sparkstack_cmd
from hub_standin import DRAFTER, MODEL, HubStandin, recipe_copy, synthetic_repos
from safetensors import safe_open

import synth
from sparkstack.errors import UsageError
from sparkstack.up import plan as up_plan
from sparkstack.up.plan import BLOCKED, UP_TO_DATE, WILL_RUN, Stage, stage_range

REF = "ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8"
SHIPPED_PINS = Path(__file__).resolve().parents[2] / "nix/pins.json"


def stage(name: str, state: str, **kw) -> Stage:
    return Stage(name, state, f"{name} says so", ("sparkstack", name), **kw)


def test_stage_range_is_the_runbook_order_and_refuses_nonsense():
    assert stage_range(None, None, False) == ("fetch", "strip", "build", "ship", "tune", "launch", "verify")
    assert stage_range("ship", "launch", True) == ("ship", "tune", "launch")
    assert stage_range(None, None, True)[-1] == "bench"
    with pytest.raises(UsageError, match="--from bench"):
        stage_range("bench", None, False)  # bench is a stage only with --bench
    with pytest.raises(UsageError, match="comes after"):
        stage_range("launch", "fetch", False)


def test_a_stage_waits_for_what_will_run_and_is_blocked_by_what_is_blocked():
    earlier = {"fetch": stage("fetch", WILL_RUN), "strip": stage("strip", WILL_RUN),
               "build": stage("build", BLOCKED, unblock=("sparkstack", "pin", "base", REF))}
    held = up_plan._held_back("ship", ("sparkstack", "ship"), earlier)
    assert held.state == BLOCKED and held.after == ("build",) and held.unblock == ("sparkstack", "pin", "base", REF)
    # launch needs build and ship; ship is not planned yet here, build is up to date: it waits for strip via ship
    earlier = {"fetch": stage("fetch", UP_TO_DATE), "strip": stage("strip", WILL_RUN), "build": stage("build", UP_TO_DATE),
               "ship": stage("ship", WILL_RUN)}
    held = up_plan._held_back("launch", ("sparkstack", "launch"), earlier)
    assert held.state == WILL_RUN and held.after == ("strip", "ship")
    assert up_plan._held_back("strip", ("x",), {"fetch": stage("fetch", UP_TO_DATE)}) is None


def test_verify_counts_as_done_only_against_the_very_launch_that_serves_now():
    launch = stage("launch", UP_TO_DATE, outputs={"run": "r1", "head_started_at": 1700.5})
    record = {"stages": [{"stage": "verify", "outcome": "done",
                          "outputs": {"run": "r1", "head_started_at": 1700.5, "checks": 7}}]}
    assert up_plan._checked_for("verify", {"launch": launch}, record)["checks"] == 7
    restarted = stage("launch", UP_TO_DATE, outputs={"run": "r1", "head_started_at": 1800.0})
    assert up_plan._checked_for("verify", {"launch": restarted}, record) is None  # same run, restarted since
    assert up_plan._checked_for("verify", {"launch": stage("launch", WILL_RUN, outputs=launch.outputs)}, record) is None
    failed = {"stages": [{**record["stages"][0], "outcome": "failed"}]}
    assert up_plan._checked_for("verify", {"launch": launch}, failed) is None


@pytest.fixture
def world(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    refused = tmp_path / "ssh_config"  # every worker refuses at once: no DNS, no wait
    refused.write_text("Host *\n  HostName 127.0.0.1\n  Port 9\n  BatchMode yes\n  ConnectTimeout 2\n")
    pins = tmp_path / "pins.json"
    shipped = json.loads(SHIPPED_PINS.read_text())
    assert shipped["reference"] == REF and shipped["platforms"] == {}  # as the checkout ships it: unresolved
    pins.write_text(SHIPPED_PINS.read_text())
    env = {**os.environ, "HOME": str(home), "HF_HOME": str(home / "hf"), "SPARKSTACK_STATE_DIR": str(tmp_path / "state"),
           "SPARKSTACK_RECIPES": "", "VLLM_API_KEY": ""}
    for knob in ("IMAGE", "MODEL_CACHE_NAME", "DRAFT_CACHE_NAME", "WORKER_SSH"):
        env.pop(knob, None)
    return {"tmp": tmp_path, "home": home, "env": env, "ssh_config": refused, "pins": pins}


def up(world, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([*sparkstack_cmd(), "up", "--pins", str(world["pins"]), "--ssh-config",
                           str(world["ssh_config"]), *args], cwd=world["tmp"], env={**world["env"], **(env or {})},
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def by_stage(doc: dict) -> dict[str, dict]:
    return {s["stage"]: s for s in doc["stages"]}


def test_dry_run_json_names_each_blocked_stage_and_the_command_that_unblocks_it(world):
    proc = up(world, "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    stages = by_stage(json.loads(proc.stdout))
    assert list(stages) == ["fetch", "strip", "build", "ship", "tune", "launch", "verify"]
    assert stages["fetch"]["state"] == "blocked" and stages["fetch"]["unblock"] == "sparkstack fetch --resolve"
    assert stages["build"]["state"] == "blocked"
    assert "not pinned for linux/arm64" in stages["build"]["detail"]
    assert stages["build"]["unblock"] == f"sparkstack pin base {REF} --platform linux/arm64 --pins {world['pins']}"
    assert stages["strip"]["state"] == "blocked" and stages["strip"]["after"] == ["fetch"]
    assert stages["launch"]["unblock"] == stages["build"]["unblock"]  # launch waits for build: build's unblock
    assert stages["tune"]["state"] == "blocked" and "worker-node" in stages["tune"]["detail"]
    assert not (world["home"] / "hf").exists() and not (world["tmp"] / "state").exists()


def test_off_a_terminal_up_needs_yes_and_applies_nothing(world):
    proc = up(world)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1].startswith("sparkstack: error: not a terminal: pass --yes")
    assert not (world["tmp"] / "state").exists()
    proc = up(world, "--from", "launch", "--until", "fetch")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr


def test_up_fetches_and_strips_then_says_up_to_date_and_resumes_nothing(world, tmp_path):
    repos = synthetic_repos(tmp_path / "repos")
    recipe = recipe_copy(tmp_path / "recipe.toml", repos[MODEL].refs["main"], repos[DRAFTER].refs["main"])
    with HubStandin(repos) as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "", "HF_HUB_OFFLINE": ""}
        proc = up(world, "--recipe", str(recipe), "--until", "strip", "--dry-run", "--json", env=env)
        stages = by_stage(json.loads(proc.stdout))
        assert (stages["fetch"]["state"], stages["strip"]["state"]) == ("will run", "will run")
        assert stages["strip"]["after"] == ["fetch"]
        files = [b for r in (MODEL, DRAFTER) for b in repos[r].commits[repos[r].refs["main"]].values()]
        assert stages["fetch"]["bytes"] == sum(map(len, files))  # every file of both commits: the cache is empty
        assert {stages[s]["state"] for s in ("build", "ship", "tune", "launch", "verify")} == {"skipped"}

        proc = up(world, "--recipe", str(recipe), "--until", "strip", "--yes", "--json", env=env)
        assert proc.returncode == 0, proc.stderr
        result = {s["stage"]: s["outcome"] for s in json.loads(proc.stdout)["result"]["stages"]}
        assert (result["fetch"], result["strip"]) == ("done", "done")
        gets = len(hub.requests("get"))
        hub_dir = world["home"] / "hf/hub"
        snap = hub_dir / "models--LibertAIDAI--GLM-5.3-Flash-NVFP4-no-MTP/snapshots" / repos[MODEL].refs["main"]
        kept = set()
        for shard in snap.glob("*.safetensors"):
            with safe_open(shard, "np") as f:
                kept |= set(f.keys())
        assert kept == {s.name for specs in synth.DEFAULT_SHARDS.values() for s in specs if not s.mtp}

        # Again: both up to date, nothing downloaded, and the record says what the first run did.
        proc = up(world, "--recipe", str(recipe), "--until", "strip", "--dry-run", "--json", env=env)
        stages = by_stage(json.loads(proc.stdout))
        assert (stages["fetch"]["state"], stages["strip"]["state"]) == ("up to date", "up to date")
        last = json.loads(proc.stdout)["last_run"]
        assert [s["outcome"] for s in last["stages"]][:2] == ["done", "done"]
        proc = up(world, "--recipe", str(recipe), "--until", "strip", "--yes", env=env)
        assert proc.returncode == 0 and "nothing to do" in proc.stdout, proc.stdout + proc.stderr
        assert len(hub.requests("get")) == gets
    record = Path(world["tmp"] / "state/up/last.json")
    assert json.loads(record.read_text())["stages"][0]["stage"] == "fetch"
