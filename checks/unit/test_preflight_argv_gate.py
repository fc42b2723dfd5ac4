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


# ---- the gate cache: a pass is remembered for (image config digest, argv); anything else runs again

IMAGE_ID = "sha256:" + "ab" * 32


def test_an_unchanged_relaunch_skips_the_gates_that_passed_and_says_so(tmp_path):
    from sparkstack.launch.gatecache import GateCache
    from sparkstack.launch.preflight import gate_checks

    plan = plan_launch_from_recipe(load_recipe(None), {"HF_HOME": str(tmp_path)})
    cache = GateCache(tmp_path / "gates")
    first, again = Docker(), Docker()
    assert [c.status for c in argv_gate_checks(plan, first, IMAGE_ID, cache)] == ["pass", "fail"]
    checks = argv_gate_checks(plan, again, IMAGE_ID, cache)
    # rank 0 passed: not asked again; rank 1 failed: asked again, and fails again
    assert [c[9:] for c in again.calls] == [list(plan.ranks[1].engine_argv)]
    assert checks[0].status == "pass" and checks[0].detail.startswith("vLLM accepts the argv (40 arguments) (cached: ")
    assert IMAGE_ID[:19] in checks[0].detail and checks[1].status == "fail"

    class Unlabelled(Docker):  # no gates label: the default runtime gates run, and pass
        def run_docker(self, *args, timeout=120, env=None):
            self.calls.append(list(args))
            return subprocess.CompletedProcess(args, 0, "\n" if args[0] == "image" else "ok\n", "")

    ran = Unlabelled()
    runtime = gate_checks(plan, ran, IMAGE_ID, cache)
    assert runtime and {c.status for c in runtime} == {"pass"} and sum(c[0] == "run" for c in ran.calls) == len(runtime)
    rerun = Unlabelled()
    assert [c.status for c in gate_checks(plan, rerun, IMAGE_ID, cache)] == ["pass"] * len(runtime)
    assert [c[0] for c in rerun.calls] == ["image"]  # only the label is read again


def test_another_image_or_argv_runs_the_gate_again(tmp_path):
    from sparkstack.launch.gatecache import GateCache

    cache = GateCache(tmp_path / "gates")
    plan = plan_launch_from_recipe(load_recipe(None), {"HF_HOME": str(tmp_path)})
    argv_gate_checks(plan, Docker(), IMAGE_ID, cache)
    other_image = Docker()
    argv_gate_checks(plan, other_image, "sha256:" + "cd" * 32, cache)
    assert len(other_image.calls) == 2
    longer = plan_launch_from_recipe(load_recipe(None), {"HF_HOME": str(tmp_path), "MAX_MODEL_LEN": "131072"})
    other_argv = Docker()
    argv_gate_checks(longer, other_argv, IMAGE_ID, cache)
    assert len(other_argv.calls) == 2
    no_id = Docker()  # the image's id unknown: nothing to key a pass by
    argv_gate_checks(plan, no_id, None, cache)
    assert len(no_id.calls) == 2


def test_a_mangled_or_unwritable_cache_only_costs_a_rerun(tmp_path):
    from sparkstack.launch.gatecache import GateCache

    plan = plan_launch_from_recipe(load_recipe(None), {"HF_HOME": str(tmp_path)})
    cache = GateCache(tmp_path / "gates")
    argv_gate_checks(plan, Docker(), IMAGE_ID, cache)
    for record in (tmp_path / "gates").iterdir():
        record.write_text("{not json")
    mangled = Docker()
    assert argv_gate_checks(plan, mangled, IMAGE_ID, cache)[0].status == "pass" and len(mangled.calls) == 2
    blocked = tmp_path / "file"
    blocked.write_text("")
    unwritable = GateCache(blocked / "gates")  # a file where its dir would go
    assert [c.status for c in argv_gate_checks(plan, Docker(), IMAGE_ID, unwritable)] == ["pass", "fail"]
