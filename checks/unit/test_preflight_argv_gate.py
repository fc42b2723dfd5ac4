"""Preflight's vLLM argv gate (under --gates): every rank's engine argv goes to the image's python as
`python3 -c ARGV_GATE ARGV...` in a throwaway container, its one line becomes the check. The script itself is judged
against the real vLLM in checks/engine/test_vllm_argv.py, and run through a real dockerd in the lab."""

import subprocess

from sparkstack.launch.plan import plan_launch_from_recipe
from sparkstack.launch.preflight import ARGV_GATE, argv_gate_checks
from sparkstack.recipe import load_recipe


class Docker:
    """Answers `docker run` as the gate would: exit 1 with a refusal for rank 1, a pass for rank 0."""

    label = "head"

    def __init__(self):
        self.calls = []

    def run_docker(self, *args, timeout=120, env=None):
        self.calls.append(list(args))
        if "--headless" in args:
            return subprocess.CompletedProcess(args, 1, "unrecognized arguments: --headless\n", "")
        return subprocess.CompletedProcess(args, 0, "vLLM accepts the argv (40 arguments)\n", "")


def test_each_rank_argv_is_judged_in_the_image(tmp_path):
    plan = plan_launch_from_recipe(load_recipe(None), {"HF_HOME": str(tmp_path)})
    docker = Docker()
    checks = argv_gate_checks(plan, docker)
    assert [c.rank for c in checks] == [0, 1]
    for call, rank in zip(docker.calls, plan.ranks):
        assert call[:7] == ["run", "--rm", "--network", "none", "--entrypoint", "python3", plan.image]
        assert call[7:9] == ["-c", ARGV_GATE] and call[9:] == list(rank.engine_argv)
    assert [(c.status, c.detail) for c in checks] == [("pass", "vLLM accepts the argv (40 arguments)"),
                                                     ("fail", "unrecognized arguments: --headless")]


def test_a_gate_that_could_not_run_says_so():
    class NoDocker(Docker):
        def run_docker(self, *args, timeout=120, env=None):
            return subprocess.CompletedProcess(args, 125, "", "docker: Error response from daemon: no such image\n")

    plan = plan_launch_from_recipe(load_recipe(None), {})
    checks = argv_gate_checks(plan, NoDocker())
    assert all(c.status == "fail" and c.detail.startswith("the argv gate did not run: ") for c in checks)
    assert "no such image" in checks[0].detail


def test_the_gate_script_is_its_own_module_sent_as_written():
    """The script lives in launch/argv_gate.py (importable, lintable) and goes to the container as its file's text."""
    from pathlib import Path

    from sparkstack.launch import argv_gate

    assert ARGV_GATE == Path(argv_gate.__file__).read_text()
    assert callable(argv_gate.judge)
