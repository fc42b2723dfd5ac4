"""A suite started as `nohup bash .ci/run &` starts it (SIGINT, SIGQUIT and SIGHUP ignored, inherited across exec)
gives the same verdict: the tests that stop a child with a signal start it with that signal at its default
(`clirun.start`), whatever the suite was given."""

import signal
import subprocess
import sys
from pathlib import Path

CHECKS = Path(__file__).resolve().parents[1]
CTRL_C_TEST = "checks/unit/test_soak.py::test_ctrl_c_prints_the_summary_so_far_and_keeps_the_log"


def as_a_background_job_of_a_script():
    """What a shell without job control does to `cmd &`, and nohup to its command."""
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


def test_the_condition_is_the_one_nohup_and_a_script_give():
    probe = subprocess.run([sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)"],
                           capture_output=True, text=True, preexec_fn=as_a_background_job_of_a_script, check=True)
    assert probe.stdout.strip() == "True"


def test_a_ctrl_c_test_passes_under_an_inherited_ignored_sigint():
    """Before the tests set the signal themselves this one timed out: the soak never saw its SIGINT."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           f"{CTRL_C_TEST}[ctrl-c]"], cwd=CHECKS.parent, capture_output=True, text=True,
                          preexec_fn=as_a_background_job_of_a_script, stdin=subprocess.DEVNULL, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout
