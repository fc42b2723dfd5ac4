"""launch in the two-host lab: worker first, then head, readiness, stop (also with the fabric down), failures."""

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from clirun import assert_planned

from hostfix import write_host, write_hub
from lab import FABRIC_IF

RECIPE = Path(__file__).parents[2] / "recipes/glm53-flash-dflash2-nvfp4/recipe.toml"


@pytest.fixture(scope="module")
def launch_world(lab_with_image, tmp_path_factory):
    lab, image = lab_with_image
    work = tmp_path_factory.mktemp("launch")
    root = write_host(work / "hostroot")  # the lab has no RDMA device: preflight reads a prepared host root
    home = write_hub(work / "hf")
    return lab, image, work, root, home


def lab_recipe(lab, work: Path, extra_env: dict[str, str]) -> Path:
    """The tuned recipe, with the lab's two hosts and the stand-in engine's settings."""
    text = RECIPE.read_text()
    start = text.index("[[nodes]]")
    end = text.index("# KV geometry")
    nodes = (f'[[nodes]]\nhost = "head"\nfabric_ip = "10.0.0.1"\ndocker_host = "{lab.head.dockerd.host}"\n\n'
             f'[[nodes]]\nhost = "worker"\nssh = "worker"\nfabric_ip = "10.0.0.2"\ndocker_host = "{lab.worker.dockerd.host}"\n\n')
    text = text[:start] + nodes + text[end:]
    env_lines = "".join(f"{k} = {json.dumps(v)}\n" for k, v in extra_env.items())  # a JSON string is a TOML string
    text = text.replace("[env]\n", "[env]\n" + env_lines)
    path = work / f"recipe-{abs(hash(tuple(extra_env.items())))}.toml"
    path.write_text(text)
    return path


def sparkstack(lab, world, recipe: Path, *args: str, env=None):
    lab_, image, work, root, home = world
    full = {**os.environ, "HF_HOME": str(home), "IMAGE": image["name"], "SPARKSTACK_STATE_DIR": str(work / "state"),
            "VLLM_API_KEY": "lab-key", **(env or {})}
    return lab.head.run(sys.executable, "-m", "sparkstack.cli", "launch", *args, "--recipe", str(recipe),
                        "--profile", "lab", "--host-root", str(root), "--ssh-config", str(lab.ssh_config),
                        check=False, env=full, timeout=300)


def containers(host) -> list[str]:
    return host.docker("ps", "-a", "--format", "{{.Names}}").stdout.split()


def test_launch_all_then_status_then_stop(launch_world):
    lab, image, work, root, home = launch_world
    recipe = lab_recipe(lab, work, {"STANDIN_HEALTH_DELAY": "2", "STANDIN_RECORD": "/tmp/standin-record.json"})
    try:
        proc = sparkstack(lab, launch_world, recipe, "all", "--worker-delay", "0.5", "--health-interval", "0.5",
                          "--health-attempts", "120", "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out = json.loads(proc.stdout)
        boot = out["boot"]
        assert 0 <= boot["port_open_s"] <= boot["health_s"] <= boot["ttft_s"]
        assert "Using Eagle3 auxiliary layers from config: (6, 15, 25, 34, 43)" in boot["seen_lines"]
        # Worker first: it was running before the head started.
        w_start = lab.worker.docker("inspect", "--format", "{{.State.StartedAt}}", "glm53-tony-rank1").stdout.strip()
        h_start = lab.head.docker("inspect", "--format", "{{.State.StartedAt}}", "glm53-tony-rank0").stdout.strip()
        assert w_start < h_start
        # The head's engine got the planned argv; the API key reached it through the environment only.
        raw = lab.head.docker("exec", "glm53-tony-rank0", "cat", "/tmp/standin-record.json").stdout
        rec = json.loads(raw)
        assert rec["argv"][rec["argv"].index("--node-rank") + 1] == "0" and "--headless" not in rec["argv"]
        # the stand-in records secrets as a sha256 prefix: the right key arrived, and /tmp never holds it
        assert rec["env"]["VLLM_API_KEY"] == "sha256:" + hashlib.sha256(b"lab-key").hexdigest()[:16]
        assert "lab-key" not in raw and rec["env"]["NCCL_SOCKET_IFNAME"] == FABRIC_IF
        record = json.loads(Path(out["record"]).read_text())
        assert "lab-key" not in Path(out["record"]).read_text()
        assert record["image_id"] == image["config_digest"] and len(record["ranks"]) == 2

        proc = sparkstack(lab, launch_world, recipe, "status", "--json")
        rows = json.loads(proc.stdout)["ranks"]
        assert [r["state"] for r in rows[:2]] == ["running", "running"]
        assert {r["image_id"] for r in rows[:2]} == {image["config_digest"]}
        assert rows[0]["health"] == 200 and json.loads(proc.stdout)["last_run"]["id"] == record["id"] and len(rows) == 2
    finally:
        proc = sparkstack(lab, launch_world, recipe, "stop")
    assert proc.returncode == 0, proc.stderr
    assert "glm53-tony-rank0" not in containers(lab.head) and "glm53-tony-rank1" not in containers(lab.worker)
    # Each run's commands to the worker shared one ssh connection; the run closed it as it ended (its master, named
    # "ssh: SOCKET [mux]", would outlive it otherwise).
    from sparkstack.remote import Runner

    argv = Runner(ssh="worker", ssh_config=lab.ssh_config).argv(["true"])
    socket = next(a.split("=", 1)[1] for a in argv if a.startswith("ControlPath="))
    assert not os.path.exists(socket)
    assert [pid for pid in os.listdir("/proc") if pid.isdigit() and socket.encode() in _cmdline(pid)] == []


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # it ended meanwhile
        return b""


def test_stale_container_and_missing_image_fail_preflight(launch_world):
    lab, image, work, root, home = launch_world
    recipe = lab_recipe(lab, work, {})
    lab.worker.docker("run", "-d", "--name", "glm53-tony-rank1", "--entrypoint", "sleep", image["name"], "300")
    try:
        proc = sparkstack(lab, launch_world, recipe, "all", "--worker-delay", "0")
        assert proc.returncode == 1
        assert "stale-container" in proc.stdout + proc.stderr and "glm53-tony-rank1" in proc.stderr
        proc = sparkstack(lab, launch_world, recipe, "all", "--worker-delay", "0", env={"IMAGE": "no/such:image"})
        assert proc.returncode == 1 and "not present" in proc.stdout + proc.stderr
    finally:
        lab.worker.docker("rm", "-f", "glm53-tony-rank1", check=False)
    assert containers(lab.head) == []


def test_a_container_an_earlier_launch_left_is_removed_before_its_rank_starts(launch_world):
    """issue 38: an exited container of rank 1's name with sparkstack's rank label (as a crashed run leaves it) is
    removed, said, and the rank starts; on the real dockerd."""
    lab, image, work, root, home = launch_world
    recipe = lab_recipe(lab, work, {"STANDIN_HEALTH_DELAY": "0"})
    lab.worker.docker("run", "--name", "glm53-tony-rank1", "--label", "org.sparkstack.rank=1", "--entrypoint", "true",
                      image["name"])
    try:
        proc = sparkstack(lab, launch_world, recipe, "all", "--worker-delay", "0", "--health-interval", "0.3",
                          "--health-attempts", "60")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        text = proc.stdout + proc.stderr
        assert "glm53-tony-rank1 (exited) is left from an earlier launch" in text
        assert "rank 1: removed glm53-tony-rank1 (exited), left from an earlier launch" in text
        state = lab.worker.docker("inspect", "--format", "{{.State.Status}}", "glm53-tony-rank1").stdout.strip()
        assert state == "running"
    finally:
        proc = sparkstack(lab, launch_world, recipe, "stop")
    assert proc.returncode == 0, proc.stderr
    assert "rank 1 on" in proc.stdout and "glm53-tony-rank1 removed" in proc.stdout


def test_dying_worker_fails_launch_and_shows_its_log(launch_world):
    lab, image, work, root, home = launch_world
    recipe = lab_recipe(lab, work, {"STANDIN_HEALTH_DELAY": "never", "STANDIN_HEADLESS_DIE_AFTER": "2"})
    try:
        proc = sparkstack(lab, launch_world, recipe, "all", "--worker-delay", "0", "--health-interval", "0.5",
                          "--health-attempts", "60")
        assert proc.returncode == 1
        assert "rank 1 container glm53-tony-rank1 is exited" in proc.stderr
        assert "--- rank 1 log (last lines) ---" in proc.stderr
        assert "stand-in worker lost its peer and exits" in proc.stderr
        assert "--- rank 0 log (last lines) ---" in proc.stderr
        assert proc.stderr.strip().splitlines()[-1].startswith("sparkstack: error: ")
    finally:
        sparkstack(lab, launch_world, recipe, "stop")


def test_head_that_never_gets_healthy_times_out_with_logs(launch_world):
    lab, image, work, root, home = launch_world
    recipe = lab_recipe(lab, work, {"STANDIN_HEALTH_DELAY": "never"})
    try:
        t0 = time.monotonic()
        proc = sparkstack(lab, launch_world, recipe, "all", "--worker-delay", "0", "--health-interval", "0.2",
                          "--health-attempts", "10")
        assert proc.returncode == 1 and "no /health 200 after 10 x 0.2 s" in proc.stderr
        assert "Starting API server" in proc.stderr  # the head's log is shown
        assert time.monotonic() - t0 < 120
    finally:
        sparkstack(lab, launch_world, recipe, "stop")


def test_stop_works_with_the_fabric_down(launch_world):
    lab, image, work, root, home = launch_world
    recipe = lab_recipe(lab, work, {"STANDIN_HEALTH_DELAY": "0"})
    proc = sparkstack(lab, launch_world, recipe, "all", "--worker-delay", "0", "--health-interval", "0.3",
                      "--health-attempts", "60")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lab.head.run("ip", "link", "set", FABRIC_IF, "down")
    try:
        proc = sparkstack(lab, launch_world, recipe, "stop")
        assert proc.returncode == 0, proc.stderr
        assert containers(lab.head) == [] and containers(lab.worker) == []
    finally:
        lab.head.run("ip", "link", "set", FABRIC_IF, "up")


def test_probe_runs_runtime_gates_in_the_image(launch_world):
    """The gates run by default, in a throwaway container, in preflight (never under --dry-run). The stand-in's own
    gates pass (test_launch_all_then_status_then_stop launches through them); a copy of the image whose label asks
    for DFlash2, which the stand-in lacks, fails: which shows they really ran inside the image, and preflight stops
    the launch."""
    lab, image, work, root, home = launch_world
    recipe = lab_recipe(lab, work, {})
    dflash2 = "sparkstack/standin-engine:needs-dflash2"
    cid = lab.head.docker("create", image["name"]).stdout.strip()
    gate = json.dumps([["python3", "-c", "import vllm.model_executor.models.qwen3_dflash2"]], separators=(",", ":"))
    lab.head.docker("commit", "--change", f"LABEL org.sparkstack.gates.runtime='{gate}'", cid, dflash2)
    lab.head.docker("rm", cid)
    try:
        assert lab.head.docker("image", "inspect", "--format", '{{index .Config.Labels "org.sparkstack.gates.runtime"}}',
                               dflash2).stdout.strip() == gate
        proc = sparkstack(lab, launch_world, recipe, "0", env={"IMAGE": dflash2})
        assert proc.returncode == 1
        gate_lines = [l for l in proc.stdout.splitlines() if "] gate: " in l]
        assert len(gate_lines) == 1 and gate_lines[0].startswith("fail"), proc.stdout
        assert "No module named" in gate_lines[0] or "ModuleNotFoundError" in gate_lines[0]
        assert containers(lab.head) == []  # preflight failed: nothing started
    finally:
        lab.head.docker("image", "rm", dflash2, check=False)
    proc = sparkstack(lab, launch_world, recipe, "0", "--dry-run", "--probe", "--gates", "--json")
    assert_planned(proc)
    checks = json.loads(proc.stdout)["preflight"]
    assert [c["status"] for c in checks if c["check"] == "gate"] == ["skip"]  # a dry run starts no container
    identity = [c for c in checks if c["check"] == "image-identity"]
    assert identity and identity[0]["status"] == "pass"  # both ranks hold the same config digest


def test_run_record_keeps_the_argv_that_ran_with_the_workers_home_expanded(launch_world):
    """HF_HOME="~/..." is expanded on each machine; the run record stores what really ran, not the plan's `~`."""
    lab, image, work, root, home = launch_world
    recipe = lab_recipe(lab, work, {"STANDIN_HEALTH_DELAY": "0"})
    head_home = work / "head-home"
    shutil.copytree(home / "hub", head_home / "sparkstack-lab-hf" / "hub", symlinks=True, dirs_exist_ok=True)
    worker_home = lab.ssh("printenv", "HOME").stdout.strip()
    created = lab.worker.path(Path(worker_home, "sparkstack-lab-hf"))  # the worker's own HOME, seen from here
    existed = created.exists()
    # Preflight checks the worker's snapshots there: it gets its own copy of the weights (as ship gives it).
    shutil.copytree(home / "hub", created / "hub", symlinks=True, dirs_exist_ok=True)
    env = {"HOME": str(head_home), "HF_HOME": "~/sparkstack-lab-hf"}
    try:
        proc = sparkstack(lab, launch_world, recipe, "1", "--json", env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        record = json.loads(Path(json.loads(proc.stdout)["record"]).read_text())
        (rank,) = record["ranks"]
        assert rank["rank"] == 1
        assert f"{worker_home}/sparkstack-lab-hf/hub:/root/.cache/huggingface/hub:ro" in rank["docker_run"]
        assert not any(a.startswith("~") for a in rank["docker_run"])
    finally:
        sparkstack(lab, launch_world, recipe, "stop", env=env)
        if not existed:
            shutil.rmtree(created, ignore_errors=True)


def test_preflight_checks_the_workers_snapshots_on_the_worker(launch_world):
    """Over the real ssh, with the worker's own python3 and HOME: absent, links without blobs (what `rsync -a` of a
    snapshot dir leaves), then whole."""
    lab, _, work, _, home = launch_world
    recipe = lab_recipe(lab, work, {})
    head_home = work / "probe-head-home"
    shutil.copytree(home / "hub", head_home / "lab-hf-probe" / "hub", symlinks=True, dirs_exist_ok=True)
    on_worker = lab.worker.path(Path(lab.ssh("printenv", "HOME").stdout.strip(), "lab-hf-probe"))
    env = {"HOME": str(head_home), "HF_HOME": "~/lab-hf-probe"}

    def worker_checks():
        proc = sparkstack(lab, launch_world, recipe, "all", "--dry-run", "--probe", "--json", env=env)
        assert_planned(proc)
        return {c["check"]: c for c in json.loads(proc.stdout)["preflight"] if c["rank"] == 1}

    try:
        checks = worker_checks()
        assert checks["model-snapshot"]["status"] == "fail" and "does not exist" in checks["model-snapshot"]["detail"]
        assert "run `sparkstack ship worker`" in checks["model-snapshot"]["detail"]
        for entry in (home / "hub").iterdir():
            shutil.copytree(entry / "snapshots", on_worker / "hub" / entry.name / "snapshots", symlinks=True)
        checks = worker_checks()
        assert checks["drafter-snapshot"]["status"] == "fail" and "broken link" in checks["drafter-snapshot"]["detail"]
        for entry in (home / "hub").iterdir():
            shutil.copytree(entry / "blobs", on_worker / "hub" / entry.name / "blobs")
        checks = worker_checks()
        assert checks["model-snapshot"]["status"] == checks["drafter-snapshot"]["status"] == "pass"
    finally:
        shutil.rmtree(on_worker, ignore_errors=True)


def test_launch_image_layout_loads_the_head_and_demands_ship_for_a_worker(launch_world, standin_image):
    """A fresh build neither rank holds: a worker without it fails preflight naming ship; once it is loaded there
    (image load --host, over ssh), launch loads the head itself and both ranks run exactly the built config digest."""
    lab, image, work, root, home = launch_world
    tar, _ = standin_image
    fixture = tar.parent  # the stand-in's base, overlay and source
    built = work / "rebuilt-image"
    proc = lab.head.run(sys.executable, "-m", "sparkstack.cli", "image", "build", "--base", str(fixture / "base"),
                        "--overlay", str(fixture / "overlay"), "--overlay-src", str(fixture / "src"), "--out", str(built),
                        "--platform", "linux/amd64", "--json", check=False, timeout=300,
                        env={**os.environ, "SOURCE_DATE_EPOCH": "86400", "SPARKSTACK_CACHE_DIR": str(work / "cache")})
    assert proc.returncode == 0, proc.stderr
    new = json.loads(proc.stdout)["result"]
    assert new["config_digest"] != image["config_digest"]
    recipe = lab_recipe(lab, work, {"STANDIN_HEALTH_DELAY": "0"})
    env_without_image = {k: v for k, v in os.environ.items() if k != "IMAGE"}
    try:
        full = {**env_without_image, "HF_HOME": str(home), "SPARKSTACK_STATE_DIR": str(work / "state")}
        run = lambda *a: lab.head.run(sys.executable, "-m", "sparkstack.cli", "launch", *a, "--recipe", str(recipe),  # noqa: E731
                                      "--profile", "lab", "--host-root", str(root), "--ssh-config", str(lab.ssh_config),
                                      "--image", str(built), check=False, env=full, timeout=300)
        proc = run("all", "--worker-delay", "0", "--health-interval", "0.3", "--health-attempts", "60")
        assert proc.returncode == 1
        assert "sparkstack ship worker" in proc.stdout + proc.stderr
        assert lab.head.docker("image", "inspect", new["config_digest"], check=False).returncode != 0  # nothing loaded
        proc = lab.head.run(sys.executable, "-m", "sparkstack.cli", "image", "load", str(built), "--host", "worker",
                            "--ssh-config", str(lab.ssh_config), "--docker-host", lab.worker.dockerd.host,
                            check=False, env=full, timeout=300)
        assert proc.returncode == 0, proc.stderr
        proc = run("all", "--worker-delay", "0", "--health-interval", "0.3", "--health-attempts", "60", "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "load" in proc.stderr  # the head's load was announced
        for host, name in ((lab.head, "glm53-tony-rank0"), (lab.worker, "glm53-tony-rank1")):
            assert host.docker("inspect", "--format", "{{.Image}}", name).stdout.strip() == new["config_digest"]
        record = json.loads(Path(json.loads(proc.stdout)["record"]).read_text())
        assert record["image_id"] == new["config_digest"] and record["image"] == new["name"]
    finally:
        stopped = sparkstack(lab, launch_world, recipe, "stop")  # the fixture's IMAGE: an empty one is refused, by stop too
    assert stopped.returncode == 0, stopped.stderr  # else its containers outlive it, and the next launch fails preflight
    assert containers(lab.head) == [] and containers(lab.worker) == []
