"""`sparkstack up` on one machine: the plan's states and what blocks what, the run record, and a real fetch and
strip through `up` against the hub stand-in. The two-host run is checks/lab/test_up_lab.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from clirun import assert_planned, sparkstack_cmd, start
from inprocess_engine import wait_for
from hub_standin import DRAFTER, MODEL, HubStandin, recipe_copy, synthetic_repos
from safetensors import safe_open

import synth
from sparkstack.errors import UsageError
from sparkstack.up import plan as up_plan
from sparkstack.up.plan import BLOCKED, SKIPPED, UP_TO_DATE, WILL_RUN, Stage, stage_range

REF = "ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8"
SHIPPED_PINS = Path(__file__).resolve().parents[2] / "nix/pins.json"


def stage(name: str, state: str, **kw) -> Stage:
    return Stage(name, state, f"{name} says so", f"sparkstack {name}", **kw)


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
               "build": stage("build", BLOCKED, unblock=f"sparkstack pin base {REF}")}
    held = up_plan._held_back("ship", "sparkstack ship", earlier)
    assert held.state == BLOCKED and held.after == ("build",) and held.unblock == f"sparkstack pin base {REF}"
    # launch needs build and ship; ship is not planned yet here, build is up to date: it waits for strip via ship
    earlier = {"fetch": stage("fetch", UP_TO_DATE), "strip": stage("strip", WILL_RUN), "build": stage("build", UP_TO_DATE),
               "ship": stage("ship", WILL_RUN)}
    held = up_plan._held_back("launch", "sparkstack launch", earlier)
    assert held.state == WILL_RUN and held.after == ("strip", "ship")
    assert up_plan._held_back("strip", "x", {"fetch": stage("fetch", UP_TO_DATE)}) is None


def test_a_stage_left_out_by_from_or_until_holds_back_what_needs_it_as_a_block_does():
    """`up --from launch` with ship not up to date: launch must not run on images or weights the workers lack."""
    earlier = {"fetch": stage("fetch", SKIPPED), "strip": stage("strip", SKIPPED), "build": stage("build", UP_TO_DATE),
               "ship": stage("ship", SKIPPED), "tune": stage("tune", SKIPPED)}
    held = up_plan._held_back("launch", "sparkstack launch", earlier)
    assert held is not None and held.state == BLOCKED and held.after == ("ship",)
    assert held.detail == "needs ship, which is left out by --from/--until and not up to date"
    assert held.unblock == "sparkstack ship"  # ship's own command


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
    # a verify the last up found up to date passed earlier against this launch: still done, not run again
    kept = {"stages": [{**record["stages"][0], "outcome": "up to date"}]}
    assert up_plan._checked_for("verify", {"launch": launch}, kept)["checks"] == 7
    assert up_plan._checked_for("bench", {"launch": launch}, {"stages": [{**kept["stages"][0], "stage": "bench"}]})


@pytest.fixture
def up_world(tmp_path):
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


def up(up_world, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([*sparkstack_cmd(), "up", "--pins", str(up_world["pins"]), "--ssh-config",
                           str(up_world["ssh_config"]), *args], cwd=up_world["tmp"], env={**up_world["env"], **(env or {})},
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def by_stage(doc: dict) -> dict[str, dict]:
    return {s["stage"]: s for s in doc["stages"]}


def test_dry_run_json_names_each_blocked_stage_and_the_command_that_unblocks_it(up_world):
    proc = up(up_world, "--dry-run", "--json")
    assert_planned(proc)
    stages = by_stage(json.loads(proc.stdout))
    assert list(stages) == ["fetch", "strip", "build", "ship", "tune", "launch", "verify"]
    assert stages["fetch"]["state"] == "blocked"
    unblock = stages["fetch"]["unblock"]  # the recipe's own file, named (this one is a checkout's: no copy needed)
    assert unblock.startswith("sparkstack fetch --resolve --recipe /"), unblock
    assert unblock.endswith("/glm53-flash-dflash2-nvfp4/recipe.toml"), unblock
    assert stages["build"]["state"] == "blocked"
    assert "not pinned for linux/arm64" in stages["build"]["detail"]
    assert stages["build"]["unblock"] == f"sparkstack pin base {REF} --platform linux/arm64 --pins {up_world['pins']}"
    assert stages["strip"]["state"] == "blocked" and stages["strip"]["after"] == ["fetch"]
    assert stages["launch"]["unblock"] == stages["build"]["unblock"]  # launch waits for build: build's unblock
    assert stages["tune"]["state"] == "blocked" and "worker-node" in stages["tune"]["detail"]
    assert not (up_world["home"] / "hf").exists() and not (up_world["tmp"] / "state").exists()


def test_a_pinned_base_not_given_is_unblocked_by_image_pull(up_world):
    """Pins that name the platform, no --base, no Nix: build's unblock is the `image pull` that assembles it."""
    layer = {"digest": "sha256:" + "4" * 64, "mediaType": "application/vnd.oci.image.layer.v1.tar", "size": 4}
    doc = json.loads(up_world["pins"].read_text())
    doc["platforms"] = {"linux/arm64": {"manifest": {**layer, "digest": "sha256:" + "2" * 64,
                                                     "mediaType": "application/vnd.oci.image.manifest.v1+json"},
                                        "config": {**layer, "digest": "sha256:" + "3" * 64}, "layers": [layer]}}
    up_world["pins"].write_text(json.dumps(doc))
    proc = up(up_world, "--dry-run", "--json")
    assert_planned(proc)
    build = by_stage(json.loads(proc.stdout))["build"]
    assert build["state"] == "blocked" and "sha256:222222222222" in build["detail"]
    assert build["unblock"] == f"sparkstack image pull --out base --pins {up_world['pins']}"


def test_off_a_terminal_up_needs_yes_and_applies_nothing(up_world, tmp_path):
    repos = synthetic_repos(tmp_path / "repos")
    recipe = recipe_copy(tmp_path / "recipe.toml", repos[MODEL].refs["main"], repos[DRAFTER].refs["main"])
    with HubStandin(repos) as hub:
        proc = up(up_world, "--recipe", str(recipe), "--until", "strip",
                  env={"HF_ENDPOINT": hub.url, "HF_TOKEN": "", "HF_HUB_OFFLINE": ""})
        assert proc.returncode == 2
        assert proc.stderr.splitlines()[-1].startswith("sparkstack: error: not a terminal: pass --yes")
        assert not (up_world["tmp"] / "state").exists() and not (up_world["home"] / "hf").exists()
        assert hub.downloads() == []  # the plan only asked what each commit holds
    proc = up(up_world, "--from", "launch", "--until", "fetch")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr


def test_a_plan_with_nothing_to_run_but_a_block_says_so_without_asking(up_world):
    """Nothing would be applied, so there is nothing to consent to: the block's one line, exit 1."""
    proc = up(up_world)
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("sparkstack: error: up: fetch is blocked: ") and "unblock it: sparkstack fetch --resolve" in last
    assert "run it alone" not in last  # a blocked stage is unblocked, not rerun
    record = json.loads((up_world["tmp"] / "state/up/last.json").read_text())
    assert [s["outcome"] for s in record["stages"]] == ["blocked"] + ["not started"] * 6
    assert record["stages"][0]["rerun"] == "sparkstack fetch"  # the record's rerun runs the stage, as for any other


def test_bad_image_options_are_one_line_usage_errors(up_world):
    proc = up(up_world, "--dry-run", "--image", str(up_world["tmp"] / "nope"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--image" in proc.stderr, proc.stderr
    proc = up(up_world, "--dry-run", "--image", str(up_world["pins"]), "--base", str(up_world["pins"]))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--base" in proc.stderr, proc.stderr


def test_printed_commands_run_from_any_directory(up_world):
    """The commands `up` prints (run it alone, unblock) name absolute paths: the default `--out image` is relative."""
    doc = json.loads(up(up_world, "--dry-run", "--json").stdout)
    build = by_stage(doc)["build"]
    assert f"--out {up_world['tmp'] / 'image'}" in build["rerun"], build["rerun"]


def test_an_unwritable_record_stops_up_before_any_stage_acts(up_world, tmp_path):
    repos = synthetic_repos(tmp_path / "repos")
    recipe = recipe_copy(tmp_path / "recipe.toml", repos[MODEL].refs["main"], repos[DRAFTER].refs["main"])
    blocker = tmp_path / "file"
    blocker.write_text("")
    with HubStandin(repos) as hub:
        proc = up(up_world, "--recipe", str(recipe), "--until", "fetch", "--yes",
                  env={"HF_ENDPOINT": hub.url, "HF_TOKEN": "", "HF_HUB_OFFLINE": "",
                       "SPARKSTACK_STATE_DIR": str(blocker / "state")})
    assert proc.returncode == 1 and "run record" in proc.stderr.splitlines()[-1], proc.stderr
    assert not (up_world["home"] / "hf").exists()  # fetch never ran


def test_up_fetches_and_strips_then_says_up_to_date_and_resumes_nothing(up_world, tmp_path):
    repos = synthetic_repos(tmp_path / "repos")
    recipe = recipe_copy(tmp_path / "recipe.toml", repos[MODEL].refs["main"], repos[DRAFTER].refs["main"])
    with HubStandin(repos) as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "", "HF_HUB_OFFLINE": ""}
        proc = up(up_world, "--recipe", str(recipe), "--until", "strip", "--dry-run", "--json", env=env)
        stages = by_stage(json.loads(proc.stdout))
        assert (stages["fetch"]["state"], stages["strip"]["state"]) == ("will run", "will run")
        assert stages["strip"]["after"] == ["fetch"]
        files = [b for r in (MODEL, DRAFTER) for b in repos[r].commits[repos[r].refs["main"]].values()]
        assert stages["fetch"]["bytes"] == sum(map(len, files))  # every file of both commits: the cache is empty
        assert {stages[s]["state"] for s in ("build", "ship", "tune", "launch", "verify")} == {"skipped"}

        proc = up(up_world, "--recipe", str(recipe), "--until", "strip", "--yes", "--json", env=env)
        assert proc.returncode == 0, proc.stderr
        result = {s["stage"]: s["outcome"] for s in json.loads(proc.stdout)["result"]["stages"]}
        assert (result["fetch"], result["strip"]) == ("done", "done")
        gets = len(hub.requests("get"))
        hub_dir = up_world["home"] / "hf/hub"
        snap = hub_dir / "models--LibertAIDAI--GLM-5.3-Flash-NVFP4-no-MTP/snapshots" / repos[MODEL].refs["main"]
        kept = set()
        for shard in snap.glob("*.safetensors"):
            with safe_open(shard, "np") as f:
                kept |= set(f.keys())
        assert kept == {s.name for specs in synth.DEFAULT_SHARDS.values() for s in specs if not s.mtp}

        # Again: both up to date, nothing downloaded, and the record says what the first run did.
        proc = up(up_world, "--recipe", str(recipe), "--until", "strip", "--dry-run", "--json", env=env)
        stages = by_stage(json.loads(proc.stdout))
        assert (stages["fetch"]["state"], stages["strip"]["state"]) == ("up to date", "up to date")
        last = json.loads(proc.stdout)["last_run"]
        assert [s["outcome"] for s in last["stages"]][:2] == ["done", "done"]
        proc = up(up_world, "--recipe", str(recipe), "--until", "strip", "--yes", env=env)
        assert proc.returncode == 0 and "nothing to do" in proc.stdout, proc.stdout + proc.stderr
        assert len(hub.requests("get")) == gets
    record = Path(up_world["tmp"] / "state/up/last.json")
    assert json.loads(record.read_text())["stages"][0]["stage"] == "fetch"


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)], ids=["term", "hup"])
def test_a_stop_signal_mid_fetch_says_what_is_done_and_cut_and_writes_the_record(up_world, tmp_path, sig, code):
    """`kill` or a hangup while fetch waits on a shard: up stops as on Ctrl-C (its lines, its JSON, its record)
    and the next `up` finishes from there."""
    repos = synthetic_repos(tmp_path / "repos")
    recipe = recipe_copy(tmp_path / "recipe.toml", repos[MODEL].refs["main"], repos[DRAFTER].refs["main"])
    shard = sorted(f for f in repos[MODEL].commits[repos[MODEL].refs["main"]] if f.endswith(".safetensors"))[0]
    with HubStandin(repos) as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "", "HF_HUB_OFFLINE": ""}
        hub.faults["stall"] = shard
        proc = start([*sparkstack_cmd(), "up", "--pins", str(up_world["pins"]), "--ssh-config", str(up_world["ssh_config"]),
                      "--recipe", str(recipe), "--until", "strip", "--yes", "--json"], cwd=up_world["tmp"],
                     env={**up_world["env"], **env}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True)
        try:
            wait_for("the stalled shard asked for",
                     lambda: [r for r in hub.requests("get") if r["file"] == shard] or proc.poll() is not None)
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
            hub.released.set()
        assert proc.returncode == code, err
        assert "Traceback" not in err
        name = signal.Signals(sig).name
        assert err.splitlines()[-2:] == [
            "up: cut: fetch; not started: strip; skipped: build, ship, tune, launch, verify",
            "run `sparkstack up` again: finished stages plan as up to date, and a cut transfer resumes"]
        cut = by_stage(json.loads(out)["result"])["fetch"]
        assert (cut["outcome"], cut["detail"]) == ("cut", f"interrupted by {name}")
        record = json.loads((tmp_path / "state/up/last.json").read_text())
        assert [(s["stage"], s["outcome"]) for s in record["stages"]][:2] == [("fetch", "cut"), ("strip", "not started")]
        hub.faults.clear()
        proc = up(up_world, "--recipe", str(recipe), "--until", "strip", "--yes", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    again = by_stage(json.loads(proc.stdout)["result"])
    assert (again["fetch"]["outcome"], again["strip"]["outcome"]) == ("done", "done")


# ---------------------------------------------------------------- apply_up itself, with stand-in stages

def inputs(tmp_path: Path, **kw):
    from sparkstack.up.command import Request

    base = dict(overlay=tmp_path, out=tmp_path / "image", profile="lab", health_interval=1.0, health_attempts=1,
                worker_delay=0.0, verify_timeout=5.0, bench=True, bench_concurrency=(1,), bench_rounds=1,
                bench_category=("count",), bench_out=tmp_path / "bench.json",
                stages=("fetch", "strip", "build", "ship", "tune", "launch", "verify", "bench"))
    return Request(**{**base, **kw})


def up_plan_of(stages, request, environ=None) -> up_plan.UpPlan:
    return up_plan.UpPlan("r", tuple(stages), None, None, request, environ or {})


def test_ctrl_c_while_a_stage_is_planned_again_still_says_what_is_done_and_what_was_cut(tmp_path, monkeypatch):
    """A stage after one that acted is planned again just before it runs (ship asks every worker what it holds:
    a likely moment for Ctrl-C). The record must still say fetch is done and strip was cut."""
    from sparkstack.up import apply as up_apply

    monkeypatch.setenv("SPARKSTACK_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(up_apply, "_run_stage", lambda stage, view, finished: {"revisions": {}})

    def replan(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(up_apply, "plan_stage", replan)
    plan = up_plan_of((stage("fetch", WILL_RUN), stage("strip", WILL_RUN), stage("build", WILL_RUN)), inputs(tmp_path))
    result = up_apply.apply_up(plan)
    assert result.stopped == "cut"
    outcomes = [(r.stage, r.outcome) for r in result.runs]
    assert outcomes == [("fetch", "done"), ("strip", "cut"), ("build", "not started")]
    record = json.loads((tmp_path / "state/up/last.json").read_text())
    assert [s["outcome"] for s in record["stages"]] == ["done", "cut", "not started"]


@pytest.mark.parametrize("serving", [True, False])
def test_ups_tune_drops_the_page_cache_only_before_a_launch(tmp_path, monkeypatch, serving):
    """A page-cache drop under a serving engine gains nothing; before a launch it frees unified memory."""
    from sparkstack.tune import command as tune_cmd
    from sparkstack.tune.plan import RankTune, Step, TunePlan
    from sparkstack.up import apply as up_apply

    monkeypatch.setenv("SPARKSTACK_STATE_DIR", str(tmp_path / "state"))
    given = []
    monkeypatch.setattr(up_apply, "_run_stage", lambda stage, view, finished: given.append(stage) or {})
    facts = SimpleNamespace(to_json=dict)  # what the plan read of the host: nothing this test looks at
    steps = (Step("swappiness", "60", "0", (), ""), Step("page-cache", "12 GiB cached", "dropped", (), ""))
    tune_plan = TunePlan("r", "0,2000", "/", (RankTune(0, "head", "local", False, facts, steps, (), ()),))
    tune = stage("tune", WILL_RUN, work=tune_cmd.Plan(tune_cmd.Request(), tune_plan, {}))
    launch = stage("launch", UP_TO_DATE if serving else WILL_RUN)
    monkeypatch.setattr(up_apply, "plan_stage", lambda name, *args: launch)  # planned again after tune: the same
    up_apply.apply_up(up_plan_of((tune, launch), inputs(tmp_path, stages=("tune", "launch"))))
    ran = given[0]
    assert [s.name for r in ran.work.tune.ranks for s in r.steps] == (["swappiness"] if serving else
                                                                      ["swappiness", "page-cache"])


def test_the_live_lines_of_up_mask_the_key_and_escape_control_characters(tmp_path, monkeypatch):
    """What a stage says while it runs (remote stderr, container log text, bench warnings) goes through the same
    masking and escaping as the single commands' lines: the view's, once."""
    from sparkstack.command import StageRows, View
    from sparkstack.up import apply as up_apply

    key = "sk-LIVE-KEY-42"
    monkeypatch.setenv("SPARKSTACK_STATE_DIR", str(tmp_path / "state"))

    def fetch(stage, view, finished):
        view.hide(key)  # as verify, bench, soak and top tell their view of the key they send
        view.say(f"the server said: bad key Bearer {key}\x1b[2J\x07")
        return {}

    monkeypatch.setattr(up_apply, "_run_stage", fetch)
    said = []

    class Rows(StageRows):
        def say(self, line):
            said.append(line)

    class Recording(View):
        def stages(self, rows):
            import contextlib

            return contextlib.nullcontext(Rows())

    plan = up_plan_of((stage("fetch", WILL_RUN),), inputs(tmp_path, stages=("fetch",)))
    up_apply.apply_up(plan, Recording())
    assert said == ["the server said: bad key Bearer ***\\x1b[2J\\x07"]


def test_bench_through_up_never_shows_the_key_a_server_echoes(tmp_path, monkeypatch):
    """`bench` masks a key the server quotes back; `up`'s bench stage must too, on its line and in its record."""
    import http.server
    import threading

    from sparkstack.bench import command as bench_cmd
    from sparkstack.up import apply as up_apply

    class Echo(http.server.BaseHTTPRequestHandler):
        """Healthy and listing its model, but every chat is refused with the key it was sent quoted back."""

        def _send(self, status: int, body: bytes, kind: str = "application/json"):
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model"}]}).encode())
            else:
                self._send(200, b"", "text/plain")  # /health, and /metrics with no samples

        def do_POST(self):
            self._send(401, json.dumps({"error": {"message": f"bad key {self.headers.get('Authorization')}"}}).encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    secret = "sk-very-secret-4242"
    monkeypatch.setenv("SPARKSTACK_STATE_DIR", str(tmp_path / "state"))
    url = f"http://127.0.0.1:{server.server_address[1]}"
    environ = {"VLLM_API_KEY": secret}
    work = bench_cmd.plan(bench_cmd.Request(url=url, concurrency=(1,), rounds=1, category=("count",), model="tiny"),
                          environ)
    bench = Stage("bench", WILL_RUN, "bench", f"sparkstack bench {url}", work=work)
    try:
        result = up_apply.apply_up(up_plan_of((bench,), inputs(tmp_path), environ))
    finally:
        server.shutdown()
    assert result.stopped == "failed"
    assert "401" in result.failure and "***" in result.failure, result.failure
    assert secret not in result.failure
    assert secret not in (tmp_path / "state/up/last.json").read_text()


def test_the_serving_temperature_reaches_verify_and_bench(tmp_path):
    """`up --temperature T`: verify's sampling check and bench's requests run at T, as `verify --temperature T` and
    `bench --temperature T` would; the commands up prints to re-run them say so."""
    import shlex

    def planned(name, r, earlier=None, record=None):
        return up_plan.plan_stage(name, r, {}, earlier or {}, record, up_plan.Ground(r, {}))

    inp = inputs(tmp_path, temperature=0.0, bench=True)
    verify, bench = planned("verify", inp), planned("bench", inp)
    assert verify.work.verify.temperature == 0.0 and bench.work.bench.settings.temperature == 0.0
    for made, name in ((verify, "verify"), (bench, "bench")):
        argv = shlex.split(made.rerun)
        assert argv[:2] == ["sparkstack", name] and argv[argv.index("--temperature") + 1] == "0", argv
    default = planned("verify", inputs(tmp_path))
    assert default.work.verify.temperature == 1.0  # the model's own default, as verify's
    # A verify passed at 0 is not one passed at 1 (a sampler fault shows only above 0): not up to date for it.
    launch = stage("launch", UP_TO_DATE, outputs={"run": "r1", "head_started_at": 1700.5})
    record = {"stages": [{"stage": "verify", "outcome": "done",
                          "outputs": {"run": "r1", "head_started_at": 1700.5, "checks": 7, "temperature": 0.0}}]}
    at = {t: planned("verify", inputs(tmp_path, temperature=t), {"launch": launch}, record).state for t in (0.0, 1.0)}
    assert at == {0.0: UP_TO_DATE, 1.0: WILL_RUN}
