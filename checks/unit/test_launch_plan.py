"""Launch plans: the docker argv per rank, knob by knob, against the old (seed) launcher's argv."""

import json
from pathlib import Path

import pytest

from clirun import PLANNED

MODEL_REV = "a" * 40
DRAFT_REV = "b" * 40


@pytest.fixture
def hf_home(tmp_path):
    hub = tmp_path / "hf" / "hub"
    for name, rev in (("models--LibertAIDAI--GLM-5.3-Flash-NVFP4-no-MTP", MODEL_REV), ("models--incoai--GLM-5.3-Flash-DFlash2", DRAFT_REV)):
        (hub / name / "refs").mkdir(parents=True)
        (hub / name / "refs" / "main").write_text(rev)
        (hub / name / "snapshots" / rev).mkdir(parents=True)
    return tmp_path / "hf"


def old_launcher_argv(rank: int, hf_home: Path, **k) -> list[str]:
    """The seed launcher's `docker run` for one rank, written out by hand, with its knobs."""
    knobs = dict(IMAGE="glm53-dflash2-tony:v1", NAME=f"glm53-tony-rank{rank}", SERVED_NAME="LibertAIDAI/GLM-5.3-Flash-NVFP4",
                 LOAD_FORMAT="", EAGER="0", NUM_SPEC_TOKENS="4", GPU_MEM_UTIL="0.90", KV_CACHE_MEMORY="10247694336",
                 OMP_NUM_THREADS="8", VLLM_CPU_OMP_THREADS_BIND="nobind", MAX_NUM_BATCHED_TOKENS="8192", API_PORT="8888",
                 MAX_MODEL_LEN="524288", MAX_NUM_SEQS="6", MOE_BACKEND="marlin", MASTER_ADDR="10.0.0.1",
                 MASTER_PORT="29521", CX_NIC="enp1s0f1np1", CX_HCA="rocep1s0f1")
    knobs.update(k)
    nic, hca = knobs["CX_NIC"], knobs["CX_HCA"]
    argv = ["docker", "run", "-d", "--name", knobs["NAME"], "--restart", "no", "--gpus", "all", "--network", "host",
            "--ipc", "host", "--shm-size", "16g", "--ulimit", "memlock=-1:-1", "--cap-add", "IPC_LOCK",
            "--device", "/dev/infiniband:/dev/infiniband", "-v", f"{hf_home}/hub:/root/.cache/huggingface/hub:ro"]
    env = [("VLLM_HOST_IP", "10.0.0.1" if rank == 0 else "10.0.0.2"),
           ("VLLM_CPU_OMP_THREADS_BIND", knobs["VLLM_CPU_OMP_THREADS_BIND"]), ("OMP_NUM_THREADS", knobs["OMP_NUM_THREADS"]),
           ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("VLLM_ENGINE_READY_TIMEOUT_S", "3600"),
           ("TORCH_CUDA_ARCH_LIST", "12.1a"), ("FLASHINFER_CUDA_ARCH_LIST", "12.1a"),
           ("FLASHINFER_DISABLE_VERSION_CHECK", "1"), ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
           ("NCCL_NET", "IB"), ("NCCL_IB_DISABLE", "0"), ("NCCL_IB_HCA", hca), ("NCCL_IB_GID_INDEX", "3"),
           ("NCCL_IB_ROCE_VERSION_NUM", "2"), ("NCCL_SOCKET_IFNAME", nic), ("GLOO_SOCKET_IFNAME", nic),
           ("NCCL_IB_ADDR_FAMILY", "AF_INET"), ("NCCL_IB_ADDR_RANGE", "10.0.0.0/24"), ("NCCL_NVLS_ENABLE", "0"),
           ("NCCL_CROSS_NIC", "0"), ("NCCL_IB_MERGE_NICS", "0"), ("NCCL_CUMEM_ENABLE", "0"),
           ("NCCL_IGNORE_CPU_AFFINITY", "1"), ("NCCL_DEBUG", "WARN"), ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
           ("NCCL_IB_TIMEOUT", "22")]
    for name, value in env:
        argv += ["-e", f"{name}={value}"]
    hub = "/root/.cache/huggingface/hub"
    argv += [knobs["IMAGE"], f"{hub}/models--LibertAIDAI--GLM-5.3-Flash-NVFP4-no-MTP/snapshots/{MODEL_REV}",
             "--served-model-name", knobs["SERVED_NAME"], "--host", "0.0.0.0", "--port", knobs["API_PORT"],
             "--trust-remote-code", "--tensor-parallel-size", "2"]
    if knobs["LOAD_FORMAT"]:
        argv += ["--load-format", knobs["LOAD_FORMAT"]]
    argv += ["--distributed-executor-backend", "mp", "--nnodes", "2", "--node-rank", str(rank),
             "--master-addr", knobs["MASTER_ADDR"], "--master-port", knobs["MASTER_PORT"]]
    if rank == 1:
        argv.append("--headless")
    argv += ["--max-model-len", knobs["MAX_MODEL_LEN"], "--max-num-seqs", knobs["MAX_NUM_SEQS"], "--block-size", "2304",
             "--max-num-batched-tokens", knobs["MAX_NUM_BATCHED_TOKENS"], "--moe-backend", knobs["MOE_BACKEND"]]
    if knobs["EAGER"] == "1":
        argv.append("--enforce-eager")
    argv += ["--kv-cache-dtype", "fp8_e4m3"]
    if knobs["KV_CACHE_MEMORY"]:
        argv += ["--kv-cache-memory", knobs["KV_CACHE_MEMORY"]]  # the seed's abbreviation (see without_labels)
    argv += ["--gpu-memory-utilization", knobs["GPU_MEM_UTIL"], "--speculative-config",
             '{"method":"dflash","model":"%s/models--incoai--GLM-5.3-Flash-DFlash2/snapshots/%s","num_speculative_tokens":%s}'
             % (hub, DRAFT_REV, knobs["NUM_SPEC_TOKENS"]),
             "--tool-call-parser", "glm47", "--enable-auto-tool-choice", "--reasoning-parser", "glm45"]
    return argv


# The deliberate differences: two labels that record what sparkstack started, and --kv-cache-memory written in full
# as the option vLLM has, --kv-cache-memory-bytes (the seed's spelling parsed only as argparse's abbreviation).
def without_labels(argv: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--label" and argv[i + 1].startswith("org.sparkstack."):
            i += 2
            continue
        out.append("--kv-cache-memory" if argv[i] == "--kv-cache-memory-bytes" else argv[i])
        i += 1
    return out


def plan_json(run_cli, hf_home, target="all", *extra, env=None, check=PLANNED):
    full_env = {"HF_HOME": str(hf_home), **(env or {})}
    proc = run_cli("launch", target, "--dry-run", "--json", *extra, env=full_env, check=check)
    return json.loads(proc.stdout) if check == PLANNED else proc


def test_empty_environment_reproduces_the_old_launcher(run_cli, hf_home):
    doc = plan_json(run_cli, hf_home)
    assert [without_labels(r["docker_run"]) for r in doc["ranks"]] == [old_launcher_argv(0, hf_home), old_launcher_argv(1, hf_home)]
    labels = [a for a in doc["ranks"][1]["docker_run"] if a.startswith("org.sparkstack.")]
    assert labels == ["org.sparkstack.recipe=glm53-flash-dflash2-nvfp4", "org.sparkstack.rank=1"]


def test_single_rank_prints_docker_run_object(run_cli, hf_home):
    doc = plan_json(run_cli, hf_home, "1")
    assert doc["docker_run"][:2] == ["docker", "run"] and doc["rank"] == 1
    assert without_labels(doc["docker_run"]) == old_launcher_argv(1, hf_home)
    # rank 0 is not started: its host's facts are not judged; rank 1's are read over ssh, with --probe
    assert [c["status"] for c in doc["preflight"] if c["check"] == "head"] == ["skip"]
    assert not any(c["check"] == "nic" for c in doc["preflight"])


KNOB_CASES = {
    "IMAGE": "mine:v2", "SERVED_NAME": "me/model", "LOAD_FORMAT": "instanttensor", "EAGER": "1", "NUM_SPEC_TOKENS": "7",
    "GPU_MEM_UTIL": "0.85", "KV_CACHE_MEMORY": "5905580032", "OMP_NUM_THREADS": "4", "VLLM_CPU_OMP_THREADS_BIND": "0-7",
    "MAX_NUM_BATCHED_TOKENS": "4096", "API_PORT": "9000", "MAX_MODEL_LEN": "262144", "MAX_NUM_SEQS": "2",
    "MOE_BACKEND": "cutlass", "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "29600", "CX_NIC": "enp1s0f0np0",
    "CX_HCA": "rocep1s0f0", "NAME": "custom-name",
}


@pytest.mark.parametrize("knob", sorted(KNOB_CASES))
def test_each_knob_changes_exactly_its_part(run_cli, hf_home, knob):
    value = KNOB_CASES[knob]
    doc = plan_json(run_cli, hf_home, env={knob: value})
    for rank, r in enumerate(doc["ranks"]):
        got = without_labels(r["docker_run"])
        assert got == old_launcher_argv(rank, hf_home, **{knob: value}), knob
        assert got != old_launcher_argv(rank, hf_home), f"{knob} changed nothing"
        flags = [a for a in got if a.startswith("--")]
        assert len(flags) == len(set(flags)) or knob == "IMAGE", "a flag was emitted twice"


def test_kv_cache_memory_set_but_empty_drops_the_pin(run_cli, hf_home):
    doc = plan_json(run_cli, hf_home, env={"KV_CACHE_MEMORY": ""})
    argv = doc["ranks"][0]["docker_run"]
    assert "--kv-cache-memory" not in argv and "--kv-cache-memory-bytes" not in argv
    assert without_labels(argv) == old_launcher_argv(0, hf_home, KV_CACHE_MEMORY="")


def test_hf_home_and_cache_names(run_cli, hf_home, tmp_path):
    other = tmp_path / "other"
    hub = other / "hub" / "models--x--y"
    (hub / "refs").mkdir(parents=True)
    (hub / "refs" / "main").write_text("c" * 40)
    doc = plan_json(run_cli, hf_home, env={"HF_HOME": str(other), "MODEL_CACHE_NAME": "models--x--y"})
    argv = doc["ranks"][0]["docker_run"]
    assert f"{other}/hub:/root/.cache/huggingface/hub:ro" in argv
    assert f"/root/.cache/huggingface/hub/models--x--y/snapshots/{'c' * 40}" in argv
    assert doc["model_revision"] == "c" * 40


def test_worker_ssh_knob_sets_the_worker_target(run_cli, hf_home):
    doc = plan_json(run_cli, hf_home, env={"WORKER_SSH": "me@spark-2"})
    assert doc["ranks"][1]["ssh"] == "me@spark-2" and doc["ranks"][0]["ssh"] is None


def test_the_recipes_own_knobs_win_over_the_built_in_defaults(run_cli, hf_home, tmp_path):
    """The shipped recipe's [knobs] equal the defaults, so only a recipe with other values shows whose they are."""
    text = Path("recipes/glm53-flash-dflash2-nvfp4/recipe.toml").read_text()
    mine = {"WORKER_SSH": "me@spark-7", "MAX_MODEL_LEN": "65536", "KV_CACHE_MEMORY": "4294967296", "CX_NIC": "enp9s0"}
    for knob, value in mine.items():
        line = next(line for line in text.splitlines() if line.startswith(f"{knob} = "))
        text = text.replace(line, f'{knob} = "{value}"')
    (tmp_path / "r.toml").write_text(text)
    doc = plan_json(run_cli, hf_home, "all", "--recipe", tmp_path / "r.toml")
    head = doc["ranks"][0]["docker_run"]
    assert doc["ranks"][1]["ssh"] == "me@spark-7"
    assert head[head.index("--max-model-len") + 1] == "65536"
    assert head[head.index("--kv-cache-memory-bytes") + 1] == "4294967296"
    assert "NCCL_SOCKET_IFNAME=enp9s0" in head
    # and the environment still wins over the recipe
    doc = plan_json(run_cli, hf_home, "all", "--recipe", tmp_path / "r.toml", env={"MAX_MODEL_LEN": "2048"})
    assert doc["ranks"][0]["docker_run"][doc["ranks"][0]["docker_run"].index("--max-model-len") + 1] == "2048"


def test_a_nodes_own_nic_and_hca_win_over_the_knobs(run_cli, hf_home, tmp_path):
    """[[nodes]] nic/hca name one machine's ports; CX_NIC/CX_HCA are the default for nodes that name none."""
    text = Path("recipes/glm53-flash-dflash2-nvfp4/recipe.toml").read_text()
    worker = 'ssh = "{WORKER_SSH}"\n'
    assert text.count(worker) == 1
    (tmp_path / "r.toml").write_text(text.replace(worker, worker + 'nic = "enp7s0"\nhca = "mlx5_7"\n'))
    doc = plan_json(run_cli, hf_home, "all", "--recipe", tmp_path / "r.toml", env={"CX_NIC": "enp2s0", "CX_HCA": "mlx5_2"})
    head, worker_argv = doc["ranks"][0]["docker_run"], doc["ranks"][1]["docker_run"]
    assert "NCCL_SOCKET_IFNAME=enp2s0" in head and "NCCL_IB_HCA=mlx5_2" in head
    assert "NCCL_SOCKET_IFNAME=enp7s0" in worker_argv and "NCCL_IB_HCA=mlx5_7" in worker_argv


def test_api_key_never_enters_argv_or_json(run_cli, hf_home):
    secret = "sk-very-secret-value"
    proc = run_cli("launch", "all", "--dry-run", "--json", env={"HF_HOME": str(hf_home), "VLLM_API_KEY": secret}, check=PLANNED)
    assert secret not in proc.stdout and secret not in proc.stderr
    doc = json.loads(proc.stdout)
    head = doc["ranks"][0]["docker_run"]
    assert head[head.index("VLLM_API_KEY") - 1] == "-e"  # by name: docker takes the value from its own environment
    assert "VLLM_API_KEY" not in doc["ranks"][1]["docker_run"]


def test_lab_profile_drops_only_what_the_lab_lacks(run_cli, hf_home):
    prod = plan_json(run_cli, hf_home)["ranks"][0]["docker_run"]
    lab = plan_json(run_cli, hf_home, "all", "--profile", "lab")["ranks"][0]["docker_run"]
    removed = list(prod)
    for flag, value in (("--gpus", "all"), ("--ulimit", "memlock=-1:-1"), ("--device", "/dev/infiniband:/dev/infiniband")):
        i = removed.index(flag)
        assert removed[i + 1] == value
        del removed[i:i + 2]
    assert lab == removed


def test_plain_recipe_uses_its_args_and_env_as_they_are(run_cli, hf_home):
    doc = plan_json(run_cli, hf_home, "0", "--recipe", "glm53-flash-dflash2-mxfp8")
    argv = doc["docker_run"]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "dflash", "model": "local-inference-lab/GLM-5.3-Flash-DFlash2-MXFP8",
                    "num_speculative_tokens": 7, "kv_cache_dtype": "auto"}  # shell quotes removed, nothing else
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == "10737418240"
    assert "-e" in argv and "OMP_NUM_THREADS=4" in argv and "FLASHINFER_CUDA_ARCH_LIST=12.1f" in argv
    assert argv[argv.index("--shm-size") + 1] == "32gb"
    assert "--enforce-eager" in argv and argv.count("--load-format") == 1
    assert doc["status"] == "blocked" and "not divisible" in doc["blocked_reason"]
    # Knobs the user sets still win: KV_CACHE_MEMORY replaces the recipe's pin, under the full name.
    doc = plan_json(run_cli, hf_home, "0", "--recipe", "glm53-flash-dflash2-mxfp8",
                    env={"KV_CACHE_MEMORY": "123", "NUM_SPEC_TOKENS": "3", "EAGER": "0", "OMP_NUM_THREADS": "2"})
    argv = doc["docker_run"]
    assert "--kv-cache-memory" not in argv and argv.count("--kv-cache-memory-bytes") == 1
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == "123"
    assert json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"] == 3
    assert "--enforce-eager" not in argv
    assert "OMP_NUM_THREADS=2" in argv and "OMP_NUM_THREADS=4" not in argv


def test_blocked_recipe_is_refused_unless_forced(run_cli, hf_home, tmp_path):
    proc = run_cli("launch", "all", "--recipe", "glm53-flash-dflash2-mxfp8", "--host-root", tmp_path,
                   env={"HF_HOME": str(hf_home)})
    assert proc.returncode == 1
    assert "blocked" in proc.stdout + proc.stderr and "not divisible" in proc.stdout + proc.stderr


def test_n_nodes_follow_the_list(run_cli, hf_home, tmp_path):
    text = Path("recipes/glm53-flash-dflash2-nvfp4/recipe.toml").read_text()
    text = text.replace("required_nodes = 2", "required_nodes = 3")
    text += '\n[[nodes]]\nhost = "spark-3"\nssh = "me@spark-3"\nfabric_ip = "10.0.0.3"\n'
    (tmp_path / "r.toml").write_text(text)
    doc = plan_json(run_cli, hf_home, "all", "--recipe", tmp_path / "r.toml")
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2]
    for r in doc["ranks"]:
        argv = r["docker_run"]
        assert argv[argv.index("--nnodes") + 1] == "3" and argv[argv.index("--node-rank") + 1] == str(r["rank"])
        assert ("--headless" in argv) == (r["rank"] != 0)
    assert "VLLM_HOST_IP=10.0.0.3" in doc["ranks"][2]["docker_run"]


def test_plan_kv_reproduces_the_measured_points(run_cli):
    measured = json.loads(run_cli("plan", "kv", "--json", check=0).stdout)
    assert measured["tokens"] == 989727 and measured["page_unification"]["ok"] is True
    assert measured["coverage"] == pytest.approx(989727 / 524288, abs=0.001)
    # Predict the upstream recipe's 5.5 GiB pin from the one measured point: about 570k tokens.
    small = json.loads(run_cli("plan", "kv", "--kv-bytes", str(int(5.5 * 2**30)), "--json", check=0).stdout)
    assert 560_000 <= small["tokens"] <= 580_000
    mx = json.loads(run_cli("plan", "kv", "--recipe", "glm53-flash-dflash2-mxfp8", "--json", check=0).stdout)
    assert mx["page_unification"]["ok"] is False and "4096 % 660" in mx["page_unification"]["reason"]
    assert "2048 % 660" in mx["page_unification"]["reason"]


def test_plan_kv_reports_the_measured_per_token_cost_in_json_and_text(run_cli):
    """On GB10 a 10,247,694,336 B pin gave 989,727 tokens, i.e. 10,354.06 B per token. That figure is what a
    user sizes a new pin by, so it is held to the measured one in both outputs, not only through the tokens."""
    measured = json.loads(run_cli("plan", "kv", "--json", check=0).stdout)
    assert measured["kv_bytes"] == 10_247_694_336 and measured["max_model_len"] == 524_288
    assert measured["per_token_bytes"] == pytest.approx(10_354.06, abs=0.005)
    # Another pin costs the same per token: 5.5 GiB at 10,354.06 B/token is about 570,363 tokens.
    small = json.loads(run_cli("plan", "kv", "--kv-bytes", str(int(5.5 * 2**30)), "--json", check=0).stdout)
    assert small["per_token_bytes"] == measured["per_token_bytes"] and small["kv_bytes"] == 5_905_580_032
    assert abs(small["tokens"] - 5_905_580_032 / 10_354.06) < 1
    text = run_cli("plan", "kv", check=0).stdout.splitlines()
    assert text[0] == "10,247,694,336 B / 10,354.06 B per token = 989,727 tokens = 1.89x max-model-len 524,288"
    # The MXFP8 recipe was never booted: no measured cost, so no tokens, rather than a guess.
    mx = json.loads(run_cli("plan", "kv", "--recipe", "glm53-flash-dflash2-mxfp8", "--json", check=0).stdout)
    assert mx["per_token_bytes"] is None and mx["tokens"] is None


def test_page_unification_rules():
    from sparkstack.recipe import KvGeometry
    from sparkstack.recipe.kv import page_unification

    assert page_unification(KvGeometry(), 2304).ok is None
    assert page_unification(KvGeometry(), 2304).reason == "geometry unknown"
    # Exact fit: 660 B x 2304 tokens = 1,520,640 B = 2970 x 512 B, but 2970 is not a multiple of 64 -> standalone.
    standalone = page_unification(KvGeometry(mla_page_bytes_per_token=660, indexer_page_bytes_per_token=132,
                                             drafter_page_bytes_per_token=512, drafter_group_patch=True), 2304)
    assert standalone.ok is True and "standalone" in standalone.reason
    # 1024 B/token MLA x 256 tokens = 262,144 B = 64 x 4096 B: the drafter rides the MLA page.
    rides = page_unification(KvGeometry(mla_page_bytes_per_token=1024, indexer_page_bytes_per_token=128,
                                        drafter_page_bytes_per_token=4096, drafter_group_patch=True), 256)
    assert rides.ok is True and "rides" in rides.reason
    divisible = page_unification(KvGeometry(mla_page_bytes_per_token=1024, indexer_page_bytes_per_token=128,
                                            drafter_page_bytes_per_token=512), 256)
    assert divisible.ok is True


def test_remote_hf_home_tilde_is_expanded_on_the_worker():
    from sparkstack.launch.apply import _docker_run
    from sparkstack.launch.plan import RankPlan
    from sparkstack.remote import Runner

    class FakeRunner(Runner):
        def run(self, argv, timeout=120, env=None):
            import subprocess
            assert argv == ["printenv", "HOME"]
            return subprocess.CompletedProcess(argv, 0, "/home/spark\n", "")

    hub = "~/.cache/huggingface/hub"
    rank = RankPlan(1, "w", "me@w", None, "n", "10.0.0.2", "nic", "hca", hub,
                    ("docker", "run", "-v", f"{hub}:/root/.cache/huggingface/hub:ro", "img"))
    argv = _docker_run(rank, FakeRunner(ssh="me@w"))
    assert argv == ["docker", "run", "-v", "/home/spark/.cache/huggingface/hub:/root/.cache/huggingface/hub:ro", "img"]


def test_flag_equals_value_is_one_flag_a_knob_can_replace(run_cli, hf_home, tmp_path):
    """`--max-model-len=1000` in a plain recipe is the same flag as `--max-model-len 1000`: a knob replaces it."""
    text = Path("recipes/glm53-flash-dflash2-mxfp8/recipe.toml").read_text()
    assert '"--max-model-len", "524288",' in text
    (tmp_path / "r.toml").write_text(text.replace('"--max-model-len", "524288",', '"--max-model-len=1000",'))
    argv = plan_json(run_cli, hf_home, "0", "--recipe", tmp_path / "r.toml")["docker_run"]
    assert argv[argv.index("--max-model-len") + 1] == "1000"
    argv = plan_json(run_cli, hf_home, "0", "--recipe", tmp_path / "r.toml", env={"MAX_MODEL_LEN": "2048"})["docker_run"]
    assert [a for a in argv if a.startswith("--max-model-len")] == ["--max-model-len"]
    assert argv[argv.index("--max-model-len") + 1] == "2048"


def test_fabric_addresses_follow_the_nodes_not_master_addr(run_cli, hf_home):
    """Each rank announces its own fabric address; MASTER_ADDR only says where rank 0 listens."""
    doc = plan_json(run_cli, hf_home, env={"MASTER_ADDR": "192.168.7.1"})
    assert "VLLM_HOST_IP=10.0.0.1" in doc["ranks"][0]["docker_run"]
    assert "VLLM_HOST_IP=10.0.0.2" in doc["ranks"][1]["docker_run"]
    for r in doc["ranks"]:
        assert r["docker_run"][r["docker_run"].index("--master-addr") + 1] == "192.168.7.1"


@pytest.mark.parametrize("ips, network", [
    (("10.0.0.1", "10.0.0.2"), "10.0.0.0/24"),  # the seed's own value
    (("10.1.2.1", "10.1.3.2"), "10.1.2.0/23"),
    (("192.168.100.5", "192.168.100.6"), "192.168.100.0/24"),
    (("10.0.0.1", "172.16.0.1"), "0.0.0.0/0"),
])
def test_nccl_takes_the_gids_of_the_network_holding_every_rank(ips, network):
    from sparkstack.launch.plan import fabric_range

    assert fabric_range(ips) == network
