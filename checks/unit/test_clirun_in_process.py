"""The in-process runner (clirun.run_in_process) is only worth having if it says what the child says.

Each case runs the real CLI twice, as a child (`python -m sparkstack.cli`) and in-process, and the two must agree
byte for byte (exit code, stdout and stderr), the disk check's free space aside. The cases are the kinds of run the bad-input tiers make in-process: a
usage error, a refusal from a recipe or from the environment, a dry run's plan, --json, help, a non-UTF-8 value.
"""

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from clirun import run_in_process, sparkstack_cmd

ROOT = Path(__file__).parents[2]
TUNED = ROOT / "recipes/glm53-flash-dflash2-nvfp4/recipe.toml"


# The one figure that moves between two runs a moment apart: the disk check's free space (other work writes).
FREE_SPACE = re.compile(rb"[0-9][0-9.,]* [KMGT]iB free")


def steady(out: bytes) -> bytes:
    return FREE_SPACE.sub(b"N GiB free", out)


def child(args, env):
    return subprocess.run(sparkstack_cmd() + [str(a) for a in args], capture_output=True, env=env)


def cases(tmp_path):
    bad_recipe = tmp_path / "bad.toml"
    bad_recipe.write_text(TUNED.read_text().replace("[knobs]", "[knobs]\nMAX_NUM_SEQS = -3\n", 1))
    dry = ["launch", "0", "--dry-run", "--host-root", tmp_path]
    return {
        "no such command, told the one it is near": (["lanch", "0"], {}),
        "a bad option value": (["bench", "--concurrency", "0,x"], {}),
        "a refusal from the environment": (dry, {"API_PORT": "70000"}),
        "a refusal from a recipe": (dry + ["--recipe", bad_recipe], {}),
        "a non-UTF-8 value": (dry, {"SERVED_NAME": "caf\udcff"}),
        "a dry run's plan": (dry, {}),
        "a dry run's plan, --json": (dry + ["--json"], {}),
        "help": (["strip", "--help"], {}),
    }


def test_in_process_says_byte_for_byte_what_the_child_says(tmp_path):
    base = {k: v for k, v in os.environ.items() if k not in ("API_PORT", "SERVED_NAME", "MAX_NUM_SEQS")}
    base["HF_HOME"] = str(tmp_path / "hf")
    for name, (args, extra) in cases(tmp_path).items():
        env = {**base, **extra}
        want = child(args, env)
        got = run_in_process(args, env, replace_env=True, text=False)
        assert (got.returncode, steady(got.stdout), steady(got.stderr)) == \
            (want.returncode, steady(want.stdout), steady(want.stderr)), name


def test_the_cases_are_not_all_alike(tmp_path):
    # Without this, a runner and a child that both printed nothing would agree on every case.
    outcomes = {run_in_process(args, extra).returncode for args, extra in cases(tmp_path).values()}
    assert outcomes == {0, 1, 2}, outcomes  # help; a refusal (and a dry run off a Spark); a usage error


def test_the_environment_and_signal_handlers_are_put_back(tmp_path):
    before_env = dict(os.environ)
    before_handlers = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]
    run_in_process(["launch", "0", "--dry-run", "--host-root", tmp_path], {"API_PORT": "70000", "NEW_ONE": "x"})
    run_in_process(["--help"], {"HOME": "/nonexistent"}, replace_env=True)
    assert dict(os.environ) == before_env
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)] == before_handlers


@pytest.mark.parametrize("env,replace", [({"API_PORT": "70000"}, False), ({"PATH": os.defpath}, True)])
def test_a_value_set_for_one_call_is_seen_by_it_alone(tmp_path, env, replace):
    dry = ["launch", "0", "--dry-run", "--host-root", tmp_path]
    refused = run_in_process(dry, {**env, "API_PORT": "70000"}, replace_env=replace)
    assert refused.returncode == 1 and "API_PORT" in refused.stderr, refused.stderr
    after = run_in_process(dry, {"HF_HOME": str(tmp_path / "hf")})
    assert "API_PORT" not in after.stderr, after.stderr


def test_a_call_that_hangs_fails_the_test_and_the_alarm_is_put_back(tmp_path):
    """`timeout` turns a hang into a test failure: here `image verify` blocks opening a FIFO that no one writes, as a
    hostile layout's would if the reader opened it (the FIFO stands where the index belongs)."""
    layout = tmp_path / "layout"
    layout.mkdir()
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    os.mkfifo(layout / "index.json")
    before = signal.getsignal(signal.SIGALRM)
    try:
        proc = run_in_process(["image", "verify", layout], timeout=2)
    except pytest.fail.Exception as exc:
        assert "hung for 2 s" in str(exc)
    else:  # the reader refused the FIFO without opening it: then it must have said so, in one line
        assert proc.returncode == 1 and "sparkstack: error:" in proc.stderr, proc
    assert signal.getsignal(signal.SIGALRM) == before and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_the_timeout_fires_on_a_blocked_read(monkeypatch):
    """The alarm interrupts a call blocked in the kernel (a pipe no one writes), and the test fails saying so."""
    from sparkstack import cli

    r, w = os.pipe()
    monkeypatch.setattr(cli, "entry", lambda: os.read(r, 1))
    try:
        with pytest.raises(pytest.fail.Exception, match="hung for 0.5 s"):
            run_in_process(["--help"], timeout=0.5)
    finally:
        os.close(r), os.close(w)
