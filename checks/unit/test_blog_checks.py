"""What the blog's author checked by eye and sparkstack now checks (issue 29): the gates on by default, the
InstantTensor variant's own gates, `plan kv`'s reason per KV dtype, the drafter's licence before a download and in
`up`'s plan, and the base's provenance in `pin base`."""

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

import hostfix
import standins
from clirun import assert_planned, sparkstack_cmd
from sparkstack.launch.plan import plan_launch_from_recipe
from sparkstack.launch.preflight import ARGV_GATE, DEFAULT_GATES, INSTANTTENSOR_GATES, gate_checks
from sparkstack.recipe import load_recipe
from sparkstack.remote import Runner

RECIPE = Path(__file__).parents[2] / "recipes/glm53-flash-dflash2-nvfp4/recipe.toml"


# ---- gates on by default

@pytest.fixture
def launch_world(tmp_path):
    standins.install(tmp_path / "bin")
    return tmp_path, hostfix.write_host(tmp_path / "root"), hostfix.write_hub(tmp_path / "hf")


def launch_calls(launch_world, *extra):
    """`launch all` against the stand-ins, to its first /health poll (none answers): the docker argvs it ran."""
    tmp, root, home = launch_world
    (tmp / "calls.jsonl").unlink(missing_ok=True)  # this run's calls only
    env = {"PATH": f"{tmp / 'bin'}:/usr/bin:/bin", "RECORD_LOG": str(tmp / "calls.jsonl"), "HF_HOME": str(home),
           "SPARKSTACK_STATE_DIR": str(tmp / "state"), "VLLM_API_KEY": "k", "API_PORT": "9"}
    proc = subprocess.run(sparkstack_cmd() + ["launch", "all", "--host-root", str(root), "--worker-delay", "0",
                                              "--health-interval", "0", "--health-attempts", "1", *extra],
                          capture_output=True, text=True, env=env, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    calls = standins.recorded(tmp / "calls.jsonl")
    return proc, [c for c in calls if c[:1] == ["docker"]]


def gate_runs(calls):
    return [c for c in calls if "run" in c and "--rm" in c and "--network" in c]


def test_launch_runs_the_gates_before_any_rank_starts_unless_told_not_to(launch_world):
    proc, calls = launch_calls(launch_world)
    gates = gate_runs(calls)
    # The argv gate for each rank and the image's three default runtime gates: all in one throwaway container, one
    # python (its vLLM imported once).
    (batch,) = gates
    assert batch[batch.index("-c") + 1] == ARGV_GATE, batch
    spec = json.loads(batch[batch.index("--sparkstack-gates") + 1])
    assert (len(spec["argvs"]), spec["gates"]) == (2, [list(g) for g in DEFAULT_GATES]), spec
    first_start = next(i for i, c in enumerate(calls) if "run" in c and "-d" in c)
    assert calls.index(batch) < first_start  # before the boot, not after it
    proc, calls = launch_calls(launch_world)  # the same image and gate argvs: the passes are remembered
    assert gate_runs(calls) == [], gate_runs(calls)
    shutil.rmtree(launch_world[0] / "state" / "gates")  # forgotten: they run again
    proc, calls = launch_calls(launch_world, "--gates")  # still accepted: what users already type
    assert len(gate_runs(calls)) == 1
    proc, calls = launch_calls(launch_world, "--no-gates")
    assert gate_runs(calls) == [] and any("run" in c and "-d" in c for c in calls)


def up_json(tmp_path, *extra):
    env_home = tmp_path / "home"
    env_home.mkdir(exist_ok=True)
    ssh = tmp_path / "ssh_config"
    ssh.write_text("Host *\n  HostName 127.0.0.1\n  Port 9\n  BatchMode yes\n  ConnectTimeout 2\n")
    import os
    env = {**os.environ, "HOME": str(env_home), "HF_HOME": str(env_home / "hf"), "SPARKSTACK_RECIPES": "",
           "SPARKSTACK_STATE_DIR": str(tmp_path / "state"), "VLLM_API_KEY": ""}
    proc = subprocess.run(sparkstack_cmd() + ["up", "--ssh-config", str(ssh), "--dry-run", "--json", *extra],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert_planned(proc)
    return json.loads(proc.stdout)


def test_up_launches_with_the_gates_and_no_gates_leaves_them_out(tmp_path):
    from sparkstack.up.command import Request

    assert Request.__dataclass_fields__["gates"].default is True
    launch = {s["stage"]: s for s in up_json(tmp_path)["stages"]}["launch"]
    assert "--no-gates" not in shlex.split(launch["rerun"])
    launch = {s["stage"]: s for s in up_json(tmp_path, "--no-gates")["stages"]}["launch"]
    assert "--no-gates" in shlex.split(launch["rerun"])


def test_instanttensor_loads_get_the_nccl_pin_and_the_import_gate(tmp_path):
    """The instanttensor wheel drags NCCL down to 2.29.7; the variant re-pins 2.30.7."""
    plan = plan_launch_from_recipe(load_recipe(None), {"HF_HOME": str(tmp_path), "LOAD_FORMAT": "instanttensor"})
    standins.install(tmp_path / "bin")
    import os
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "RECORD_LOG": str(tmp_path / "calls.jsonl")}
    old = dict(os.environ)
    os.environ.update(env)
    try:
        checks = gate_checks(plan, Runner())
    finally:
        os.environ.clear()
        os.environ.update(old)
    (batch,) = [c for c in standins.recorded(tmp_path / "calls.jsonl") if "--sparkstack-gates" in c]
    codes = [g[-1] for g in json.loads(batch[batch.index("--sparkstack-gates") + 1])["gates"]]
    assert any("'nvidia-nccl-cu13'" in code and "'2.30.7'" in code for code in codes)
    assert "import instanttensor" in codes and len(checks) == 5
    plain = plan_launch_from_recipe(load_recipe(None), {"HF_HOME": str(tmp_path)})
    from sparkstack.launch.preflight import load_format_gates
    assert load_format_gates(plain) == [] and load_format_gates(plan) == list(INSTANTTENSOR_GATES)


def test_the_overlays_instanttensor_variant_carries_the_same_gates():
    from sparkstack.patch.overlay import load_overlay

    overlay = load_overlay(Path(__file__).parents[2] / "overlays/dflash2")
    gates = overlay.variants["instanttensor"].runtime_gates
    assert ("python3", "-c", "import instanttensor") in gates
    assert any("nvidia-nccl-cu13" in g[-1] and "2.30.7" in g[-1] for g in gates)


# ---- plan kv: the blog's reason, the dtype's figures

def test_plan_kv_gives_the_blogs_reason_for_the_deployed_geometry(run_cli):
    doc = json.loads(run_cli("plan", "kv", "--json", check=0).stdout)["page_unification"]
    # fp8_e4m3 at --block-size 2304: the blog's MLA page of 2,359,296 B; the DFlash2 drafter at 4096 B (bf16) and
    # 2048 B (fp8) per token fits it 576 and 1152 times, both multiples of 64: it rides the page.
    assert doc["ok"] is True and "2,359,296 B" in doc["reason"] and "exact fit" in doc["reason"]
    assert "576 x 4,096" in doc["reason"] and "1152 x 2,048" in doc["reason"] and "standalone" not in doc["reason"]
    assert "fp8_e4m3" in doc["reason"]


def test_the_kv_dtype_decides_which_page_figures_apply(run_cli, tmp_path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE.read_text().replace('"--kv-cache-dtype", "fp8_e4m3"', '"--kv-cache-dtype", "fp8_ds_mla"'))
    doc = json.loads(run_cli("plan", "kv", "--recipe", recipe, "--json", check=0).stdout)["page_unification"]
    # fp8_ds_mla's 660 B per token: 660 x 2304 = 1,520,640 B, no exact multiple-of-64 fit for 4096 B.
    assert "standalone" in doc["reason"] and "1520640" in doc["reason"]
    recipe.write_text(RECIPE.read_text().replace('"--kv-cache-dtype", "fp8_e4m3"', '"--kv-cache-dtype", "auto"'))
    doc = json.loads(run_cli("plan", "kv", "--recipe", recipe, "--json", check=0).stdout)["page_unification"]
    assert doc["ok"] is None and "no page figures for --kv-cache-dtype auto" in doc["reason"]


# ---- the drafter's licence

LICENCE = "CC BY-NC-ND 4.0 (non-commercial, no derivatives)"


def test_every_shipped_recipe_records_its_drafters_licence():
    for name in ("glm53-flash-dflash2-nvfp4", "glm53-flash-dflash2-mxfp8"):
        assert load_recipe(name).drafter_licence == LICENCE


def test_up_shows_the_licence_in_its_plan(tmp_path):
    doc = up_json(tmp_path)
    assert doc["licence"] == {"repo": "incoai/GLM-5.3-Flash-DFlash2", "licence": LICENCE}


# ---- the base's provenance

def test_pin_base_names_the_blogs_tag_the_public_reference_and_the_digest(run_cli, tmp_path):
    from registry_standin import Standin, fixture_repo

    repos, served = fixture_repo(tmp_path / "fixture")
    ref = f"ghcr.io/{served.repo}:{served.tag}"
    assert ref == "ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8"
    with Standin(repos) as standin:
        proc = run_cli("pin", "base", ref, "--pins", tmp_path / "pins.json",
                       env={"SPARKSTACK_REGISTRY_MIRROR": standin.url}, check=0)
        doc = json.loads(run_cli("pin", "base", ref, "--pins", tmp_path / "pins.json", "--json",
                                 env={"SPARKSTACK_REGISTRY_MIRROR": standin.url}, check=0).stdout)
    assert "  the blog's tag: radixark/vllm-glm53-flash:sm121-v8" in proc.stdout.splitlines()
    assert f"  pinned:        {ref}" in proc.stdout.splitlines()
    assert f"  digest:        {served.index}" in proc.stdout.splitlines()
    assert doc["provenance"]["blog_tag"] == "radixark/vllm-glm53-flash:sm121-v8"
    assert doc["provenance"]["digest"] == served.index


def test_fetch_prints_the_licence_before_it_downloads(run_cli, tmp_path):
    from hub_standin import DRAFTER, MODEL, HubStandin, recipe_copy, synthetic_repos

    repos = synthetic_repos(tmp_path / "repos")
    hub = HubStandin(repos).start()
    try:
        recipe = recipe_copy(tmp_path / "recipe.toml", repos[MODEL].refs["main"], repos[DRAFTER].refs["main"])
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": "", "HF_HUB_OFFLINE": "",
               "HF_HUB_CACHE": "", "SPARKSTACK_RECIPES": ""}
        dry = run_cli("fetch", "--recipe", recipe, "--dry-run", env=env, check=0)
        assert dry.stdout.splitlines()[0] == f"licence: drafter incoai/GLM-5.3-Flash-DFlash2: {LICENCE}"
        assert json.loads(run_cli("fetch", "--recipe", recipe, "--dry-run", "--json", env=env, check=0).stdout)[
            "licence"] == {"repo": "incoai/GLM-5.3-Flash-DFlash2", "licence": LICENCE}
        proc = run_cli("fetch", "--recipe", recipe, env=env, check=0)
        assert proc.stdout.splitlines()[0] == f"licence: drafter incoai/GLM-5.3-Flash-DFlash2: {LICENCE}"
        assert hub.downloads()
        # Nothing left to download: nothing to read first.
        again = run_cli("fetch", "--recipe", recipe, env=env, check=0)
        assert not [line for line in again.stdout.splitlines() if line.startswith("licence:")]
    finally:
        hub.stop()


def test_the_head_starts_once_the_worker_runs_and_pauses_only_when_asked(launch_world):
    """The blog paused 20 s between the worker and the head; launch starts the head once the worker's container
    runs, and pauses only for --worker-delay (WORKER_DELAY), whose default is 0."""
    from sparkstack.launch.command import Request

    assert Request.__dataclass_fields__["worker_delay"].default == 0
    for extra, pause in (((), None), (("--worker-delay", "0.3"), "waiting 0.3 s before the head")):
        proc, calls = launch_calls(launch_world, *extra)
        lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines()]
        at = lines.index("rank 1 running")
        assert lines[at + 1: at + 2 + bool(pause)] == [pause, "starting rank 0 (head)"][not pause:], lines[at:at + 3]
        starts = [c for c in calls if "run" in c and "-d" in c]
        assert len(starts) == 2 and "--headless" in starts[0], starts  # the worker's container first
