"""CI's verdict must not depend on the draw: .ci/run selects the derandomized hypothesis profile."""

import os
import re
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[2]


def test_ci_selects_the_derandomized_profile():
    script = (ROOT / ".ci/run").read_text()
    assert re.search(r"^export .*\bSPARKSTACK_HYPOTHESIS_PROFILE=ci\b", script, re.M), "CI must select the ci profile"


@pytest.mark.skipif(os.environ.get("SPARKSTACK_HYPOTHESIS_PROFILE") != "ci", reason="only under CI's profile")
def test_the_ci_profile_is_deterministic():
    assert settings.default.derandomize is True
    assert settings.default.database is None


def readme_test_command() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("THE test command"):]
    return re.search(r"```sh\n(python -m pytest checks[^\n]*)\n```", section).group(1)


def test_ci_runs_the_readme_test_command():
    """.ci/run calls THE test command as README writes it, adding only the JUnit report its table reads."""
    lines = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line.startswith("python -m pytest")]
    assert len(lines) == 1, lines
    assert re.sub(r' --junitxml "\$ci_dir/junit.xml"$', "", lines[0]) == readme_test_command()


def test_the_slowest_table_reads_a_junit_report(tmp_path):
    import slowest

    report = tmp_path / "junit.xml"
    report.write_text('<testsuites><testsuite name="pytest">'
                      '<testcase classname="checks.unit.test_a" name="test_fast" time="0.5"/>'
                      '<testcase classname="checks.lab.test_b" name="test_slow" time="12.25"/>'
                      '<testcase classname="checks.unit.test_c" name="test_mid" time="3"/>'
                      '</testsuite></testsuites>')
    assert slowest.slowest(str(report), 2) == [(12.25, "checks.lab.test_b::test_slow"),
                                               (3.0, "checks.unit.test_c::test_mid")]



def test_the_timeline_shows_each_workers_span_and_each_groups():
    import slowest

    lines = ["gw0\t1000.0\t1010.0\tchecks/unit/test_a.py::test_x\n",
             "gw1\t1002.0\t1102.0\tchecks/lab/test_r.py::test_up@realpair\n",
             "gw0\t1010.0\t1013.5\tchecks/unit/test_a.py::test_y\n",
             "gw1\t1102.0\t1150.0\tchecks/lab/test_r.py::test_sweep@realpair\n",
             "gw0\t1013.5\t1014.0\tchecks/unit/test_a.py::test_ssh[bob@host]\n"]
    rows = [line.split() for line in slowest.timeline(lines)]
    # worker, tests, busy seconds, first start and last end (seconds after the first test began)
    assert rows[1:3] == [["gw0", "3", "14", "0", "14"], ["gw1", "2", "148", "2", "150"]]
    assert rows[3] == ["@realpair", "2", "148", "2", "150", "on", "gw1"]  # a parameter's user@host is no group
    assert rows[5:] == [["148", "checks/lab/test_r.py"], ["14", "checks/unit/test_a.py"]]
    assert slowest.timeline([]) == []

def test_the_vllm_tier_waits_for_the_install_ci_runs_beside_it(tmp_path):
    """CI starts pytest before the vLLM venv is installed; a test that needs vLLM waits for the READY file, and a
    failed (or never finished) install fails it in one line instead of a skip or a hang."""
    import threading

    from vllm_venv import wait_for_install

    ready = tmp_path / "ready"
    threading.Timer(0.3, lambda: ready.write_text("ok\n")).start()
    assert wait_for_install(ready, bound_s=30) is None and ready.exists()
    ready.write_text("pip failed: see CI's .venv-vllm log\n")
    assert wait_for_install(ready, bound_s=30) == "the vLLM venv's install failed: pip failed: see CI's .venv-vllm log"
    assert "never finished" in wait_for_install(tmp_path / "absent", bound_s=0.2)


def test_a_group_waiting_for_its_ready_file_is_handed_out_after_the_rest(tmp_path):
    """checks/conftest.py's scheduler: with the vLLM venv's READY file not there yet, the `vllm` group (xdist's
    largest, so by default first) runs after the other tests; the verdict is the same, only the order moves."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("SPARKSTACK_VLLM_PYTHON", "SPARKSTACK_REQUIRE_LAB",
                                                             "SPARKSTACK_TEST_TIMELINE")}  # its tests are not CI's
    env["SPARKSTACK_VLLM_READY"] = str(tmp_path / "not-yet")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                           "-v", "checks/engine/test_engine_verify.py", "checks/unit/test_docs.py",
                           "checks/unit/test_declared_imports.py", "checks/unit/test_structure.py",
                           "checks/unit/test_seed001.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    done = [line.split()[-1] for line in proc.stdout.splitlines() if line.startswith("[gw")]
    grouped = [i for i, name in enumerate(done) if name.endswith("@vllm")]
    others = [i for i, name in enumerate(done) if not name.endswith("@vllm")]
    assert grouped and len(others) >= 10, proc.stdout[-2000:]
    # the group went last, though it is the largest (xdist's own order sends it first): at most the few tests a
    # worker holds pending when the group is handed out finish after it starts
    assert sum(i < min(grouped) for i in others) >= len(others) - 4, done
