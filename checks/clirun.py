"""How tests start the real CLI, and find the real tools it drives."""

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest


def sparkstack_cmd() -> list[str]:
    """The interpreter running the tests, `-m sparkstack.cli`: no installed script needed."""
    return [sys.executable, "-m", "sparkstack.cli"]


# The signals a test sends to stop a child. A shell that starts a job with `&` and no job control (a script, cron,
# `nohup ... &`) leaves SIGINT ignored, nohup leaves SIGHUP ignored, and an ignored signal stays ignored across
# exec: a child started under such a suite would never see the test's signal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT)


def default_stop_signals() -> None:
    """preexec_fn: the stop signals at their defaults and unblocked in the child, whatever the suite inherited."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def start(argv: list[str], **popen_kwargs) -> subprocess.Popen:
    """Start a child the test will stop with a signal (sparkstack, or a pytest that does so in turn)."""
    return subprocess.Popen(argv, preexec_fn=default_stop_signals, **popen_kwargs)


def gone(pid: int | str) -> bool:
    """Whether process `pid` has ended: no such process, or a zombie its new parent has not reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def need(tool: str) -> str:
    """The path of a tool the test drives; a missing one skips, or fails where SPARKSTACK_REQUIRE_TOOLS is set (CI)."""
    path = shutil.which(tool)
    if path is None:
        if os.environ.get("SPARKSTACK_REQUIRE_TOOLS"):
            pytest.fail(f"{tool} is required here (SPARKSTACK_REQUIRE_TOOLS is set) but not installed")
        pytest.skip(f"{tool} not installed")
    return path


# `check=PLANNED`: a dry run of launch, up or sweep that planned and gave its verdict. Off a Spark some preflight
# checks fail (no CX-7 NIC, no GB10), so the verdict may be "would not start" and the exit 1 (nginx -t's code);
# what it must not be is an error, or a verdict that disagrees with the exit code.
PLANNED = "planned"


def assert_planned(proc) -> None:
    """The dry run ran to its verdict line, and its exit code is the verdict's: 0 would start, 1 would not."""
    stdout, stderr = (s.decode("utf-8", "replace") if isinstance(s, bytes) else s for s in (proc.stdout, proc.stderr))
    out = f"stdout:\n{stdout}\nstderr:\n{stderr}"
    assert "sparkstack: error:" not in stderr and "Traceback" not in stderr, out
    assert proc.returncode in (0, 1), f"exit {proc.returncode}\n{out}"
    lines = [line for line in (stdout + stderr).splitlines() if line.startswith("preflight:")]
    assert lines, f"no verdict line\n{out}"
    assert lines[-1].endswith("would start") == (proc.returncode == 0), f"exit {proc.returncode} vs {lines[-1]!r}"



def one_error_line(proc, code: int | None = 1, notes_before: bool = False) -> str:
    """A refusal as every command must give it: exit `code` (None: any non-zero), no traceback, and one line on
    stderr, `sparkstack: error: ...`, the only error line. With `notes_before`, the warnings and notes a run
    printed before it may precede it (bench's rerun warning); the error line is then the last. Returns it."""
    out = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert (proc.returncode != 0) if code is None else (proc.returncode == code), out
    assert "Traceback" not in proc.stderr, out
    lines = proc.stderr.splitlines()
    assert lines and proc.stderr.endswith("\n") and (notes_before or len(lines) == 1), out
    assert lines[-1].startswith("sparkstack: error: "), out
    assert not any(line.startswith("sparkstack: error: ") for line in lines[:-1]), out
    return lines[-1]


class Hung(BaseException):
    """run_in_process's `timeout` ran out. A BaseException, so no `except Exception` in the CLI can turn it into an
    ordinary error line that a test might take for the refusal it expects."""


def _hung(signum, frame):
    raise Hung()


def run_in_process(args, env: dict | None = None, *, replace_env: bool = False, text: bool = True,
                   input: str | bytes | None = None, timeout: float | None = None) -> subprocess.CompletedProcess:
    """The real entry point (`sparkstack.cli.entry`, as `python -m sparkstack.cli` runs it), called in this
    process: its exit code, stdout and stderr as a child would give them, at a fraction of an interpreter's start.

    For the refusals a test checks by the hundred, where a child proves nothing more. `env` is laid over this
    process's environment, or with `replace_env` is the whole of it, for the call only (click's own test
    isolation, which also swaps stdin, stdout and stderr). The signal handlers `entry` installs are put back after.
    Not for what a child alone shows: a signal, a closed stdout, a hang, or a library that reads its environment
    once at import (huggingface_hub's HF_* constants): those tests start the CLI as a child (`sparkstack_cmd`).
    With `timeout`, a call still running after that many seconds fails the test (SIGALRM interrupts even a blocked
    open or read, as a child's kill would), so a hang is a failure, not a stuck suite: main thread only."""
    from click.testing import CliRunner

    from sparkstack import cli

    wanted = dict(env or {}) if replace_env else dict(os.environ, **(env or {}))
    overlay = {k: v for k, v in wanted.items() if os.environ.get(k) != v}
    overlay.update({k: None for k in os.environ if k not in wanted})  # None: unset for the call
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM)}
    argv = [str(a) for a in args]
    old_argv = sys.argv
    code = 0
    with CliRunner().isolation(input=input, env=overlay) as streams:
        sys.argv = ["sparkstack", *argv]
        try:
            if timeout is not None:
                signal.signal(signal.SIGALRM, _hung)
                signal.setitimer(signal.ITIMER_REAL, timeout)
            cli.entry()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except Hung:
            pytest.fail(f"sparkstack {' '.join(argv[:2])} hung for {timeout} s (in process)")
        finally:
            if timeout is not None:
                signal.setitimer(signal.ITIMER_REAL, 0)
            sys.argv = old_argv
            for sig, handler in saved.items():
                signal.signal(sig, handler)
        out, err = streams[0].getvalue(), streams[1].getvalue()
    if text:
        out, err = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    return subprocess.CompletedProcess(sparkstack_cmd() + argv, code, out, err)
