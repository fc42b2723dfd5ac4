"""KV calibration (`plan kv --from-boot`): a boot's measured pool from a run record or a raw log in each vLLM
version's format of the boot-line table (0.10, 0.13, 0.32 GPU and CPU), beside the plan; [kv.boot] written into a
recipe copy (comments kept) and read back; `launch status`'s KV line.

The logs below are written by hand from the boot lines the blog quotes and vLLM's format strings; the expected
figures are the blog's (989,727 tokens at the 10,247,694,336 B pin, 10,354.06 B per token; 481,488 tokens
self-profiled at 0.89), or worked out by hand in the comments."""

import shutil
from pathlib import Path

import pytest

from sparkstack import shipped
from sparkstack.errors import SparkstackError
from sparkstack.launch.calibrate import (
    POOL_PIN,
    POOL_PROFILED,
    calibrate,
    kv_boot_entry,
    measure_log,
    measure_record,
    read_boot_file,
)
from sparkstack.launch.report import kv_status_line, status_lines
from sparkstack.launch.timeline import parse_rank
from sparkstack.recipe import KvBoot, load_recipe, write_kv_boot
from sparkstack.recipe.kv import plan_kv

GIB = 1 << 30
PIN = 10_247_694_336
RECIPE = "glm53-flash-dflash2-nvfp4"
RERUN = ("sparkstack", "plan", "kv", "--from-boot", "--write")  # what a refusal says to run on a copy
CPU_LOG = Path(__file__).resolve().parents[1] / "engine" / "data" / "vllm-0.32.0-cpu-boot.log"

# vLLM 0.10: "Model loading took X GiB and Y seconds", the KV size and the concurrency on two lines, " seconds";
# self-profiled at 0.89 (no pin), eager: no graph line. The blog's figures: about 4.6 GiB, 481,488 tokens.
LOG_0_10 = """\
2026-03-20T10:00:03.000000000Z INFO 03-20 10:00:03 [api_server.py:1395] vLLM API server version 0.10.0
2026-03-20T10:00:03.100000000Z INFO 03-20 10:00:03 [utils.py:326] non-default args: {'max_model_len': 524288, 'gpu_memory_utilization': 0.89, 'enforce_eager': True}
2026-03-20T10:00:10.000000000Z INFO 03-20 10:00:10 [core.py:69] Initializing a V1 LLM engine (v0.10.0) with config: model='/root/.cache/huggingface/hub/m', kv_cache_dtype=fp8_e4m3
2026-03-20T10:04:50.000000000Z (VllmWorker rank=0 pid=88) INFO 03-20 10:04:50 [gpu_model_runner.py:1329] Model loading took 88.07 GiB and 288.31 seconds
2026-03-20T10:08:45.000000000Z (VllmWorker rank=0 pid=88) INFO 03-20 10:08:45 [gpu_worker.py:227] Available KV cache memory: 4.60 GiB
2026-03-20T10:08:46.000000000Z INFO 03-20 10:08:46 [kv_cache_utils.py:716] GPU KV cache size: 481,488 tokens
2026-03-20T10:08:46.000000000Z INFO 03-20 10:08:46 [kv_cache_utils.py:720] Maximum concurrency for 524,288 tokens per request: 0.92x
2026-03-20T10:08:50.000000000Z INFO 03-20 10:08:50 [core.py:193] init engine (profile, create kv cache, warmup model) took 300.12 seconds
2026-03-20T10:09:00.000000000Z INFO:     Application startup complete.
"""

# vLLM 0.13: "GiB memory and", still " seconds"; pinned: vLLM echoes the pin in its non-default args.
LOG_0_13 = """\
(APIServer pid=1) INFO 09-01 10:00:03 [api_server.py:1772] vLLM API server version 0.13.0
(APIServer pid=1) INFO 09-01 10:00:03 [utils.py:328] non-default args: {'model_tag': 'x', 'max_model_len': 524288, 'block_size': 2304, 'kv_cache_dtype': 'fp8_e4m3', 'kv_cache_memory_bytes': 10247694336, 'gpu_memory_utilization': 0.9}
(EngineCore_DP0 pid=250) INFO 09-01 10:00:10 [core.py:93] Initializing a V1 LLM engine (v0.13.0) with config: model='m'
(Worker_TP0 pid=312) INFO 09-01 10:05:02 [gpu_model_runner.py:3005] Model loading took 88.07 GiB memory and 299.40 seconds
(EngineCore_DP0 pid=250) INFO 09-01 10:08:51 [kv_cache_utils.py:1087] GPU KV cache size: 989,727 tokens
(EngineCore_DP0 pid=250) INFO 09-01 10:08:51 [kv_cache_utils.py:1091] Maximum concurrency for 524,288 tokens per request: 1.89x
(Worker_TP0 pid=312) INFO 09-01 10:10:10 [gpu_model_runner.py:3480] Graph capturing finished in 41 secs, took 1.20 GiB
(EngineCore_DP0 pid=250) INFO 09-01 10:10:12 [core.py:210] init engine (profile, create kv cache, warmup model) took 309.48 seconds
"""

# vLLM 0.32 on the GPU: the banner, the size and concurrency on one line, " s"; pinned as the blog pins.
LOG_0_32 = """\
(APIServer pid=1) INFO 12-01 10:00:03 [api_utils.py:347]  \u2584\u2584 \u2584\u2588 \u2588     \u2588     \u2588 \u2580\u2584\u2580 \u2588  version 0.32.0
(APIServer pid=1) INFO 12-01 10:00:03 [api_utils.py:286] non-default args: {'host': '0.0.0.0', 'port': 8888, 'kv_cache_memory_bytes': 10247694336, 'max_model_len': 524288}
(Worker_TP0 pid=312) INFO 12-01 10:08:50 [gpu_worker.py:402] Available KV cache memory: 9.54 GiB
(EngineCore pid=250) INFO 12-01 10:08:51 [kv_cache_utils.py:2327] GPU KV cache size: 989,727 tokens, Maximum concurrency for 524,288 tokens per request: 1.89x
(Worker_TP0 pid=312) INFO 12-01 10:10:10 [gpu_model_runner.py:5310] Graph capturing finished in 38 secs, took 1.52 GiB
(EngineCore pid=250) INFO 12-01 10:10:12 [core.py:402] init engine (profile, create kv cache, warmup model) took 309.48 s
"""

LOG_FATAL = """\
(EngineCore_DP0 pid=250) INFO 09-01 10:00:10 [core.py:93] Initializing a V1 LLM engine (v0.13.0) with config: model='m'
(EngineCore_DP0 pid=250) ERROR 09-01 10:03:00 [core.py:708] ValueError: Free memory on device (104.46/121.69 GiB) on startup is less than desired GPU memory utilization (0.90, 109.52 GiB)
"""


def test_0_10_profiled_boot():
    m = measure_log(LOG_0_10, "head.log")
    assert (m.tokens, m.pool, m.available_gib, m.vllm_version) == (481_488, POOL_PROFILED, 4.6, "0.10.0")
    assert m.pool_bytes == 4_939_212_390  # 4.6 x 1,073,741,824 = 4,939,212,390.4
    assert m.booted_at == "2026-03-20" and m.fatal is None


def test_0_13_pinned_boot_takes_the_echoed_pin():
    m = measure_log(LOG_0_13, "head.log")
    assert (m.tokens, m.pool_bytes, m.pool, m.vllm_version) == (989_727, PIN, POOL_PIN, "0.13.0")
    assert m.available_gib is None and m.per_token_bytes == 10_354.06  # the blog's 10,354.06 B per token
    assert m.booted_at is None  # no docker timestamps


def test_0_32_gpu_boot_one_line_size_and_the_banner_version():
    m = measure_log(LOG_0_32, "head.log")
    assert (m.tokens, m.pool_bytes, m.pool, m.vllm_version, m.available_gib) == (989_727, PIN, POOL_PIN, "0.32.0", 9.54)


@pytest.mark.parametrize("log, seconds, gib", [(LOG_0_13, 41.0, 1.2), (LOG_0_32, 38.0, 1.52), (LOG_0_10, None, None)])
def test_the_timeline_keeps_the_graph_capture_figures(log, seconds, gib):
    tl = parse_rank(0, log, 0.0)
    assert (tl.graph_s, tl.graph_gib) == (seconds, gib)
    assert tl.to_json()["graph_capture_s"] == seconds and tl.to_json()["graph_capture_gib"] == gib


def test_the_recorded_0_32_cpu_boot():
    """The real capture (checks/engine/data): VLLM_CPU_KVCACHE_SPACE=1, no pin; 1 GiB / 2,097,152 tokens = 512 B."""
    m = read_boot_file(CPU_LOG)
    assert (m.tokens, m.pool_bytes, m.pool, m.vllm_version) == (2_097_152, GIB, POOL_PROFILED, "0.32.0")
    assert m.per_token_bytes == 512.0 and m.booted_at == "2026-12-01" and m.source == str(CPU_LOG)


def test_a_boot_that_died_or_never_sized_its_pool_is_one_line():
    with pytest.raises(SparkstackError, match="died before its KV pool was sized: .*Free memory on device"):
        measure_log(LOG_FATAL, "head.log").require()
    with pytest.raises(SparkstackError, match="no `KV cache size: N tokens` line"):
        measure_log("hello\nworld\n", "notes.txt").require()


def record(pin: bool = True, head_gib: float | None = 9.54, worker_gib: float | None = 5.12) -> dict:
    argv = ["docker", "run", "-d", "img", "/m", "--max-model-len", "524288"]
    if pin:
        argv += ["--kv-cache-memory", str(PIN)]
    rank = {"phases": {}, "max_concurrency": 1.89, "fatal": None, "warnings": []}
    return {"id": "0123456789abcdef", "recipe": RECIPE, "image_id": "sha256:" + "ab" * 32,
            "started_at": "2026-12-04T10:00:00Z",
            "ranks": [{"rank": 0, "docker_run": argv}, {"rank": 1, "docker_run": argv + ["--headless"]}],
            "boot": {"port_open_s": 600.0, "health_s": 640.75, "ttft_s": 642.0,
                     "timeline": [rank | {"rank": 0, "kv_available_gib": head_gib, "kv_cache_tokens": 989_727},
                                  rank | {"rank": 1, "kv_available_gib": worker_gib, "kv_cache_tokens": None}],
                     "kv_pool": None}}


def test_a_record_with_a_pin_is_exact():
    m = measure_record(record())
    assert (m.tokens, m.pool_bytes, m.pool, m.run_id, m.ranks) == (989_727, PIN, POOL_PIN, "0123456789abcdef", (0, 1))
    assert m.source == "run 0123456789abcdef" and m.image_id.startswith("sha256:ab")


def test_a_record_without_a_pin_takes_the_smallest_rank():
    m = measure_record(record(pin=False))
    assert (m.pool, m.available_gib, m.pool_bytes) == (POOL_PROFILED, 5.12, 5_497_558_139)  # 5.12 GiB, rounded


def test_a_record_of_workers_only_has_no_boot():
    doc = record() | {"boot": None}
    assert measure_record(doc).tokens is None
    with pytest.raises(SparkstackError, match="no `KV cache size"):
        measure_record(doc).require()


def shipped_plan(kv_bytes=PIN):
    r = load_recipe(RECIPE)
    return plan_kv(r.kv, kv_bytes, 524_288, 2304, "fp8_e4m3")


def test_calibration_at_the_pin_agrees():
    cal = calibrate(shipped_plan(), measure_record(record()))
    assert cal.plan.tokens == 989_727 and cal.ratio == 1.0 and cal.same_pool is True
    text = "\n".join(cal.lines())
    assert "989,727 tokens (the recipe's arithmetic)" in text and "+0.00 %" in text and "note:" not in text
    assert cal.to_json()["measured"]["pool"] == "pin"


def test_calibration_of_a_profiled_boot_says_its_pool_is_not_the_pin():
    cal = calibrate(shipped_plan(), measure_log(LOG_0_10, "head.log"))
    assert cal.ratio == round(481_488 / 989_727, 4) == 0.4865
    assert cal.same_pool is False
    # 4,939,212,390 B / 10,354.06 B per token = 477,031.46
    assert cal.predicted_tokens == 477_031
    assert any(line.startswith("note: the boot's pool is not the plan's pin") for line in cal.lines())


def test_the_entry_and_its_errors():
    entry = kv_boot_entry(measure_log(LOG_0_32, "head.log"), "2026-12-05")
    assert entry == KvBoot(989_727, PIN, "pin", "head.log", "2026-12-05", "0.32.0", None)
    no_bytes = measure_log(LOG_0_13.replace("'kv_cache_memory_bytes': 10247694336, ", ""), "x.log")
    with pytest.raises(SparkstackError, match="never stated its KV pool's bytes") as refused:
        kv_boot_entry(no_bytes, "2026-12-05")
    # what the user can do: pin the pool, or hand over the whole log (a --tail loses the profiling line)
    assert "KV_CACHE_MEMORY=" in str(refused.value) and "not a --tail" in str(refused.value)
    line = calibrate(shipped_plan(), no_bytes).lines()[1]
    assert line.startswith("measured: ") and "never stated" in line and "KV_CACHE_MEMORY=" in line


@pytest.fixture
def recipe_copy(tmp_path) -> Path:
    src = Path(__file__).resolve().parents[2] / "recipes" / RECIPE / "recipe.toml"
    dst = tmp_path / "recipe.toml"
    shutil.copyfile(src, dst)
    return dst


def test_write_a_profiled_boot_keeps_the_cost_and_the_comments(recipe_copy):
    before = recipe_copy.read_text()
    entry = KvBoot(481_488, 4_939_212_390, "profiled", "run abc", "2026-12-05", "0.32.0")
    assert write_kv_boot(load_recipe(str(recipe_copy)), entry, RERUN) is False
    r = load_recipe(str(recipe_copy))
    assert r.kv.boot == entry and (r.kv.measured_bytes, r.kv.measured_tokens) == (PIN, 989_727)
    after = recipe_copy.read_text()
    assert "# KV geometry, measured from this recipe's own boot" in after
    assert "# The tuned deployment (" in after and "image_id" not in after  # unknown: not written
    assert after.startswith(before.split("[kv]")[0])  # everything before [kv] untouched


def test_write_a_pinned_boot_moves_the_calibration_point(recipe_copy):
    entry = KvBoot(1_000_000, 10_000_000_000, "pin", "run abc", "2026-12-05", image_id="sha256:" + "cd" * 32)
    assert write_kv_boot(load_recipe(str(recipe_copy)), entry, RERUN) is True
    r = load_recipe(str(recipe_copy))
    assert r.kv.boot == entry and (r.kv.measured_bytes, r.kv.measured_tokens) == (10_000_000_000, 1_000_000)
    assert plan_kv(r.kv, 10_000_000_000, 524_288, 2304, "fp8_e4m3").tokens == 1_000_000
    again = KvBoot(989_727, PIN, "pin", "run def", "2026-12-06")  # a second write replaces the first
    write_kv_boot(r, again, RERUN)
    assert load_recipe(str(recipe_copy)).kv.boot == again and recipe_copy.read_text().count("[kv.boot]") == 1


def test_write_refuses_the_installed_recipe(recipe_copy, monkeypatch):
    """A copy standing where an installed package keeps its data (never the checkout's own file: in a checkout the
    package data is a symlink to it, a user's file that `fetch --resolve` writes too)."""
    monkeypatch.setattr(shipped, "PACKAGE_DATA", recipe_copy.parent)
    before = recipe_copy.read_bytes()
    with pytest.raises(SparkstackError, match="shipped recipe installed") as exc:
        write_kv_boot(load_recipe(str(recipe_copy)), KvBoot(1, 1, "pin", "x", "2026-12-05"), RERUN)
    assert str(exc.value).endswith("&& sparkstack plan kv --from-boot --write --recipe ./my-recipe.toml")
    assert recipe_copy.read_bytes() == before


def test_write_refuses_a_recipe_changed_since_read(recipe_copy):
    r = load_recipe(str(recipe_copy))
    recipe_copy.write_text(recipe_copy.read_text().replace("measured_tokens = 989727", "measured_tokens = 989728"))
    with pytest.raises(SparkstackError, match="changed since it was read"):
        write_kv_boot(r, KvBoot(1, 1, "pin", "x", "2026-12-05"), RERUN)


@pytest.mark.parametrize("table, error", [
    ('tokens = 1\npool_bytes = 1\npool = "guess"\nsource = "x"\ndate = "2026-12-05"', 'pool must be "pin" or "profiled"'),
    ('tokens = 1\npool_bytes = 1\npool = "pin"\nsource = "x"\ndate = "yesterday"', "is not a date"),
    ('pool_bytes = 1\npool = "pin"\nsource = "x"\ndate = "2026-12-05"', "missing key 'tokens'"),
    ('tokens = 0\npool_bytes = 1\npool = "pin"\nsource = "x"\ndate = "2026-12-05"', "tokens=0 must be"),
    ('tokens = 1\npool_bytes = 1\npool = "pin"\nsource = "x"\ndate = "2026-12-05"\nnote = "hi"', "unknown key 'note'"),
])
def test_the_loader_checks_kv_boot(recipe_copy, table, error):
    recipe_copy.write_text(recipe_copy.read_text() + "\n[kv.boot]\n" + table + "\n")
    with pytest.raises(SparkstackError, match=r"\[kv.boot\]: .*" + error.replace("(", r"\(")):
        load_recipe(str(recipe_copy))


def test_status_shows_plan_against_measured():
    line = kv_status_line(shipped_plan(), record())
    assert line == ("KV: plan 989,727 tokens, measured 989,727 (1.000x the plan), pool 10,247,694,336 B (pin) "
                    "(run 0123456789abcdef)")
    assert kv_status_line(shipped_plan(), record() | {"boot": None}) is None
    lines = status_lines([{"rank": 0}], record(), shipped_plan())
    assert lines[-1] == line
    assert not any(x.startswith("KV: plan") for x in status_lines([{"rank": 0}], record()))


def test_write_into_a_recipe_without_kv(tmp_path):
    """The lab's recipe has no [kv]: the write makes one, and the planner can then turn bytes into tokens."""
    path = tmp_path / "recipe.toml"
    shutil.copyfile(Path(__file__).resolve().parents[2] / "recipes" / "lab-vllm-cpu" / "recipe.toml", path)
    r = load_recipe(str(path))
    assert r.kv.measured_bytes is None and r.kv.boot is None
    entry = KvBoot(2_097_152, GIB, "pin", "boot.log", "2026-12-05", "0.32.0")
    assert write_kv_boot(r, entry, RERUN) is True
    again = load_recipe(str(path))
    assert again.kv.boot == entry and plan_kv(again.kv, 2 * GIB, 2048, 16).tokens == 4_194_304


def test_a_run_record_file_is_read_as_a_record(tmp_path):
    import json

    path = tmp_path / "0123456789abcdef.json"
    path.write_text(json.dumps(record()))
    m = read_boot_file(path)
    assert (m.tokens, m.pool, m.run_id, m.source) == (989_727, POOL_PIN, "0123456789abcdef", str(path))
    with pytest.raises(SparkstackError, match="cannot read"):
        read_boot_file(tmp_path / "missing.log")


def test_status_says_an_unknown_value_as_a_dash_not_python_none():
    (line,) = status_lines([{"rank": 1, "state": "absent", "image": None, "uptime": None}], None)
    assert line == "rank=1 state=absent image=- uptime=-"
