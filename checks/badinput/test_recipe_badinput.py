"""The bad-recipe corpus: one clear line naming the problem, exit 1, no container started."""

import json
from pathlib import Path

import pytest
from clirun import PLANNED

BASE = Path(__file__).parents[2] / "recipes/glm53-flash-dflash2-nvfp4/recipe.toml"

CASES = {
    "unknown key": (lambda t: t.replace('engine = "vllm"', 'engine = "vllm"\ncolour = "blue"'), "unknown key 'colour'"),
    "unknown node key": (lambda t: t.replace('host = "spark-head"', 'host = "spark-head"\nport = 22'), "unknown key 'port'"),
    "wrong type": (lambda t: t.replace("required_nodes = 2", 'required_nodes = "two"'), "required_nodes must be an integer"),
    "bool is not an int": (lambda t: t.replace("tensor_parallel_size = 2", "tensor_parallel_size = true"), "must be an integer"),
    "args not strings": (lambda t: t.replace('"--max-num-seqs", "6"', '"--max-num-seqs", 6'), "args must be strings"),
    "missing node": (lambda t: t.replace("required_nodes = 2", "required_nodes = 3"), "3 but 2 [[nodes]]"),
    "quoted arg holding several words": (
        lambda t: t.replace('"--reasoning-parser", "glm45"', '"--reasoning-parser", "\'glm45\' \'--evil\'"'), "several shell words"),
    "unknown knob": (lambda t: t.replace('[knobs]', '[knobs]\nGPU_COUNT = "2"'), "unknown knob 'GPU_COUNT'"),
    "blocked without reason": (lambda t: t.replace('status = "ok"', 'status = "blocked"'), "needs blocked_reason"),
    "bad status": (lambda t: t.replace('status = "ok"', 'status = "maybe"'), "status must be"),
    "not toml": (lambda t: t + "\n[[[", "not valid TOML"),
    "clock cap reversed": (lambda t: t.replace('clock_cap = "0,2000"', 'clock_cap = "2000,0"'), "clock_cap='2000,0' is not MIN,MAX"),
    "clock cap of one number": (lambda t: t.replace('clock_cap = "0,2000"', 'clock_cap = "2000"'), "clock_cap='2000' is not MIN,MAX"),
    "clock cap as an option": (lambda t: t.replace('clock_cap = "0,2000"', 'clock_cap = "-r,2000"'), "is not MIN,MAX"),
    "clock cap past any GPU": (lambda t: t.replace('clock_cap = "0,2000"', 'clock_cap = "00000,99999"'),
                               "is not MIN,MAX in MHz with MIN <= MAX <= 5000"),
    "clock cap of zero": (lambda t: t.replace('clock_cap = "0,2000"', 'clock_cap = "0,0"'), "is not MIN,MAX"),
    "gpu memory not a number": (lambda t: t.replace("gpu_memory_gib = 121.69", 'gpu_memory_gib = "121"'), "gpu_memory_gib must be a number"),
    "gpu memory nan": (lambda t: t.replace("gpu_memory_gib = 121.69", "gpu_memory_gib = nan"), "gpu_memory_gib=nan is not"),
    "gpu memory zero": (lambda t: t.replace("gpu_memory_gib = 121.69", "gpu_memory_gib = 0"), "gpu_memory_gib=0 is not"),
    "bad speculative config": (lambda t: t.replace('{"method":"dflash","num_speculative_tokens":4}', '{method: dflash}'), "not JSON"),
    "a branch for a revision": (lambda t: t.replace('model_revision = "unpinned"', 'model_revision = "main"'),
                                "model_revision='main' is neither \"unpinned\" nor a commit hash"),
    "an abbreviated revision": (lambda t: t.replace('model_revision = "unpinned"', 'model_revision = "0123456789ab"'),
                                "model_revision='0123456789ab' is neither"),
    "a revision longer than a commit": (
        lambda t: t.replace('model_revision = "unpinned"', f'model_revision = "{"0123456789" * 4}ab"'),
        f"model_revision='{'0123456789' * 4}ab' is neither"),
    "a commit with a newline after it": (
        lambda t: t.replace('model_revision = "unpinned"', f'model_revision = "{"0123456789" * 4}\\n"'),
        "model_revision='0123456789012345678901234567890123456789\\n' is neither"),
    "an uppercase revision": (lambda t: t.replace('revision = "unpinned"  #', f'revision = "{"AB" * 20}"  #'),
                              "[drafter]: revision='ABABAB"),
    "a revision with no repo": (lambda t: t.replace('repo = "incoai/GLM-5.3-Flash-DFlash2"\n', ""), "revision needs repo"),
    "a drafter repo that is a path": (lambda t: t.replace('repo = "incoai/GLM-5.3-Flash-DFlash2"', 'repo = "../../etc"'),
                                      "[drafter]: repo='../../etc' is not an HF repo id"),
    "a typo'd engine flag": (lambda t: t.replace('"--max-num-seqs", "6"', '"--max-num-seqz", "6"'),
                             "args: --max-num-seqz is not a flag of vLLM 0.32.0's `vllm serve` (nearest: --max-num-seqs)"),
    "a typo'd engine flag with its value": (lambda t: t.replace('"--max-num-seqs", "6"', '"--max-num-seqz=6"'),
                                            "--max-num-seqz is not a flag of vLLM 0.32.0"),
    "a typo'd engine switch": (lambda t: t.replace('"--enable-auto-tool-choice"', '"--enable-auto-tool-choise"'),
                               "(nearest: --enable-auto-tool-choice)"),
    "a typo'd flag after a flag that takes a value": (
        lambda t: t.replace('"--max-num-seqs", "6"', '"--seed", "--max-nun-seqs", "6"'),
        "args: --seed needs a value, got the option '--max-nun-seqs'"),
    "an engine flag prefix of several": (lambda t: t.replace('"--max-num-seqs", "6"', '"--max-num", "6"'),
                                         "--max-num is ambiguous to vLLM 0.32.0's `vllm serve`: it begins"),
    "a per-rank flag": (lambda t: t.replace('"--max-num-seqs", "6"', '"--headless", "--max-num-seqs", "6"'),
                        "args: --headless is set per rank by launch; remove it from args"),
    "an unknown short flag": (lambda t: t.replace('"--max-num-seqs", "6"', '"-x", "--max-num-seqs", "6"'),
                              "args: -x is not a flag of vLLM 0.32.0's `vllm serve`"),
    "a short flag after a flag that takes a value": (
        lambda t: t.replace('"--max-num-seqs", "6"', '"--max-num-seqs", "-tp"'),
        "args: --max-num-seqs needs a value, got the option '-tp'"),
    "the API key in args": (lambda t: t.replace('"--max-num-seqs", "6"', '"--api-key", "sk-live", "--max-num-seqs", "6"'),
                            "args: --api-key puts the key in the container's argv, where `docker inspect` and `ps` "
                            "show it; remove it and set VLLM_API_KEY instead"),
    "the API key spelled with an equals sign": (lambda t: t.replace('"--max-num-seqs", "6"', '"--api_key=sk-live", "--max-num-seqs", "6"'),
                                                "args: --api-key puts the key"),
    "an escape in an arg": (lambda t: t.replace('"glm45"', '"glm45\\u001b[2J"'), "holds a control character"),
    "an arg past any flag's size": (lambda t: t.replace('"glm45"', '"' + "g" * 40000 + '"'),
                                    "args: the value of --reasoning-parser is 40000 bytes, over 32768"),
    "a revision that is a number": (lambda t: t.replace('model_revision = "unpinned"', "model_revision = 7"),
                                    "model_revision must be a string"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_recipe(tmp_path, run_inproc, case):
    edit, expect = CASES[case]
    path = tmp_path / "recipe.toml"
    path.write_text(edit(BASE.read_text()))
    for target in ("all", "0"):
        proc = run_inproc("launch", target, "--recipe", path, "--dry-run", "--json")
        assert proc.returncode == 1, proc.stdout
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("sparkstack: error: "), proc.stderr
        assert expect in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("edit, note", [
    ('"--port", "9999", "--max-num-seqs", "6"',
     "note: the recipe's args say --port '9999'; launch sets --port '8888' from API_PORT (remove it from args, or set "
     "API_PORT)"),
    ('"-tp", "4", "--max-num-seqs", "6"',
     "note: the recipe's args say --tensor-parallel-size '4'; launch sets --tensor-parallel-size '2' from the recipe's "
     "tensor_parallel_size (remove it from args)"),
])
def test_a_flag_launch_writes_itself_is_overruled_in_a_note_not_silently(tmp_path, run_inproc, edit, note):
    path = tmp_path / "recipe.toml"
    path.write_text(BASE.read_text().replace('"--max-num-seqs", "6"', edit))
    proc = run_inproc("launch", "all", "--recipe", path, "--dry-run", env={"API_PORT": "8888"})
    assert note in proc.stdout, proc.stdout + proc.stderr
    flag = note.split("say ")[1].split(" ")[0]
    doc = json.loads(run_inproc("launch", "all", "--recipe", path, "--dry-run", "--json", env={"API_PORT": "8888"}).stdout)
    assert note.removeprefix("note: ") in doc["notes"]
    for rank in doc["ranks"]:
        assert rank["engine_argv"].count(flag) == 1  # launch's own copy only


def test_clock_cap_is_written_without_leading_zeros(tmp_path):
    """nvidia-smi and tune's stamp see one spelling: "0100,02000" is the cap 100,2000."""
    from sparkstack.recipe import load_recipe

    recipe = tmp_path / "recipe.toml"
    recipe.write_text(BASE.read_text().replace('clock_cap = "0,2000"', 'clock_cap = "0100,02000"'))
    assert load_recipe(str(recipe)).clock_cap == "100,2000"


def test_bad_knob_values(tmp_path, run_inproc):
    for env, expect in (({"API_PORT": "88a8"}, "not a port"), ({"EAGER": "yes"}, "expected 0 or 1"),
                        ({"NUM_SPEC_TOKENS": "four"}, "not a whole number")):
        proc = run_inproc("launch", "all", "--dry-run", "--json", env=env)
        assert proc.returncode == 1 and expect in proc.stderr and proc.stderr.count("\n") == 1


# An ssh target may not hold whitespace (it is one word), but shell metacharacters still stay literal.
SSH_META = "me@host;rm${IFS}-rf${IFS}/;`id`"


def test_shell_metacharacters_stay_literal_argv_elements(tmp_path, run_inproc):
    nasty = "x; touch /tmp/pwned-$(id -u) | cat `uname` && echo '\"$HOME\""
    path = tmp_path / "recipe.toml"
    text = BASE.read_text().replace('"--reasoning-parser", "glm45"', f'"--reasoning-parser", {json.dumps(nasty)}')
    path.write_text(text)
    doc = json.loads(run_inproc("launch", "1", "--recipe", path, "--dry-run", "--json",
                             env={"SERVED_NAME": "a b;c$(d)", "WORKER_SSH": SSH_META}, check=PLANNED).stdout)
    argv = doc["docker_run"]
    assert argv[argv.index("--reasoning-parser") + 1] == nasty
    assert argv[argv.index("--served-model-name") + 1] == "a b;c$(d)"
    # Over ssh, the one command string is shlex.join of the argv: it splits back to exactly these elements.
    import shlex

    from sparkstack.remote import Runner
    wire = Runner(ssh=doc["ssh"]).argv(argv)
    assert wire[-3] == SSH_META and wire[-2] == "--"
    assert shlex.split(wire[-1]) == argv


def test_unknown_target_is_a_usage_error(run_inproc):
    assert run_inproc("launch", "seven", "--dry-run").returncode == 2
    assert run_inproc("launch", "5", "--dry-run").returncode == 2


def test_missing_recipe(run_inproc):
    proc = run_inproc("launch", "all", "--recipe", "no-such-recipe", "--dry-run")
    assert proc.returncode == 1 and "no recipe 'no-such-recipe'" in proc.stderr
