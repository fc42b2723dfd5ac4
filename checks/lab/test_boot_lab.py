"""The boot timeline in the two-host lab: the stand-in engine prints lines made from the same table the parser reads
(bootlines.BOOT_LINES), with delays; launch reports each rank's phases, KV figure and the pool, and ends the boot
wait at the first fatal line."""

import json
import re
from pathlib import Path

import pytest
from test_launch_lab import containers, lab_recipe, launch_world, sparkstack  # noqa: F401 (launch_world: a fixture)

from sparkstack.launch.bootlines import BOOT_LINES
from sparkstack.launch.timeline import message

LINES = {line.key: line for line in BOOT_LINES}
FATAL = [line.key for line in BOOT_LINES if line.kind == "fatal"]
# Phases count from the container's State.StartedAt, which dockerd records after the runtime has started the
# process: on CI's loaded two cores that stamp came 0.18 s after the stand-in's first sleep began.
STARTED_AT_LAG = 0.3
MEASURED_BYTES, MEASURED_TOKENS = 10247694336, 989727  # the recipe's [kv] point: the measured GB10 boot


def vllm(key: str, proc: str = "Worker_TP0", **figures: str) -> str:
    """A table line behind vLLM's prefix, as a recent build prints it."""
    return f"({proc} pid=7) INFO 05-01 10:00:00 [standin.py:1] {LINES[key].line(**figures)}"


# The lines the blog confirms by eye in a Spark head's boot, as that image prints them: the shipped
# recipe expects them ([boot] expect), and verify fails a boot that lacks one.
CONFIRMED = [
    "(EngineCore_DP0 pid=1) INFO 05-01 10:00:00 [modelopt.py:1] Detected ModelOpt NVFP4 checkpoint (quant_algo=NVFP4)",
    "(Worker_TP0 pid=1) INFO 05-01 10:00:00 [nvfp4.py:1] Using 'MARLIN' NvFp4 MoE backend out of potential backends: "
    "['MARLIN']",
    "(Worker_TP0 pid=1) INFO 05-01 10:00:00 [eagle3_utils.py:1] Using Eagle3 auxiliary layers from config: "
    "(6, 15, 25, 34, 43)",
    "(Worker_TP0 pid=1) INFO 05-01 10:00:00 [breakable_cudagraph.py:1] Breakable CUDA graph enabled",
]
HEAD_SCRIPT = [
    [0.8, vllm("loading-weights")],
    *[[0.0, line] for line in CONFIRMED],  # after the first phase: its lower bound is the first delay alone
    [0.1, vllm("model-loading")],
    [0.4, vllm("kv-memory", kv_gib="9.54")],
    [0.1, vllm("kv-tokens", proc="EngineCore_DP0", kv_tokens="989,727")],
    [0.0, vllm("max-concurrency", proc="EngineCore_DP0", max_len="524,288", concurrency="1.89")],
    [0.4, vllm("graphs-captured")],
    [0.2, vllm("engine-ready", proc="EngineCore_DP0")],
    [0.2, f"(APIServer pid=1) INFO:     {LINES['api-ready'].line()}"],
]
WORKER_SCRIPT = [
    [0.6, f"INFO 05-01 10:00:00 [gpu_model_runner.py:1] {LINES['model-loading-older'].line()}"],  # an older build
    [0.3, vllm("kv-memory", proc="Worker_TP1", kv_gib="5.12")],
    [0.1, f"(Worker_TP1 pid=7) WARNING 05-01 10:00:00 [shm_broadcast.py:466] {LINES['shm-broadcast-wait'].line()}"],
    [0.3, vllm("graphs-captured", proc="Worker_TP1")],
]


def lower_bounds(script: list) -> dict[str, float]:
    """The seconds of sleep before each phase's first line: the least it can be after the container started."""
    bounds, total = {}, 0.0
    for delay, text in script:
        total += delay
        for line in BOOT_LINES:
            if line.kind == "phase" and re.search(line.pattern, message(text)):
                bounds.setdefault(line.phase, total)
    return bounds


def test_launch_all_and_status_show_each_ranks_timeline_and_the_pool(launch_world):  # noqa: F811
    lab, _, work, _, _ = launch_world
    recipe = lab_recipe(lab, work, {"STANDIN_HEALTH_DELAY": "0",
                                    "STANDIN_BOOT_SCRIPT": json.dumps({"0": HEAD_SCRIPT, "1": WORKER_SCRIPT})})
    try:
        proc = sparkstack(lab, launch_world, recipe, "all", "--worker-delay", "0.5", "--health-interval", "0.3",
                          "--health-attempts", "200")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        record_path = Path(re.search(r"^run record: (\S+)$", proc.stdout, re.MULTILINE).group(1))
        boot = json.loads(record_path.read_text())["boot"]
        head, worker = boot["timeline"]
        assert list(head["phases"]) == ["weights loaded", "KV profiled", "graphs captured", "engine ready", "API ready"]
        assert list(worker["phases"]) == ["weights loaded", "KV profiled", "graphs captured"]
        for rank, script in ((head, HEAD_SCRIPT), (worker, WORKER_SCRIPT)):
            times = list(rank["phases"].values())
            assert times == sorted(times)
            for phase, least in lower_bounds(script).items():
                assert rank["phases"][phase] >= least - STARTED_AT_LAG, (phase, rank["phases"])
        assert (head["kv_available_gib"], head["kv_cache_tokens"], head["max_concurrency"]) == (9.54, 989727, 1.89)
        assert worker["kv_available_gib"] == 5.12 and worker["fatal"] is None
        assert [w["key"] for w in worker["warnings"]] == ["shm-broadcast-wait"]  # reported; the launch went on
        pool_bytes = round(5.12 * 2**30)
        tokens = pool_bytes * MEASURED_TOKENS // MEASURED_BYTES
        assert boot["kv_pool"]["bytes"] == pool_bytes and boot["kv_pool"]["smallest_rank"] == 1
        assert boot["kv_pool"]["tokens"] == tokens
        assert f"{pool_bytes:,} B = {tokens:,} tokens" in proc.stdout
        assert "rank 1: warning at" in proc.stdout and "Available KV cache memory 5.12 GiB" in proc.stdout

        status = sparkstack(lab, launch_world, recipe, "status", "--json")
        assert json.loads(status.stdout)["last_run"]["boot"]["timeline"] == boot["timeline"]
        status = sparkstack(lab, launch_world, recipe, "status")
        assert status.returncode == 0, status.stderr
        shown = [line for line in status.stdout.splitlines() if line.startswith(("  rank", "KV pool"))]
        assert shown and all(line in proc.stdout.splitlines() for line in shown)  # the launch's own lines, again
        assert f"{pool_bytes:,} B = {tokens:,} tokens" in status.stdout
    finally:
        sparkstack(lab, launch_world, recipe, "stop")


@pytest.mark.parametrize("key", FATAL)
def test_each_fatal_line_ends_the_boot_wait_with_a_diagnosis(launch_world, key):  # noqa: F811
    """Odd cases on the head, even on the worker; the first keeps running after its line (vLLM can hang on one)."""
    lab, _, work, _, _ = launch_world
    rank = FATAL.index(key) % 2
    line = vllm(key, proc=f"Worker_TP{rank}")
    scripts = {"0": HEAD_SCRIPT[:2], "1": WORKER_SCRIPT[:1]}
    env = {"STANDIN_HEALTH_DELAY": "never"}
    if key == FATAL[0]:
        scripts[str(rank)] = scripts[str(rank)] + [[0.2, line]]
    else:
        env["STANDIN_DIE_WITH"] = json.dumps({str(rank): line})
    recipe = lab_recipe(lab, work, {**env, "STANDIN_BOOT_SCRIPT": json.dumps(scripts)})
    try:
        proc = sparkstack(lab, launch_world, recipe, "all", "--worker-delay", "0", "--health-interval", "0.3",
                          "--health-attempts", "400")
        assert proc.returncode == 1
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith(f"sparkstack: error: rank {rank}: fatal boot line at ") and LINES[key].diagnosis in last
        assert f"--- rank {rank} log (last lines) ---" in proc.stderr and line in proc.stderr
        assert f"--- rank {1 - rank} log" not in proc.stderr  # that rank's lines, not the other's
        assert "no /health 200" not in proc.stderr
    finally:
        sparkstack(lab, launch_world, recipe, "stop")
    assert containers(lab.head) == [] and containers(lab.worker) == []
