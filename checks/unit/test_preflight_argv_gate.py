"""Preflight's vLLM argv gate (under --gates): every rank's engine argv goes to the image's python, judged by
ARGV_GATE in a throwaway container, and its one line becomes the check. Every gate of a launch that is not cached
runs in that one container, one python process (`-c ARGV_GATE --sparkstack-gates SPEC`). The script itself is judged
against the real vLLM in checks/engine/test_vllm_argv.py, and run through a real dockerd in the lab."""

import json
import subprocess

from sparkstack.launch.plan import plan_launch_from_recipe
from sparkstack.launch.preflight import ARGV_GATE, argv_gate_checks
from sparkstack.recipe import load_recipe


def batch_spec(call: list[str]) -> dict:
    """What one gates container was asked: {"argvs": [engine argv, ...], "gates": [gate argv, ...]}."""
    return json.loads(call[call.index("--sparkstack-gates") + 1])


class Docker:
    """Answers the gates' container as the batch would: rank 1's argv refused (exit 1), rank 0's passed, every
    runtime gate passed; the image's gates label empty (the default gates)."""

    label = "head"

    def __init__(self):
        self.calls = []

    def run_docker(self, *args, timeout=120, env=None):
        self.calls.append(list(args))
        if args[0] == "image":
            return subprocess.CompletedProcess(args, 0, "\n", "")
        spec = batch_spec(list(args))
        said = {"argvs": [[1, "unrecognized arguments: --headless"] if "--headless" in a
                          else [0, "vLLM accepts the argv (40 arguments)"] for a in spec["argvs"]],
                "gates": [[0, "ok\n", ""] for _ in spec["gates"]]}
        return subprocess.CompletedProcess(args, 0, "a warning vLLM printed\nsparkstack-gates: " + json.dumps(said) + "\n", "")


def test_each_rank_argv_is_judged_in_the_image(tmp_path):
    plan = plan_launch_from_recipe(load_recipe(None), {"HF_HOME": str(tmp_path)})
    docker = Docker()
    checks = argv_gate_checks(plan, docker)
    assert [c.rank for c in checks] == [0, 1]
    (call,) = docker.calls  # one container judges both ranks
    assert call[:7] == ["run", "--rm", "--network", "none", "--entrypoint", "python3", plan.image]
    assert call[7:10] == ["-c", ARGV_GATE, "--sparkstack-gates"] and len(call) == 11
    assert batch_spec(call) == {"argvs": [list(rank.engine_argv) for rank in plan.ranks], "gates": []}
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
    assert [batch_spec(c)["argvs"] for c in again.calls] == [[list(plan.ranks[1].engine_argv)]]
    assert checks[0].status == "pass" and checks[0].detail.startswith("vLLM accepts the argv (40 arguments) (cached: ")
    assert IMAGE_ID[:19] in checks[0].detail and checks[1].status == "fail"

    ran = Docker()  # no gates label: the default runtime gates run, all in one container, and pass
    runtime = gate_checks(plan, ran, IMAGE_ID, cache)
    assert len(runtime) == 3 and {c.status for c in runtime} == {"pass"}
    assert [len(batch_spec(c)["gates"]) for c in ran.calls if c[0] == "run"] == [3]
    rerun = Docker()
    assert [c.status for c in gate_checks(plan, rerun, IMAGE_ID, cache)] == ["pass"] * len(runtime)
    assert [c[0] for c in rerun.calls] == ["image"]  # only the label is read again


def test_another_image_or_argv_runs_the_gate_again(tmp_path):
    from sparkstack.launch.gatecache import GateCache

    cache = GateCache(tmp_path / "gates")
    plan = plan_launch_from_recipe(load_recipe(None), {"HF_HOME": str(tmp_path)})
    argv_gate_checks(plan, Docker(), IMAGE_ID, cache)
    other_image = Docker()
    argv_gate_checks(plan, other_image, "sha256:" + "cd" * 32, cache)
    assert [len(batch_spec(c)["argvs"]) for c in other_image.calls] == [2]
    longer = plan_launch_from_recipe(load_recipe(None), {"HF_HOME": str(tmp_path), "MAX_MODEL_LEN": "131072"})
    other_argv = Docker()
    argv_gate_checks(longer, other_argv, IMAGE_ID, cache)
    assert [len(batch_spec(c)["argvs"]) for c in other_argv.calls] == [2]
    no_id = Docker()  # the image's id unknown: nothing to key a pass by
    argv_gate_checks(plan, no_id, None, cache)
    assert [len(batch_spec(c)["argvs"]) for c in no_id.calls] == [2]


def test_a_mangled_or_unwritable_cache_only_costs_a_rerun(tmp_path):
    from sparkstack.launch.gatecache import GateCache

    plan = plan_launch_from_recipe(load_recipe(None), {"HF_HOME": str(tmp_path)})
    cache = GateCache(tmp_path / "gates")
    argv_gate_checks(plan, Docker(), IMAGE_ID, cache)
    for record in (tmp_path / "gates").iterdir():
        record.write_text("{not json")
    mangled = Docker()
    assert argv_gate_checks(plan, mangled, IMAGE_ID, cache)[0].status == "pass"
    assert [len(batch_spec(c)["argvs"]) for c in mangled.calls] == [2]
    blocked = tmp_path / "file"
    blocked.write_text("")
    unwritable = GateCache(blocked / "gates")  # a file where its dir would go
    assert [c.status for c in argv_gate_checks(plan, Docker(), IMAGE_ID, unwritable)] == ["pass", "fail"]


# ---- the batch: every gate in one python process, each answered as `python3 -c CODE` alone would answer it

GATE_CODES = [
    "print('fine')",
    "import sys; sys.exit(3)",
    "assert 1 == 2, 'one is not two'",
    "import no_such_module_here",
    "raise SystemExit('a message, not a code')",
    "import sys; print('to stderr', file=sys.stderr); sys.exit(0)",
    "import sys; assert sys.argv[1:] == ['a', 'b'], sys.argv",
    "import os; os._exit(5)",
    "import sys; print('gone'); sys.stdout.close()",
    "import os; os.write(1, b'no newline at the fd')",
    "import ctypes; ctypes.string_at(0)",  # a segfault: minus the signal's number, as subprocess says it
    "import pickle\nclass Here: pass\nprint(len(pickle.dumps(Here())) > 0)",
]


def test_each_python_gate_in_the_batch_answers_as_python3_c_alone_does():
    """The real counterpart of a runtime gate is `python3 -c CODE` in its own process: the same exit code, the same
    stdout, and the same last line of stderr (the one a failed check shows)."""
    import sys

    from sparkstack.launch import argv_gate

    for code in GATE_CODES:
        args = ["a", "b"] if "argv" in code else []
        alone = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
        got, out, err = argv_gate.run_gate(["python3", "-c", code, *args])
        assert (got, out) == (alone.returncode, alone.stdout), code
        assert err.strip().splitlines()[-1:] == alone.stderr.strip().splitlines()[-1:], (code, err, alone.stderr)
    assert {argv_gate.run_gate(["python3", "-c", c])[0] for c in GATE_CODES} >= {0, 1, 3, 5, -11}


def test_no_gate_reaches_the_next_and_one_that_hangs_is_ended():
    from sparkstack.launch import argv_gate

    done = argv_gate.batch({"argvs": [], "gates": [
        ["python3", "-c", "import os, sys; os.environ['LEAK'] = '1'; sys.path.insert(0, '/leak'); x = 1"],
        ["python3", "-c", "import os, sys; print(os.environ.get('LEAK'), '/leak' in sys.path, 'x' in globals())"]]})
    assert done["gates"][1] == [0, "None False False\n", ""], done
    code, _, err = argv_gate.run_gate(["python3", "-c", "import time; time.sleep(60)"], timeout=0.5)
    assert code == 124 and "did not end within 0.5 s" in err
    assert argv_gate.run_gate(["sh", "-c", "printf '\\377'"]) == (0, "\ufffd", "")  # bytes that are no UTF-8


def test_an_argv_that_makes_the_parser_exit_is_a_refusal_not_a_crash():
    from sparkstack.launch import argv_gate

    class Exits:
        def parse_args(self, argv):
            raise SystemExit(0)  # what argparse does on --help

    real_parser = argv_gate.parser
    try:
        argv_gate.parser = lambda allow_abbrev=False: Exits()
        code, line = argv_gate.judged(["--help"])
    finally:
        argv_gate.parser = real_parser
    assert code == 1 and "--help" in line and "\n" not in line


def test_a_gate_that_is_no_python_runs_as_a_process_and_a_missing_one_says_so():
    from sparkstack.launch import argv_gate

    assert argv_gate.run_gate(["sh", "-c", "echo out; exit 4"]) == (4, "out\n", "")
    code, _, err = argv_gate.run_gate(["/no/such/tool", "x"])
    assert code == 127 and "/no/such/tool" in err


def test_a_batch_without_vllm_judges_no_argv_and_still_runs_the_gates():
    from sparkstack.launch import argv_gate

    done = argv_gate.batch({"argvs": [["--model", "m"]], "gates": [["python3", "-c", "print(2 + 2)"]]})
    assert done["argvs"][0][0] == 2 and "no vLLM serve argument parser" in done["argvs"][0][1]
    assert done["gates"] == [[0, "4\n", ""]]


def test_a_batch_that_did_not_run_fails_every_gate_it_held_with_the_reason(tmp_path):
    from sparkstack.launch.preflight import all_gate_checks

    class Broken(Docker):
        def __init__(self, code, stdout, stderr):
            super().__init__()
            self.answer = (code, stdout, stderr)

        def run_docker(self, *args, timeout=120, env=None):
            if args[0] == "image":
                return super().run_docker(*args)
            self.calls.append(list(args))
            return subprocess.CompletedProcess(args, *self.answer)

    plan = plan_launch_from_recipe(load_recipe(None), {"HF_HOME": str(tmp_path)})
    forged = 'sparkstack-gates: {"argvs": [[null, "x"], [0, "y"]], "gates": [[0, "", ""], [0, ""], [true, "", ""]]}'
    for answer, said in (((125, "", "docker: Error response from daemon: no such image\n"), "no such image"),
                         ((0, "c0ffee\n", ""), "no result line from the gates' python (it printed: c0ffee)"),
                         ((0, "sparkstack-gates: {\"argvs\": []}\n", ""), "no result line"),
                         ((0, forged + "\n", ""), "no result line")):
        broken = Broken(*answer)
        checks = all_gate_checks(plan, broken, None)
        # the batch, then each of its five gates alone (so that the one that breaks a batch is named)
        assert len([c for c in broken.calls if c[0] == "run"]) == 6
        assert len(checks) == 5 and {c.status for c in checks} == {"fail"}, checks
        assert all(said in c.detail for c in checks), (said, [c.detail for c in checks])
        assert all(c.detail.startswith("the argv gate did not run: ") for c in checks if c.name == "vllm-argv")


def test_one_container_asks_only_what_the_cache_does_not_hold(tmp_path, monkeypatch):
    from sparkstack.launch.preflight import all_gate_checks

    monkeypatch.setenv("SPARKSTACK_STATE_DIR", str(tmp_path / "state"))
    plan = plan_launch_from_recipe(load_recipe(None), {"HF_HOME": str(tmp_path)})
    first = Docker()
    checks = all_gate_checks(plan, first, IMAGE_ID)
    assert [(c.name, c.status) for c in checks] == [("vllm-argv", "pass"), ("vllm-argv", "fail")] + [("gate", "pass")] * 3
    (call,) = [c for c in first.calls if c[0] == "run"]
    assert [len(v) for v in batch_spec(call).values()] == [2, 3]
    again = Docker()
    checks = all_gate_checks(plan, again, IMAGE_ID)
    (call,) = [c for c in again.calls if c[0] == "run"]  # only rank 1's argv, which failed: passes are kept
    assert batch_spec(call) == {"argvs": [list(plan.ranks[1].engine_argv)], "gates": []}
    assert [c.status for c in checks] == ["pass", "fail", "pass", "pass", "pass"]
    assert sum("(cached: " in c.detail for c in checks) == 4


def test_the_gate_that_breaks_a_batch_is_the_one_named(tmp_path):
    """One gate kills its container's python (or prints no answer): the batch gives nothing, so each gate runs
    alone, and only the one that breaks is failed, with its own reason."""
    from sparkstack.launch.preflight import all_gate_checks

    class OneBreaks(Docker):
        def run_docker(self, *args, timeout=120, env=None):
            if args[0] == "run" and any("dflash2.speculator" in g[-1] for g in batch_spec(list(args))["gates"]):
                self.calls.append(list(args))
                return subprocess.CompletedProcess(args, 139, "", "Segmentation fault (core dumped)\n")
            return super().run_docker(*args)

    plan = plan_launch_from_recipe(load_recipe(None), {"HF_HOME": str(tmp_path)})
    docker = OneBreaks()
    checks = all_gate_checks(plan, docker, None)
    assert len([c for c in docker.calls if c[0] == "run"]) == 6
    assert [(c.name, c.status) for c in checks] == [("vllm-argv", "pass"), ("vllm-argv", "fail"), ("gate", "pass"),
                                                   ("gate", "pass"), ("gate", "fail")]
    assert checks[-1].detail.endswith("Segmentation fault (core dumped)") and "speculator" in checks[-1].detail
