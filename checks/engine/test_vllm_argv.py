"""vLLM judges launch's argv: `sparkstack launch all --dry-run --json`, for every shipped recipe and every knob
scenario, gives each rank's engine argv (what follows the image in docker_run); vLLM 0.32's own `vllm serve` parser,
with abbreviations off, must accept every one. The judge is preflight's ARGV_GATE script itself, run by the real
vLLM's python (SPARKSTACK_VLLM_PYTHON), once for all argvs; and it must refuse, in one line naming the option, an
unknown option, an abbreviation, a value outside an option's choices and a parser name vLLM lacks. The same run
checks the recorded flag set a dry run with no image judges recipe args by (recipe/engine_flags.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from vllm_sources import vllm_python

from sparkstack.launch.preflight import ARGV_GATE

RECIPES = sorted(p.parent.name for p in (Path(__file__).parents[2] / "recipes").glob("*/recipe.toml"))
SCENARIOS = {
    "defaults": {},
    "eager": {"EAGER": "1"},
    "not-eager": {"EAGER": "0"},
    "load-format": {"LOAD_FORMAT": "instanttensor"},
    "load-format-empty": {"LOAD_FORMAT": ""},
    "kv-pin": {"KV_CACHE_MEMORY": "8589934592"},
    "kv-pin-empty": {"KV_CACHE_MEMORY": ""},
    "spec-tokens": {"NUM_SPEC_TOKENS": "7"},
    "moe-backend": {"MOE_BACKEND": "triton"},
    "sizes": {"MAX_MODEL_LEN": "131072", "MAX_NUM_SEQS": "2", "MAX_NUM_BATCHED_TOKENS": "4096", "GPU_MEM_UTIL": "0.8"},
    "ports": {"API_PORT": "9000", "MASTER_PORT": "29600", "MASTER_ADDR": "10.0.0.1", "SERVED_NAME": "glm"},
}
SCENARIOS_KNOBS = {k for knobs in SCENARIOS.values() for k in knobs}  # unset from the caller's environment

# Engine argvs vLLM must refuse, and a word the refusal must name.
BASE = ["/models/snap", "--served-model-name", "m", "--tensor-parallel-size", "2"]
REFUSED = {
    "unknown-option": (BASE + ["--no-such-option", "1"], "--no-such-option"),
    "abbreviation": (BASE + ["--kv-cache-memory", "123"], "--kv-cache-memory"),  # argparse would expand it
    "bad-choice": (BASE + ["--kv-cache-dtype", "fp9"], "--kv-cache-dtype"),
    "bad-moe-backend": (BASE + ["--moe-backend", "no-such-backend"], "--moe-backend"),
    "tool-parser": (BASE + ["--enable-auto-tool-choice", "--tool-call-parser", "glm99"], "--tool-call-parser glm99"),
    "reasoning-parser": (BASE + ["--reasoning-parser", "glm99"], "--reasoning-parser glm99"),
}

# Spellings a recipe's args may hold, each as `vllm serve` itself reads them (abbreviations on, as it builds its
# parser): the recorded flag set (recipe/engine_flags.py) must take exactly the ones vLLM takes.
SPELLINGS = [
    ["--max-num-seqs", "6"], ["--max_num_seqs", "6"], ["--max-num_seqs", "6"], ["--max-num-seqs=6"],
    ["--max_num-seqs=6"], ["--kv-cache-memory", "1"], ["--kv_cache-memory-bytes", "1"], ["--enable-auto-tool-choice"],
    ["--no-enable-prefix-caching"], ["--compilation-config.mode", "3"], ["--speculative-config.method", "dflash"],
    ["--max-num-seqz", "6"], ["--max-num", "6"], ["--spec"], ["--enable-auto-tool-choise"], ["--kv-cache-memory-byte", "1"],
    ["--max-num-seqs-x", "6"], ["--no-such-flag"], ["--reasoning-parser", "glm45"], ["--reasoning_parser=glm45"],
    ["-tp", "2"], ["-tp=2"], ["-tp2"], ["-t", "2"], ["-d", "1"], ["-dp", "1"], ["-qfp8"], ["-n2"], ["-O3"], ["-x"],
    ["-cc.mode=3"], ["-sc.method", "dflash"], ["-X"],
]

# One vLLM import for all: the gate's judge() on every argv, the gate's option_kinds() (what the flags file
# records), vLLM's version, and whether `vllm serve`'s own parser takes each spelling.
JUDGE_ALL = """
import json, sys
gate = {"__name__": "argv_gate"}
exec(compile(sys.argv[1], "ARGV_GATE", "exec"), gate)
asked = json.load(sys.stdin)
import vllm
serve = gate["parser"](allow_abbrev=True)
def takes(tail):
    try:
        serve.parse_args(["/models/snap"] + tail)
        return True
    except gate["Refused"]:
        return False
print(json.dumps({"verdicts": {k: gate["judge"](v) for k, v in asked["argvs"].items()},
                  "flags": gate["option_kinds"](), "short": gate["short_options"](), "vllm": vllm.__version__,
                  "spellings": [takes(tail) for tail in asked["spellings"]]}))
"""

@pytest.fixture(scope="session")
def hf_home(tmp_path_factory):
    """A hub whose refs/main names a snapshot for every cache entry the recipes serve."""
    home = tmp_path_factory.mktemp("argv-hf")
    for name in ("models--LibertAIDAI--GLM-5.3-Flash-NVFP4-no-MTP", "models--incoai--GLM-5.3-Flash-DFlash2",
                 "models--local-inference-lab--GLM-5.3-Flash-NVFP4"):
        (home / "hub" / name / "refs").mkdir(parents=True)
        (home / "hub" / name / "refs" / "main").write_text("c" * 40)
        (home / "hub" / name / "snapshots" / ("c" * 40)).mkdir(parents=True)
    return home


@pytest.fixture(scope="session")
def planned(hf_home) -> dict[str, list[str]]:
    """Every rank's engine argv, for every recipe and scenario, from the CLI's JSON as a user gets it."""
    from clirun import assert_planned, sparkstack_cmd

    out = {}
    for recipe in RECIPES:
        for name, knobs in SCENARIOS.items():
            env = {k: v for k, v in os.environ.items() if k not in SCENARIOS_KNOBS}
            env.update(HF_HOME=str(hf_home), **knobs)
            proc = subprocess.run(sparkstack_cmd() + ["launch", "all", "--recipe", recipe, "--dry-run", "--json"],
                                  capture_output=True, text=True, env=env, timeout=300)
            assert_planned(proc)  # off a Spark its preflight fails (exit 1): the plan is what vLLM judges here
            doc = json.loads(proc.stdout)
            for rank in doc["ranks"]:
                run, engine = rank["docker_run"], rank["engine_argv"]
                image_at = len(run) - len(engine) - 1
                assert run[image_at] == doc["image"] and run[image_at + 1:] == engine  # the tail after the image
                out[f"{recipe}/{name}/rank{rank['rank']}"] = engine
    return out


@pytest.fixture(scope="session")
def judged(planned) -> dict:
    """ARGV_GATE's judge() in the real vLLM, once for every argv (vLLM's import costs tens of seconds here)."""
    argvs = {**planned, **{f"refused/{k}": v for k, (v, _) in REFUSED.items()}}
    asked = json.dumps({"argvs": argvs, "spellings": SPELLINGS})
    proc = subprocess.run([vllm_python(), "-c", JUDGE_ALL, ARGV_GATE], input=asked, capture_output=True,
                          text=True, timeout=900, env={"VLLM_TARGET_DEVICE": "cpu", "PATH": "/usr/bin:/bin",
                                                        "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def verdicts(judged) -> dict[str, list]:
    return judged["verdicts"]


def test_every_recipe_and_scenario_was_planned(planned):
    assert len(RECIPES) >= 2
    assert len(planned) == len(RECIPES) * len(SCENARIOS) * 2  # two ranks each


def test_vllm_accepts_every_planned_argv(planned, verdicts):
    refused = {k: verdicts[k] for k in planned if verdicts[k][0] != 0}
    assert not refused, refused


def test_launch_writes_every_option_in_full(planned):
    """The abbreviation test below shows the judge refuses prefixes; this names the one the seed used."""
    for key, argv in planned.items():
        assert "--kv-cache-memory" not in argv, key
    kv = planned[f"{RECIPES[-1]}/kv-pin/rank0"]
    assert kv[kv.index("--kv-cache-memory-bytes") + 1] == "8589934592"


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_vllm_refuses_in_one_line_naming_the_option(verdicts, case):
    code, line = verdicts[f"refused/{case}"]
    assert code == 1 and "\n" not in line and REFUSED[case][1] in line, (code, line)


class VllmAsImage:
    """A runner whose `docker run ... --entrypoint python3 IMAGE ARGS...` is the real vLLM's python with ARGS: the
    gates' container, minus the container."""

    label = "the real vLLM's python"

    def __init__(self):
        self.calls = []

    def run_docker(self, *args, timeout=120, env=None):
        self.calls.append(args)
        assert args[:6] == ("run", "--rm", "--network", "none", "--entrypoint", "python3"), args
        return subprocess.run([vllm_python(), *args[7:]], capture_output=True, text=True, timeout=900,
                              env={"VLLM_TARGET_DEVICE": "cpu", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})


def test_the_gates_batch_as_preflight_runs_it():
    """preflight.run_gates as launch runs it (`python3 -c ARGV_GATE --sparkstack-gates SPEC`, one vLLM import):
    each argv judged, each runtime gate answered, in one process of the real vLLM."""
    from sparkstack.launch.preflight import argv_gate_argv, run_gates

    class Rank:
        def __init__(self, argv):
            self.engine_argv = tuple(argv)

    good, bad = argv_gate_argv(Rank(BASE)), argv_gate_argv(Rank(REFUSED["abbreviation"][0]))
    gates = [("python3", "-c", "import vllm; print(vllm.__version__)"),
             ("python3", "-c", "from vllm.model_executor.models.registry import ModelRegistry; "
                               "assert 'NoSuchArch' in ModelRegistry.get_supported_archs(), 'no NoSuchArch'"),
             ("sh", "-c", "exit 4")]
    runner = VllmAsImage()
    ran = run_gates(runner, "image", [good, bad, *gates], None, None)
    assert len(runner.calls) == 1
    assert ran[good][0] == 0 and ran[good][1].startswith("vLLM accepts the argv"), ran[good]
    assert ran[bad][0] == 1 and REFUSED["abbreviation"][1] in ran[bad][1] and ran[bad][1].count("\n") == 1
    assert ran[gates[0]] == (0, "0.32.0\n", ""), ran[gates[0]]
    assert ran[gates[1]][0] == 1 and ran[gates[1]][2].strip().endswith("AssertionError: no NoSuchArch")
    assert ran[gates[2]][0] == 4


def test_the_recorded_flags_are_the_pinned_vllms_own(judged):
    """The drift test: vllm_serve_flags.json is what this vLLM's parser has (checks/tools/record_vllm_flags.py
    rewrites it), and the version it names is this vLLM's."""
    recorded = json.loads((Path(__file__).parents[2] / "python/sparkstack/recipe/vllm_serve_flags.json").read_text())
    assert recorded["vllm"] == judged["vllm"].split("+")[0]
    only_recorded, only_vllm = set(recorded["flags"]) - set(judged["flags"]), set(judged["flags"]) - set(recorded["flags"])
    assert not only_recorded and not only_vllm, (sorted(only_recorded), sorted(only_vllm))
    assert recorded["flags"] == judged["flags"]
    assert recorded["short"] == judged["short"] and "-tp" in recorded["short"]


def test_the_recorded_flags_read_each_spelling_as_vllm_serve_does(judged):
    """A recipe's arg is refused at plan exactly when `vllm serve` would refuse it 15 minutes into a boot."""
    from sparkstack.recipe.engine_flags import serve_flags

    flags = serve_flags()
    ours = [flags.problem(tail[0]) is None for tail in SPELLINGS]
    assert ours == judged["spellings"], [(t, o, v) for t, o, v in zip(SPELLINGS, ours, judged["spellings"]) if o != v]
    assert True in ours and False in ours  # the list holds both kinds
