"""Preflight against fake host roots: each fact that can be wrong is made wrong, once."""

import json
import os
import shlex
import shutil
from pathlib import Path

import pytest
import torch
from clirun import PLANNED
from safetensors.torch import save_file

import standins
import synth


from hostfix import DRAFT_CACHE, FIB_TRIE, HCA, MODEL_CACHE, NIC, ROUTE, TCP_HEADER, write_host, write_hub


@pytest.fixture
def host_and_hub(tmp_path):
    standins.install(tmp_path / "bin")  # nvidia-smi among them: its answers come from STANDIN_GPU_* (standins.py)
    return write_host(tmp_path / "root"), write_hub(tmp_path / "hf")


def standin_env(root: Path) -> dict:
    """The stand-ins beside the host root first on PATH."""
    return {"PATH": f"{root.parent / 'bin'}:{os.environ['PATH']}", "RECORD_LOG": str(root.parent / "calls.jsonl")}


def preflight(run_cli, host_and_hub, *extra, env=None):
    root, home = host_and_hub
    proc = run_cli("launch", "0", "--dry-run", "--json", "--host-root", root, *extra,
                   env={"HF_HOME": str(home), "VLLM_API_KEY": "k", **standin_env(root), **(env or {})}, check=PLANNED)
    return {c["check"]: c for c in json.loads(proc.stdout)["preflight"]}


def test_healthy_host_passes_everything(run_cli, host_and_hub):
    checks = preflight(run_cli, host_and_hub)
    statuses = {name: c["status"] for name, c in checks.items()}
    assert statuses == {"recipe": "pass", "nic": "pass", "hca": "pass", "fabric-ip": "pass", "master-addr": "pass",
                        "ports": "pass",
                        "memory": "pass", "swappiness": "pass", "swappiness-persisted": "pass", "swap": "pass",
                        "persistence-mode": "pass", "clock-cap": "pass", "disk": "pass", "model-snapshot": "pass",
                        "chat-template": "pass", "quantization": "pass", "mtp-strip": "pass",
                        "drafter-snapshot": "pass", "kv-plan": "pass",
                        "api-key": "pass", "image": "skip"}


def test_master_addr_must_be_an_address_of_rank_0s_host(run_cli, host_and_hub):
    """The workers meet rank 0 at MASTER_ADDR: another interface of the head will do, an address it lacks will not."""
    root, _ = host_and_hub
    check = preflight(run_cli, host_and_hub, env={"MASTER_ADDR": "192.168.7.1"})["master-addr"]
    assert check["status"] == "fail" and "MASTER_ADDR 192.168.7.1 is not an address of this host" in check["detail"]
    assert "set MASTER_ADDR=10.0.0.1" in check["detail"]
    (root / "proc/net/fib_trie").write_text(FIB_TRIE.replace("  +-- 127.0.0.0/8", "  +-- 192.168.7.0/24 2 0 2\n"
                                                              "        |-- 192.168.7.1\n           /32 host LOCAL\n"
                                                              "  +-- 127.0.0.0/8"))
    assert preflight(run_cli, host_and_hub, env={"MASTER_ADDR": "192.168.7.1"})["master-addr"]["status"] == "pass"


def test_launching_rank_1_alone_is_not_judged_on_rank_0s_host(run_cli, host_and_hub):
    """`launch 1` starts the worker only: a head whose NIC is down does not stop it, and the line says why."""
    root, home = host_and_hub
    shutil.rmtree(root / f"sys/class/net/{NIC}")
    proc = run_cli("launch", "1", "--dry-run", "--json", "--host-root", root,
                   env={"HF_HOME": str(home), "VLLM_API_KEY": "k", **standin_env(root)})
    checks = json.loads(proc.stdout)["preflight"]
    head = [c for c in checks if c.get("rank") == 0]
    assert [(c["check"], c["status"]) for c in head] == [("head", "skip")], head
    assert preflight(run_cli, host_and_hub)["nic"]["status"] == "fail"  # rank 0 launched: it is judged


def _down(root, home):
    # `ip -br link | grep UP` passes a link whose flags still say UP; operstate tells the truth.
    (root / f"sys/class/net/{NIC}/operstate").write_text("down\n")
    (root / f"sys/class/net/{NIC}/flags").write_text("0x1003\n")


def _listen(port):
    def make(root, home):
        (root / "proc/net/tcp").write_text(TCP_HEADER + f"   0: 00000000:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1\n")
    return make


def _drop_shard(root, home):
    snap = next((home / "hub" / MODEL_CACHE / "snapshots").iterdir())
    (snap / "model-00002-of-00003.safetensors").unlink()


def _truncate_shard(root, home):
    snap = next((home / "hub" / MODEL_CACHE / "snapshots").iterdir())
    blob = (snap / "model-00002-of-00003.safetensors").resolve()
    blob.write_bytes(blob.read_bytes()[:-4])


def _no_template(root, home):
    snap = next((home / "hub" / MODEL_CACHE / "snapshots").iterdir())
    (snap / "chat_template_mm.jinja").unlink()


def _modelopt(root, home):
    snap = next((home / "hub" / MODEL_CACHE / "snapshots").iterdir())
    cfg = json.loads((snap / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
    target = snap / "config.json"
    target.unlink()
    target.write_text(json.dumps(cfg))


def _config_edit(top=None, text=None, drop=()):
    def edit(root, home):
        snap = next((home / "hub" / MODEL_CACHE / "snapshots").iterdir())
        cfg = json.loads((snap / "config.json").read_text())
        cfg.update(top or {})
        cfg["text_config"].update(text or {})
        for key in drop:
            del cfg[key]
        (snap / "config.json").unlink()  # a link into blobs/: replace it, leave the blob alone
        (snap / "config.json").write_text(json.dumps(cfg))
    return edit


def _mtp_shard_beside_the_index(root, home):
    # The loader reads every *.safetensors file, not the index: an MTP tensor in a shard the index does not name counts.
    snap = next((home / "hub" / MODEL_CACHE / "snapshots").iterdir())
    save_file({f"model.layers.{synth.LAYERS}.eh_proj.weight": torch.zeros(2, 2)}, str(snap / "model-mtp.safetensors"))


BROKEN = {
    "nic missing": (lambda r, h: shutil.rmtree(r / f"sys/class/net/{NIC}"), "nic", "fail", "does not exist"),
    "nic down with UP flag": (_down, "nic", "fail", "'down'"),
    "hca on another netdev": (lambda r, h: (r / f"sys/class/infiniband/{HCA}/device/net/{NIC}").rename(
        r / f"sys/class/infiniband/{HCA}/device/net/enp1s0f0np0"), "hca", "fail", "enp1s0f0np0"),
    "no rdma device": (lambda r, h: shutil.rmtree(r / "sys/class/infiniband"), "hca", "fail", "does not exist"),
    "fabric ip missing": (lambda r, h: (r / "proc/net/fib_trie").write_text(FIB_TRIE.replace("10.0.0.1", "10.0.0.7")),
                          "fabric-ip", "fail", "not an address"),
    "fabric subnet on another nic": (lambda r, h: (r / "proc/net/route").write_text(ROUTE.replace(NIC, "eth0")),
                                     "fabric-ip", "fail", "not on"),
    "api port busy": (_listen(8888), "ports", "fail", "API port 8888"),
    "master port busy": (_listen(29521), "ports", "fail", "master port 29521"),
    "low memory": (lambda r, h: (r / "proc/meminfo").write_text("MemAvailable:   20000000 kB\n"), "memory", "fail",
                   "vLLM would refuse"),
    "swappiness": (lambda r, h: (r / "proc/sys/vm/swappiness").write_text("60\n"), "swappiness", "fail", "is 60"),
    "shard missing": (_drop_shard, "model-snapshot", "fail", "missing"),
    "shard truncated": (_truncate_shard, "model-snapshot", "fail", "past the"),
    "no chat template": (_no_template, "chat-template", "warn", "500"),
    "modelopt checkpoint": (_modelopt, "quantization", "warn", "54150"),
    "modelopt, vLLM's method name": (_config_edit(top={"quantization_config": {"quant_method": "modelopt_fp4"}}),
                                     "quantization", "warn", "modelopt_fp4"),
    "mtp layer left on": (_config_edit(top={"num_nextn_predict_layers": 1}), "mtp-strip", "fail",
                          "config.json num_nextn_predict_layers = 1"),
    "mtp layer left on in text_config": (_config_edit(text={"num_nextn_predict_layers": 1}), "mtp-strip", "fail",
                                         "text_config num_nextn_predict_layers = 1"),
    "mtp setting missing": (_config_edit(drop=("num_nextn_predict_layers",)), "mtp-strip", "fail",
                            "config.json num_nextn_predict_layers = unset"),
    "mtp setting false": (_config_edit(text={"num_nextn_predict_layers": False}), "mtp-strip", "fail",
                          "text_config num_nextn_predict_layers = False"),
    "mtp tensor in a shard": (_mtp_shard_beside_the_index, "mtp-strip", "fail", "model-mtp.safetensors still holds 1"),
    "no refs": (lambda r, h: (h / "hub" / DRAFT_CACHE / "refs/main").unlink(), "drafter-snapshot", "fail", "refs/main"),
    # The facts `sparkstack tune` sets: warnings, as a reboot or a missing tool does not stop a launch.
    "swappiness not persisted": (lambda r, h: (r / "etc/sysctl.d/60-swappiness.conf").unlink(),
                                 "swappiness-persisted", "warn", "not set at boot"),
    "swappiness 60 at boot": (lambda r, h: (r / "etc/sysctl.conf").write_text("# local\nvm.swappiness = 60\n"),
                              "swappiness-persisted", "warn", "60 at boot (from"),
    "swap on": (lambda r, h: (r / "proc/swaps").write_text((r / "proc/swaps").read_text()
                                                          + "/swap.img  file  8388604  0  -2\n"), "swap", "pass", "on: /swap.img"),
    "persistence mode off": (lambda r, h: {"STANDIN_GPU_PERSISTENCE_MODE": "Disabled"},
                             "persistence-mode", "warn", "Disabled"),
    "no nvidia-smi": (lambda r, h: {"STANDIN_GPU": "absent"}, "gpu", "warn", "nvidia-smi is not installed on local"),
    "clock cap of an earlier boot": (lambda r, h: (r / "proc/sys/kernel/random/boot_id").write_text("another-boot\n"),
                                     "clock-cap", "warn", "no cap set by sparkstack tune since boot"),
    "clock above the cap": (lambda r, h: {"STANDIN_GPU_CLOCKS_CURRENT_GRAPHICS": "2500"},  # tune's rule too
                            "clock-cap", "warn", "graphics clock 2500 MHz, above the cap"),
    "another clock cap": (lambda r, h: (r / "run/sparkstack/clock-cap").write_text(
        (r / "run/sparkstack/clock-cap").read_text().replace("0,2000", "300,2200")), "clock-cap", "warn", "300,2200"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_each_broken_fact_is_caught(run_cli, host_and_hub, case):
    breaker, name, status, detail = BROKEN[case]
    env = breaker(*host_and_hub)  # a dict: what the stand-ins are told instead
    checks = preflight(run_cli, host_and_hub, env=env if isinstance(env, dict) else None)
    assert checks[name]["status"] == status, checks[name]
    assert detail in checks[name]["detail"]
    others = [c for n, c in checks.items() if n != name and c["status"] == "fail"]
    assert not others, others  # exactly the broken fact fails


def test_api_key_warning(run_cli, host_and_hub):
    root, home = host_and_hub
    proc = run_cli("launch", "0", "--dry-run", "--json", "--host-root", root, env={"HF_HOME": str(home)}, check=PLANNED)
    checks = {c["check"]: c for c in json.loads(proc.stdout)["preflight"]}
    assert checks["api-key"]["status"] == "warn" and "0.0.0.0" in checks["api-key"]["detail"]


def test_kv_plan_that_cannot_hold_one_sequence_is_refused_before_preflight(run_cli, host_and_hub):
    """vLLM refuses such a pool at start: it is a refusal of the plan, not a check a dry run reports and goes on."""
    root, home = host_and_hub
    proc = run_cli("launch", "0", "--dry-run", "--json", "--host-root", root, check=1,
                   env={"HF_HOME": str(home), "KV_CACHE_MEMORY": str(2 * 2**30), **standin_env(root)})
    tokens = 2 * 2**30 * 989727 // 10247694336  # the measured cost, applied by hand
    assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert f"holds {tokens:,} tokens, less than one max-model-len sequence" in proc.stderr, proc.stderr


def test_a_max_model_len_past_the_pool_leads_with_max_model_len(run_cli, host_and_hub):
    """The knob the user just changed comes first, with the length that fits (the pool's tokens, measured)."""
    root, home = host_and_hub
    proc = run_cli("launch", "0", "--dry-run", "--host-root", root, check=1,
                   env={"HF_HOME": str(home), "MAX_MODEL_LEN": "2000000", **standin_env(root)})
    line = proc.stderr.removeprefix("sparkstack: error: ")
    assert line.startswith("MAX_MODEL_LEN=2000000: one sequence of 2,000,000 tokens needs at least"), line
    assert "use MAX_MODEL_LEN of at most 989,727" in line  # the pinned pool's tokens, as the boot measured them


def test_the_verdict_counts_the_checks_and_names_the_first_failure(run_cli, host_and_hub):
    root, home = host_and_hub
    (root / "proc/sys/vm/swappiness").write_text("30\n")
    proc = run_cli("launch", "0", "--dry-run", "--host-root", root, check=1,
                   env={"HF_HOME": str(home), "VLLM_API_KEY": "k", **standin_env(root)})
    listed = [line.split()[0] for line in proc.stdout.splitlines() if line.split()[:1] in (["pass"], ["warn"], ["fail"], ["skip"])]
    last = proc.stdout.splitlines()[-1]
    counts = ", ".join(f"{listed.count(s)} {s}" for s in ("pass", "warn", "fail", "skip"))
    assert listed.count("fail") == 1 and last.startswith(f"preflight: {counts}: "), proc.stdout
    assert "`sparkstack launch 0` would not start (first: [rank 0 on local] swappiness: " in last, last
    (root / "proc/sys/vm/swappiness").write_text("0\n")
    fixed = run_cli("launch", "0", "--dry-run", "--host-root", root, check=0,
                    env={"HF_HOME": str(home), "VLLM_API_KEY": "k", **standin_env(root)})
    assert fixed.stdout.splitlines()[-1].endswith("`sparkstack launch 0` would start"), fixed.stdout


def test_launch_refuses_before_any_container_on_a_failed_check(run_cli, host_and_hub):
    root, home = host_and_hub
    (root / "proc/sys/vm/swappiness").write_text("30\n")
    (root / "proc/sys/vm/drop_caches").write_text("")
    proc = run_cli("launch", "all", "--host-root", root, "--worker-delay", "0", "--drop-caches",
                   env={"HF_HOME": str(home), "PATH": "/nonexistent"})
    # Dropping caches is an act: it belongs to apply, which a failed preflight never reaches.
    assert (root / "proc/sys/vm/drop_caches").read_text() == ""
    assert proc.returncode == 1
    assert "preflight failed" in proc.stderr and "swappiness" in proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1


RECIPE = Path(__file__).parents[2] / "recipes/glm53-flash-dflash2-nvfp4/recipe.toml"


@pytest.mark.parametrize("below", [True, False])
def test_free_memory_by_vllms_rule_prints_both_numbers(run_cli, host_and_hub, tmp_path, below):
    """MemAvailable against gpu-memory-utilization x the recipe's gpu_memory_gib: 0.5 x 100 GiB = 50 GiB."""
    root, _ = host_and_hub
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE.read_text().replace("gpu_memory_gib = 121.69", "gpu_memory_gib = 100"))
    available_kib = 50 * 2**20 - (1 if below else 0)
    (root / "proc/meminfo").write_text(f"MemAvailable: {available_kib} kB\n")
    checks = preflight(run_cli, host_and_hub, "--recipe", recipe, env={"GPU_MEM_UTIL": "0.5"})
    memory = checks["memory"]
    assert memory["status"] == ("fail" if below else "pass"), memory
    assert f"MemAvailable {available_kib / 2**20:.2f} GiB" in memory["detail"]
    assert "0.5 x 100 GiB = 50.00 GiB" in memory["detail"]
    if below:  # MemAvailable already counts the page cache a drop would free: the remedy is freeing memory
        assert "sparkstack tune" not in memory["detail"] and "page cache" not in memory["detail"]
        assert "stop other containers or processes" in memory["detail"]


def test_worker_host_facts_are_read_over_ssh(run_cli, host_and_hub):
    """With --probe the worker's facts come through ssh (one read-only `grep` of the files), answered as that rank."""
    root, home = host_and_hub
    proc = run_cli("launch", "all", "--dry-run", "--probe", "--json", "--host-root", root,
                   env={"HF_HOME": str(home), "VLLM_API_KEY": "k", **standin_env(root),
                        "STANDIN_REMOTE_GPU_PERSISTENCE_MODE": "Disabled"}, check=0)
    checks = {(c["check"], c["rank"]): c for c in json.loads(proc.stdout)["preflight"]}
    assert checks[("persistence-mode", 0)]["status"] == "pass"
    assert checks[("persistence-mode", 1)]["status"] == "warn" and "Disabled" in checks[("persistence-mode", 1)]["detail"]
    assert checks[("swappiness", 1)]["status"] == "pass" and checks[("memory", 1)]["status"] == "pass"
    calls = standins.recorded(root.parent / "calls.jsonl")
    ssh_reads = [shlex.split(c[-1]) for c in calls if c[0] == "ssh" and c[-1].startswith("grep ")]
    # Two reads, each one `grep`: the host facts, and the worker's fabric (its NIC, route table, addresses).
    assert len(ssh_reads) == 2
    assert [f"{root}/proc/meminfo" in r for r in ssh_reads].count(True) == 1
    assert [f"{root}/proc/net/fib_trie" in r for r in ssh_reads].count(True) == 1


@pytest.mark.parametrize("index_only", [False, True])
def test_mtp_strip_check_reads_what_strip_really_wrote(run_cli, host_and_hub, tmp_path, index_only):
    """The real strip's output passes; its --index-only output, which leaves MTP tensors in the shards, fails."""
    home = host_and_hub[1]
    flat = tmp_path / "unstripped"
    synth.write_model_dir(flat)
    src = synth.cache_from_dir(flat, tmp_path / "src-hub")
    out = home / "hub" / "models--sparkstack--stripped"
    run_cli("strip", src, "--out", out, *(["--index-only"] if index_only else []), check=0)
    checks = preflight(run_cli, host_and_hub, env={"MODEL_CACHE_NAME": out.name})
    mtp_shards = sorted(s for s, specs in synth.DEFAULT_SHARDS.items() if any(spec.mtp for spec in specs))
    if index_only:
        assert checks["mtp-strip"]["status"] == "fail" and mtp_shards[0] in checks["mtp-strip"]["detail"]
    else:
        assert checks["mtp-strip"]["status"] == "pass", checks["mtp-strip"]


class ContainerHost:
    """docker as it answers about containers: `ps` lists the running ones, `ps -a` the exited ones too."""

    label = "host"

    def __init__(self, containers: dict[str, str]) -> None:
        self.containers = containers  # name -> state
        self.labels: dict[str, str] = {}  # name -> its org.sparkstack.rank label (none: not started by sparkstack)

    def run_docker(self, *args, timeout=None):
        import subprocess

        if args[:2] == ("image", "inspect"):
            return subprocess.CompletedProcess(args, 0, "sha256:" + "a" * 64 + "\n", "")
        if args[0] == "ps":
            name = args[args.index("--filter") + 1].removeprefix("name=^").removesuffix("$")
            state = self.containers.get(name)
            listed = state is not None and ("-a" in args or state == "running")
            label = self.labels.get(name, "")  # `{{.State}} {{.Label "org.sparkstack.rank"}}`, as docker ps prints it
            return subprocess.CompletedProcess(args, 0, f"{state} {label}\n" if listed else "", "")
        if args[0] == "inspect":  # a peer's state and image ID, as `docker inspect --format` prints them
            state = self.containers.get(args[-1])
            if state is None:
                return subprocess.CompletedProcess(args, 1, "", f"Error: No such object: {args[-1]}\n")
            image = self.images.get(args[-1], "sha256:" + "a" * 64)
            return subprocess.CompletedProcess(args, 0, f"{state} {image}\n", "")
        raise AssertionError(f"not asked of docker here: {args}")

    images: dict[str, str] = {}


def test_an_exited_container_holding_a_ranks_name_fails_preflight():
    """`docker run --name` fails on an exited container as on a running one, mid-launch, after the worker started:
    preflight must count both."""
    from sparkstack.launch.plan import plan_launch_from_recipe
    from sparkstack.launch.preflight import docker_checks
    from sparkstack.recipe import load_recipe

    plan = plan_launch_from_recipe(load_recipe("glm53-flash-dflash2-nvfp4"), {})
    worker = plan.ranks[1].name
    checks = docker_checks(plan, {0: ContainerHost({}), 1: ContainerHost({worker: "exited"})}, gates=False)
    stale = {c.rank: (c.status, c.detail) for c in checks if c.name == "stale-container"}
    assert stale[0][0] == "pass"
    assert stale[1][0] == "fail" and f"named {worker} (exited)" in stale[1][1] and "not started by sparkstack" in stale[1][1]

    ours = ContainerHost({worker: "exited"})
    ours.labels[worker] = "1"  # left by an earlier launch of rank 1: removed before it starts, and said
    stale = {c.rank: (c.status, c.detail) for c in docker_checks(plan, {0: ContainerHost({}), 1: ours}, gates=False)
             if c.name == "stale-container"}
    assert stale[1][0] == "warn" and "removed before rank 1 starts" in stale[1][1]

    running = ContainerHost({worker: "running"})
    running.labels[worker] = "1"
    stale = {c.rank: (c.status, c.detail) for c in docker_checks(plan, {0: ContainerHost({}), 1: running}, gates=False)
             if c.name == "stale-container"}
    assert stale[1][0] == "fail" and "sparkstack launch 1 stop" in stale[1][1]


def test_a_container_of_a_ranks_name_labelled_for_another_rank_is_refused_not_removed():
    """Only a container sparkstack started for this very rank is left from an earlier launch of it (removed
    before the rank starts); one of the name that carries another rank's label (a NAME without {rank}, two
    launches crossing) was not started as this rank: refused by name, never touched."""
    from sparkstack.launch.plan import plan_launch_from_recipe
    from sparkstack.launch.preflight import docker_checks
    from sparkstack.recipe import load_recipe

    plan = plan_launch_from_recipe(load_recipe("glm53-flash-dflash2-nvfp4"), {})
    worker = plan.ranks[1].name
    crossed = ContainerHost({worker: "exited"})
    crossed.labels[worker] = "0"
    stale = {c.rank: (c.status, c.detail) for c in docker_checks(plan, {0: ContainerHost({}), 1: crossed}, gates=False)
             if c.name == "stale-container"}
    assert stale[1][0] == "fail", stale[1]
    assert "not started by sparkstack as rank 1" in stale[1][1] and "org.sparkstack.rank=0" in stale[1][1], stale[1]
    assert "removed" not in stale[1][1]


@pytest.mark.parametrize("peer, images, expect", [
    ("running", {}, "pass"),  # the design card's order: rank 1 up, then rank 0
    (None, {}, "warn"),  # no rank 1: out of the order; the head waits for it at the rendezvous
    ("exited", {}, "warn"),
    ("running", {"worker": "sha256:" + "b" * 64}, "fail"),  # a peer on another image
])
def test_a_rank_launched_alone_joins_its_running_peer(peer, images, expect):
    """`launch 0` while rank 1 runs: rank 1's container is the peer the head joins, not a stale container; only
    rank 0's own name is checked for one. A missing or stopped worker is said (the head waits for it at the
    rendezvous); one on another image fails."""
    from sparkstack.launch.plan import plan_launch_from_recipe
    from sparkstack.launch.preflight import docker_checks
    from sparkstack.recipe import load_recipe

    plan = plan_launch_from_recipe(load_recipe("glm53-flash-dflash2-nvfp4"), {})
    head, worker = (r.name for r in plan.ranks)
    host = ContainerHost({worker: peer} if peer else {})
    host.images = {worker: images["worker"]} if images else {}
    checks = docker_checks(plan, {0: ContainerHost({}), 1: host}, gates=False, launching=(0,))
    by_name = {(c.name, c.rank): c for c in checks}
    assert by_name[("stale-container", 0)].status == "pass"
    assert ("stale-container", 1) not in by_name
    assert by_name[("peer", 1)].status == expect, by_name[("peer", 1)]
    assert [c for c in checks if c.status == "fail"] == ([by_name[("peer", 1)]] if expect == "fail" else [])
    # rank 0's own name is still checked when it is launched alone
    checks = docker_checks(plan, {0: ContainerHost({head: "exited"}), 1: host}, gates=False, launching=(0,))
    assert {c.rank: c.status for c in checks if c.name == "stale-container"} == {0: "fail"}
    # launching every rank: the running worker is a stale container again
    checks = docker_checks(plan, {0: ContainerHost({}), 1: host}, gates=False)
    stale = {c.rank: c.status for c in checks if c.name == "stale-container"}
    assert stale == {0: "pass", 1: "fail" if peer else "pass"}


@pytest.mark.parametrize("head, expect", [(None, "pass"), ("running", "warn"), ("exited", "warn")])
def test_a_worker_launched_alone_comes_before_its_head(head, expect):
    """`launch 1` first, as the design card orders: no head yet is the order itself. A head already there may be
    serving, which a worker cannot join: said, with the order to restart in."""
    from sparkstack.launch.plan import plan_launch_from_recipe
    from sparkstack.launch.preflight import docker_checks
    from sparkstack.recipe import load_recipe

    plan = plan_launch_from_recipe(load_recipe("glm53-flash-dflash2-nvfp4"), {})
    name = plan.ranks[0].name
    checks = docker_checks(plan, {0: ContainerHost({name: head} if head else {}), 1: ContainerHost({})}, gates=False,
                           launching=(1,))
    got = {(c.name, c.rank): c for c in checks if c.name in ("peer", "stale-container")}
    assert set(got) == {("peer", 0), ("stale-container", 1)}
    assert got[("peer", 0)].status == expect and got[("stale-container", 1)].status == "pass"
    if head:
        assert "launch stop" in got[("peer", 0)].detail


def test_a_worker_that_does_not_answer_ssh_is_one_line_and_asked_nothing_more(run_cli, host_and_hub, tmp_path):
    """Not one ConnectTimeout per question (host facts, fabric, snapshots, docker): one line, with the command
    that tests the very ssh this run used."""
    root, home = host_and_hub
    config = tmp_path / "ssh_config"
    config.write_text("Host *\n  HostName 127.0.0.1\n  Port 9\n  BatchMode yes\n")  # port 9: refused at once
    # the real ssh (the stand-ins' ssh runs every command here): it meets a closed port
    proc = run_cli("launch", "all", "--dry-run", "--probe", "--json", "--host-root", root, "--ssh-config", config,
                   env={"HF_HOME": str(home), "VLLM_API_KEY": "k", "PATH": os.environ["PATH"], "WORKER_SSH": "me@spark-2"})
    worker = [c for c in json.loads(proc.stdout)["preflight"] if c.get("rank") == 1]
    assert [(c["check"], c["status"]) for c in worker] == [("ssh", "fail")], worker
    assert worker[0]["detail"].startswith("me@spark-2 unreachable: ssh to me@spark-2 failed (")
    assert f"`ssh -F {config} -o BatchMode=yes me@spark-2 true`" in worker[0]["detail"]
    assert "Connection refused" in worker[0]["detail"]
    assert proc.returncode == 1


def test_the_shipped_worker_placeholder_is_named_with_what_to_set(run_cli, host_and_hub):
    root, home = host_and_hub
    env = {"HF_HOME": str(home), "VLLM_API_KEY": "k", **standin_env(root)}
    doc = json.loads(run_cli("launch", "all", "--dry-run", "--json", "--host-root", root, env=env).stdout)
    (line,) = [c for c in doc["preflight"] if c["check"] == "worker-ssh"]
    assert line["status"] == "warn" and line["rank"] == 1 and "set WORKER_SSH to your worker" in line["detail"]
    mine = json.loads(run_cli("launch", "all", "--dry-run", "--json", "--host-root", root,
                              env={**env, "WORKER_SSH": "tony@spark-2"}).stdout)
    assert not [c for c in mine["preflight"] if c["check"] == "worker-ssh"]


def test_a_workers_home_in_its_hub_path_is_said_in_a_note():
    """No HF_HOME: the worker's hub is under its own user's home, which only ssh there can read."""
    from sparkstack.launch.plan import plan_launch_from_recipe
    from sparkstack.recipe import load_recipe

    notes = plan_launch_from_recipe(load_recipe(None), {}).notes
    assert any(n.startswith("rank 1's ~/.cache/huggingface/hub is under its user's home on user@worker-node")
               for n in notes), notes
    assert not any("under its user's home" in n for n in plan_launch_from_recipe(load_recipe(None),
                                                                                 {"HF_HOME": "/data/hf"}).notes)
