"""CLI options: a bad command line gets one line and exit 2; a closed stdout pipe ends quietly."""

import os
import subprocess

import pytest

from clirun import sparkstack_cmd

USAGE_ERRORS = [
    (["launch", "9", "--dry-run"], {}),
    (["launch", "-1", "--dry-run"], {}),
    (["launch", "٣", "--dry-run"], {}),  # a digit to str.isdigit(), not a rank
    (["launch", "01", "--dry-run"], {}),  # not how rank 1 is written
    (["launch", "0", "--dry-run", "--health-attempts", "0"], {}),
    (["launch", "0", "--dry-run", "--health-interval", "-1"], {}),
    (["launch", "0", "--dry-run"], {"HEALTH_ATTEMPTS": "lots"}),
    (["launch", "0", "--dry-run"], {"WORKER_DELAY": "nan"}),
    (["launch", "all", "--dry-run", "--memory-guard=-5"], {}),
    (["launch", "all", "--dry-run", "--memory-guard=nan"], {}),
    (["tune", "2", "--dry-run"], {}),
    (["tune", "01", "--dry-run"], {}),
    (["launch", "0", "--dry-run", "--profile", "yolo"], {}),
    (["plan", "kv", "--kv-bytes", "-1"], {}),
    (["plan", "kv", "--kv-bytes", "1e9"], {}),
    (["plan", "kv", "--kv-bytes", "9" * 5000], {}),
    (["image", "build", "--dry-run"], {}),
    (["strip"], {}),
    (["strip", "x", "--bogus"], {}),
    (["no-such-command"], {}),
    (["pin", "overlay"], {"SPARKSTACK_OVERLAY_SRC": ""}),
]


@pytest.mark.parametrize("typo,meant", [(["lanch", "0"], "launch"), (["fetc"], "fetch"), (["stirp"], "strip"),
                                        (["image", "buidl"], "build"), (["plan", "kvv"], "kv")])
def test_a_mistyped_command_is_told_the_command_it_is_near(typo, meant):
    # In a fresh process, as a user types it: no command is loaded yet, and click alone would suggest only
    # from the loaded ones (the lazy table's commands were never named).
    proc = subprocess.run(sparkstack_cmd() + typo, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"'{meant}'" in proc.stderr.split("No such command", 1)[1], proc.stderr


@pytest.mark.parametrize("args,env", USAGE_ERRORS, ids=[" ".join(a)[:40] for a, _ in USAGE_ERRORS])
def test_usage_errors_are_one_line_and_exit_2(run_inproc, args, env):
    proc = run_inproc(*args, env=env)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sparkstack: error: "), proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("args,env,line", [
    (["launch", "all", "--dry-run"], {"HEALTH_INTERVAL": "abc"},
     "HEALTH_INTERVAL='abc' (for --health-interval): 'abc' is not a number"),
    (["launch", "0", "--dry-run"], {"HEALTH_ATTEMPTS": "lots"}, "HEALTH_ATTEMPTS='lots' (for --health-attempts): "),
    (["sweep", "--vary", "EAGER=0,1", "--dry-run"], {"WORKER_DELAY": "nan"},
     "WORKER_DELAY='nan' (for --worker-delay): 'nan' is not a finite number"),
])
def test_a_bad_value_from_the_environment_names_its_variable(run_inproc, tmp_path, args, env, line):
    """The user may not know the variable is set: the line names it, its value and the option it feeds."""
    proc = run_inproc(*args, env={**env, "SPARKSTACK_STATE_DIR": str(tmp_path / "state"), "HF_HOME": str(tmp_path / "hf")})
    assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, proc.stderr)
    (only,) = proc.stderr.splitlines()
    assert only.startswith(f"sparkstack: error: {line}"), only


def test_a_bad_value_on_the_command_line_is_named_by_its_option(run_inproc, tmp_path):
    """The variable is set but the command line wins: the line names the option the bad value was given to."""
    proc = run_inproc("launch", "all", "--dry-run", "--health-interval", "abc",
                   env={"HEALTH_INTERVAL": "5", "SPARKSTACK_STATE_DIR": str(tmp_path / "state")})
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == ["sparkstack: error: Invalid value for '--health-interval': 'abc' is not a number "
                                        "(see `sparkstack launch --help`)"]


@pytest.mark.parametrize("value", ["-1", "-0.5", "-inf"])
def test_a_negative_memory_guard_is_out_of_range_not_an_unknown_option(run_inproc, value):
    proc = run_inproc("launch", "all", "--dry-run", f"--memory-guard={value}")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"'{value}' is not a finite number in [0, " in proc.stderr and "No such option" not in proc.stderr


@pytest.mark.parametrize("args", [["launch", "all", "--dry-run", "--json"], ["launch", "0", "--dry-run"],
                                  ["plan", "kv", "--json"], ["launch", "stop", "--dry-run"], ["--help"]])
def test_closed_stdout_ends_quietly(args):
    """`sparkstack ... | head` when head has already gone: no error line, no traceback, SIGPIPE's exit status."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(sparkstack_cmd() + args, stdout=write_end, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, HF_HOME="/nonexistent"))
    finally:
        os.close(write_end)
    assert proc.stderr == ""
    assert proc.returncode == 141


@pytest.mark.parametrize("epoch", ["99999999999999999999", "٣", "-1", "1e9", " 5", "253402300800"])
def test_a_bad_source_date_epoch_is_one_line(run_inproc, tmp_path, epoch):
    import imagefix as fx

    base, src = tmp_path / "base", fx.write_overlay_source(tmp_path / "src")
    fx.write_base(base)
    overlay = fx.write_overlay(tmp_path / "overlay", pinned_from=src / "overlay-dflash2")
    proc = run_inproc("image", "build", "--base", base, "--overlay", overlay, "--overlay-src", src, "--out",
                   tmp_path / "out", env={"SOURCE_DATE_EPOCH": epoch, "SPARKSTACK_CACHE_DIR": str(tmp_path / "c")})
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1 and "SOURCE_DATE_EPOCH" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args", [
    ["image", "load", "{img}", "--host", "-oProxyCommand=touch /tmp/pwn", "--dry-run"],
    ["image", "load", "{img}", "--host", "worker\n", "--dry-run"],
    ["image", "load", "{img}", "--docker-host", "-H=tcp://evil", "--dry-run"],
])
def test_option_lookalikes_never_reach_ssh_or_docker(run_cli, tmp_path, args):
    # A child: the stand-ins must be what a regression would reach, found on the PATH a real run has.
    import imagefix as fx
    import standins

    fx.write_base(tmp_path / "img")
    standins.install(tmp_path / "bin")
    log = tmp_path / "calls.jsonl"
    proc = run_cli(*[str(tmp_path / "img") if a == "{img}" else a for a in args],
                   env={"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "RECORD_LOG": str(log)})
    assert proc.returncode in (1, 2) and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert standins.recorded(log) == []  # refused before any program ran


def test_a_mirror_url_with_credentials_never_reaches_the_error_line(run_inproc):
    proc = run_inproc("pin", "base", "ghcr.io/a/b:t", "--dry-run",
                   env={"SPARKSTACK_REGISTRY_MIRROR": "http://alice:s3cret@127.0.0.1:9", "SPARKSTACK_REGISTRY_TIMEOUT": "2"})
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1
    assert "s3cret" not in proc.stderr and "alice" not in proc.stderr


def test_a_reference_with_a_trailing_newline_is_one_line(run_inproc):
    proc = run_inproc("pin", "base", "ghcr.io/a/b:t\n", "--dry-run", env={"SPARKSTACK_REGISTRY_MIRROR": "http://127.0.0.1:9"})
    assert proc.returncode in (1, 2) and len(proc.stderr.splitlines()) == 1, proc.stderr


def test_launch_stop_with_the_rank_after_it_says_the_order_that_works(run_inproc):
    proc = run_inproc("launch", "stop", "1")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "did you mean `sparkstack launch 1 stop`?" in proc.stderr
    assert "did you mean" not in run_inproc("launch", "0", "start").stderr  # no guess where none fits


@pytest.mark.parametrize("argv, flag", [
    (["launch", "all", "--dry-run", "--ssh-config", "/no/such/ssh_config"], "--ssh-config"),
    (["launch", "all", "--dry-run", "--host-root", "/no/such/root"], "--host-root"),
    (["up", "--dry-run", "--ssh-config", "/no/such/ssh_config"], "--ssh-config"),
    (["ship", "w", "--dry-run", "--ssh-config", "/no/such/ssh_config"], "--ssh-config"),
])
def test_a_path_that_must_exist_is_refused_before_anything_runs(run_inproc, argv, flag):
    """Not after preflight has read an empty tree, or ssh has failed for another reason."""
    proc = run_inproc(*argv)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"Invalid value for '{flag}'" in proc.stderr and "does not exist" in proc.stderr
