"""`plan kv --from-boot [LOG] [--write]` through the real CLI, and `launch status`'s KV line through launch's command
object.

The boot log is written by hand from the boot lines the blog quotes (vLLM 0.13's format); the expected figures are
the blog's: 989,727 tokens at the 10,247,694,336 B pin, 10,354.06 B per token."""

import datetime
import json
import shutil
from pathlib import Path

import pytest

from sparkstack import shipped
from sparkstack.command import View
from sparkstack.launch import apply as launch_apply
from sparkstack.launch import command as launch_cmd
from sparkstack.recipe import KvBoot, load_recipe

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "glm53-flash-dflash2-nvfp4"
PIN = 10_247_694_336

LOG_PINNED = """\
(APIServer pid=1) INFO 09-01 10:00:03 [api_server.py:1772] vLLM API server version 0.13.0
(APIServer pid=1) INFO 09-01 10:00:03 [utils.py:328] non-default args: {'model_tag': 'x', 'max_model_len': 524288, 'kv_cache_memory_bytes': 10247694336}
(EngineCore_DP0 pid=250) INFO 09-01 10:00:10 [core.py:93] Initializing a V1 LLM engine (v0.13.0) with config: model='m'
(EngineCore_DP0 pid=250) INFO 09-01 10:08:51 [kv_cache_utils.py:1087] GPU KV cache size: 989,727 tokens
"""

# Self-profiled at 0.89 (no pin): the blog's 481,488 tokens in about 4.6 GiB.
LOG_PROFILED = """\
2026-03-20T10:00:03.000000000Z INFO 03-20 10:00:03 [api_server.py:1395] vLLM API server version 0.10.0
2026-03-20T10:08:45.000000000Z (VllmWorker rank=0 pid=88) INFO 03-20 10:08:45 [gpu_worker.py:227] Available KV cache memory: 4.60 GiB
2026-03-20T10:08:46.000000000Z INFO 03-20 10:08:46 [kv_cache_utils.py:716] GPU KV cache size: 481,488 tokens
"""


def record(rid="0123456789abcdef", tokens=989_727, pin=True) -> dict:
    argv = ["docker", "run", "-d", "img", "/m", "--max-model-len", "524288"]
    if pin:
        argv += ["--kv-cache-memory", str(PIN)]
    rank = {"phases": {}, "max_concurrency": 1.89, "fatal": None, "warnings": []}
    return {"id": rid, "recipe": RECIPE, "image_id": "sha256:" + "ab" * 32, "started_at": "2026-12-04T10:00:00Z",
            "ranks": [{"rank": 0, "docker_run": argv}],
            "boot": {"port_open_s": 600.0, "health_s": 640.75, "ttft_s": 642.0,
                     "timeline": [rank | {"rank": 0, "kv_available_gib": 9.54, "kv_cache_tokens": tokens}],
                     "kv_pool": None}}


@pytest.fixture
def env(tmp_path):
    return {"SPARKSTACK_STATE_DIR": str(tmp_path / "state"), "HF_HOME": str(tmp_path / "hf"),
            "SPARKSTACK_RECIPES": ""}


@pytest.fixture
def recipe_copy(tmp_path) -> Path:
    dst = tmp_path / "recipe.toml"
    shutil.copyfile(ROOT / "recipes" / RECIPE / "recipe.toml", dst)
    return dst


def write_log(tmp_path, text, name="head.log") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_from_boot_on_a_log_puts_the_measurement_beside_the_plan(run_cli, tmp_path, env):
    log = write_log(tmp_path, LOG_PINNED)
    out = run_cli("plan", "kv", "--from-boot", log, env=env, check=0).stdout
    assert "from the boot:" in out
    assert (f"measured: 989,727 tokens in a pool of 10,247,694,336 B (the argv's pin, exact) = 10,354.06 B per token "
            f"({log}, vLLM 0.13.0)") in out
    assert "measured / planned: 1.0000 (+0.00 %)" in out
    doc = json.loads(run_cli("plan", "kv", "--from-boot", log, "--json", env=env, check=0).stdout)
    assert doc["plan"]["tokens"] == 989_727
    assert doc["calibration"]["measured"]["tokens"] == 989_727
    assert doc["calibration"]["measured"]["pool_bytes"] == PIN and doc["calibration"]["ratio"] == 1.0


def test_from_boot_on_a_profiled_log_says_its_pool_is_not_the_pin(run_cli, tmp_path, env):
    out = run_cli("plan", "kv", "--from-boot", write_log(tmp_path, LOG_PROFILED), env=env, check=0).stdout
    assert "measured: 481,488 tokens" in out
    assert "measured / planned: 0.4865 (-51.35 %)" in out  # 481,488 / 989,727
    assert "note: the boot's pool is not the plan's pin" in out


def test_from_boot_bare_reads_the_latest_run_record(run_cli, tmp_path, env):
    runs = tmp_path / "state" / "runs"
    runs.mkdir(parents=True)
    (runs / "00000000000000aa.json").write_text(json.dumps(record("00000000000000aa", tokens=900_000)))
    (runs / "0123456789abcdef.json").write_text(json.dumps(record()))
    (runs / "latest").write_text("0123456789abcdef")
    out = run_cli("plan", "kv", "--from-boot", env=env, check=0).stdout
    assert "measured: 989,727 tokens" in out and "run 0123456789abcdef" in out and "900,000" not in out
    (runs / "latest").unlink()
    proc = run_cli("plan", "kv", "--from-boot", env=env, check=1)
    assert proc.stderr.strip() == (f"sparkstack: error: no launch run record under {runs}: launch first, or name a "
                                   "boot log: --from-boot LOG")


def test_write_records_kv_boot_in_a_recipe_copy(run_cli, tmp_path, env, recipe_copy):
    log = write_log(tmp_path, LOG_PROFILED)
    before = recipe_copy.read_text()
    proc = run_cli("plan", "kv", "--recipe", recipe_copy, "--from-boot", log, "--write", "--dry-run", env=env,
                   check=0)
    assert f"would write [kv.boot] in {recipe_copy}: tokens = 481488, pool_bytes = 4939212390" in proc.stdout
    assert recipe_copy.read_text() == before  # --dry-run wrote nothing

    proc = run_cli("plan", "kv", "--recipe", recipe_copy, "--from-boot", log, "--write", env=env, check=0)
    assert f"wrote [kv.boot] in {recipe_copy}" in proc.stdout
    today = datetime.date.today().isoformat()
    r = load_recipe(str(recipe_copy))
    # a profiled pool: 4.60 GiB = 4,939,212,390 B, recorded beside the per-token cost, which stays the pin's
    assert r.kv.boot == KvBoot(481_488, 4_939_212_390, "profiled", str(log), today, "0.10.0")
    assert (r.kv.measured_bytes, r.kv.measured_tokens) == (PIN, 989_727)
    after = recipe_copy.read_text()
    assert "# KV geometry, measured from this recipe's own boot" in after  # tomlkit kept the comments
    assert after.startswith(before.split("[kv]")[0])


def test_write_a_pinned_boot_moves_the_per_token_cost(run_cli, tmp_path, env, recipe_copy):
    odd = LOG_PINNED.replace("989,727 tokens", "1,000,000 tokens")
    run_cli("plan", "kv", "--recipe", recipe_copy, "--from-boot", write_log(tmp_path, odd), "--write", env=env,
            check=0)
    r = load_recipe(str(recipe_copy))
    assert (r.kv.measured_bytes, r.kv.measured_tokens) == (PIN, 1_000_000)
    out = run_cli("plan", "kv", "--recipe", recipe_copy, env=env, check=0).stdout
    assert out.startswith("10,247,694,336 B / 10,247.69 B per token = 1,000,000 tokens")


def test_write_without_from_boot_is_a_usage_error(run_cli, env, recipe_copy):
    proc = run_cli("plan", "kv", "--recipe", recipe_copy, "--write", env=env, check=2)
    assert "--write records a boot's measurement: give --from-boot" in proc.stderr


def test_write_refuses_an_installed_recipe(tmp_path, env, recipe_copy, monkeypatch):
    """A recipe standing where an installed package keeps its data: refused with its one line, nothing written,
    --dry-run too (it would not be written)."""
    from click.testing import CliRunner

    from sparkstack import cli

    monkeypatch.setattr(shipped, "PACKAGE_DATA", recipe_copy.parent)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    log = write_log(tmp_path, LOG_PINNED)
    before = recipe_copy.read_bytes()
    for extra in ([], ["--dry-run"]):
        result = CliRunner().invoke(cli.main, ["plan", "kv", "--recipe", str(recipe_copy), "--from-boot", str(log),
                                               "--write", *extra])
        assert result.exit_code == 1, result.output
        # the next step is this very command on a copy, not fetch's pinning
        assert result.output.splitlines() == [
            f"sparkstack: error: {recipe_copy}: is a shipped recipe installed under {recipe_copy.parent}, not writable; "
            f"copy it and run again on the copy: cp {recipe_copy} my-recipe.toml && sparkstack plan kv --from-boot "
            f"{log} --write --recipe ./my-recipe.toml"]
        assert recipe_copy.read_bytes() == before


@pytest.mark.parametrize("recipe, planned", [(RECIPE, "989,727"), ("lab-vllm-cpu", "?")])
def test_launch_status_shows_the_plan_against_the_last_boot(monkeypatch, tmp_path, recipe, planned):
    """The shipped recipe pins the pool: its plan's tokens; the lab's recipe has no [kv]: status still shows."""
    monkeypatch.setenv("SPARKSTACK_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(launch_apply, "status", lambda lp, runners: ([{"rank": 0, "state": "running"}], record()))
    request = launch_cmd.Request(target="status", recipe=recipe)
    p = launch_cmd.COMMAND.plan(request, {"HF_HOME": str(tmp_path / "hf")})
    lines = launch_cmd.COMMAND.result_lines(p, launch_cmd.COMMAND.apply(p, View()))
    assert lines[0] == "rank=0 state=running"
    kv = [line for line in lines if line.startswith("KV: ")]
    ratio = " (1.000x the plan)" if planned != "?" else ""
    assert kv == [f"KV: plan {planned} tokens, measured 989,727{ratio}, pool 10,247,694,336 B (pin) "
                  "(run 0123456789abcdef)"]
