"""Hardening II: every hostile knob or recipe value gets one clear line on stderr, exit 1, no traceback.

Each case drives the real CLI (`sparkstack launch 0 --dry-run`), either with one environment variable set
or with one edit to the tuned recipe. The line must name where the value came from (the environment
variable, or the recipe file and its key). Warnings also go to stderr, so "one line" counts every line.
"""

import os
from pathlib import Path

import pytest
from clirun import assert_planned, run_in_process

ROOT = Path(__file__).parents[2]
TUNED = ROOT / "recipes/glm53-flash-dflash2-nvfp4/recipe.toml"
PLAIN = ROOT / "recipes/glm53-flash-dflash2-mxfp8/recipe.toml"
KNOBS = ("IMAGE", "NAME", "SERVED_NAME", "MODEL_CACHE_NAME", "DRAFT_CACHE_NAME", "HF_HOME", "LOAD_FORMAT", "EAGER",
         "NUM_SPEC_TOKENS", "GPU_MEM_UTIL", "KV_CACHE_MEMORY", "OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND",
         "MAX_NUM_BATCHED_TOKENS", "API_PORT", "MAX_MODEL_LEN", "MAX_NUM_SEQS", "MOE_BACKEND", "WORKER_SSH",
         "MASTER_ADDR", "MASTER_PORT", "CX_NIC", "CX_HCA")  # the seed launcher's, written out rather than imported


def launch(tmp_path, *args, env=None, target="0"):
    """The real CLI, in-process (clirun.run_in_process: a child's start would cost more than the refusal), with no
    knob inherited from the caller's environment."""
    base = {k: v for k, v in os.environ.items() if k not in KNOBS and k != "VLLM_API_KEY"}
    full = {**base, "HF_HOME": str(tmp_path / "hf"), **(env or {})}
    argv = ["launch", target, "--dry-run", "--host-root", str(tmp_path), *map(str, args)]
    return run_in_process(argv, full, replace_env=True, text=False)


def refused(proc, *names: str) -> str:
    """Exit 1 with exactly one stderr line (every line counts: warnings too), naming what it must name."""
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 1, f"exit {proc.returncode}; stderr: {err!r}"
    assert "Traceback" not in err, err
    assert err.endswith("\n") and err.count("\n") == 1 and len(err.splitlines()) == 1, f"not one line: {err!r}"
    assert err.startswith("sparkstack: error: "), err
    rest = err
    for path in (n for n in names if "/" in n):  # the file first: test dirs are named after tests ("..._fabric_...")
        assert path in rest, f"{path!r} not named in {err!r}"
        rest = rest.replace(path, "")
    for name in (n for n in names if "/" not in n):
        assert name in rest, f"{name!r} not named in {err!r}"
    return err


def edited(tmp_path, old: str, new: str, base: Path = TUNED, name: str = "recipe.toml") -> Path:
    text = base.read_text()
    assert old in text, f"the edit anchor {old!r} is not in {base.name}: the case would test nothing"
    path = tmp_path / name
    path.write_text(text.replace(old, new, 1))
    return path


def env_case(tmp_path, knob, value, recipe=None):
    extra = ("--recipe", recipe) if recipe else ()
    err = refused(launch(tmp_path, *extra, env={knob: value}), "environment variable", knob)
    if value.isprintable() and value:
        assert value[:12] in err, f"the bad value {value!r} is not shown in {err!r}"


# -------------------------------------------------------------- 1. numbers and their ranges

NUMBERS = [
    ("MAX_MODEL_LEN", "1e5"), ("MAX_MODEL_LEN", "+5"), ("MAX_MODEL_LEN", " 5"), ("MAX_MODEL_LEN", "5 "),
    ("MAX_MODEL_LEN", "０"), ("MAX_MODEL_LEN", "0"), ("MAX_MODEL_LEN", "-1"), ("MAX_MODEL_LEN", "1_000"),
    ("MAX_MODEL_LEN", ""), ("MAX_MODEL_LEN", str(2**63)), ("MAX_MODEL_LEN", "9" * 5000), ("MAX_MODEL_LEN", "٨"),
    ("MAX_NUM_SEQS", "0"), ("MAX_NUM_SEQS", "six"), ("MAX_NUM_BATCHED_TOKENS", "8192.0"),
    ("NUM_SPEC_TOKENS", "4\n"), ("NUM_SPEC_TOKENS", "0"), ("OMP_NUM_THREADS", "-8"), ("OMP_NUM_THREADS", "0x8"),
    ("API_PORT", "0"), ("API_PORT", "65536"), ("API_PORT", "８８８８"), ("MASTER_PORT", "99999"),
    ("MASTER_PORT", ""), ("GPU_MEM_UTIL", "0"), ("GPU_MEM_UTIL", "1.5"), ("GPU_MEM_UTIL", "nan"),
    ("GPU_MEM_UTIL", "inf"), ("GPU_MEM_UTIL", "1e-1"), ("GPU_MEM_UTIL", "-0.5"), ("GPU_MEM_UTIL", "0.9 "),
    ("GPU_MEM_UTIL", ""), ("GPU_MEM_UTIL", "0,9"), ("KV_CACHE_MEMORY", "-1"), ("KV_CACHE_MEMORY", "1e10"),
    ("KV_CACHE_MEMORY", "10 GiB"), ("KV_CACHE_MEMORY", str(2**64)), ("EAGER", "yes"), ("EAGER", "2"), ("EAGER", " 1"),
]


@pytest.mark.parametrize("knob,value", NUMBERS, ids=[f"{k}={v[:20]!r}" for k, v in NUMBERS])
def test_numbers_out_of_kind_or_range(tmp_path, knob, value):
    env_case(tmp_path, knob, value)


def test_numbers_in_range_are_accepted(tmp_path):
    """The edges of each range, and the empty values the old launcher gives a meaning."""
    for env in ({"API_PORT": "1", "MASTER_PORT": "65535"}, {"GPU_MEM_UTIL": "1"}, {"GPU_MEM_UTIL": ".5"},
                {"GPU_MEM_UTIL": "1.0"}, {"MAX_MODEL_LEN": str(2**63 - 1), "KV_CACHE_MEMORY": ""}, {"KV_CACHE_MEMORY": ""},
                {"KV_CACHE_MEMORY": "0"}, {"EAGER": ""}, {"LOAD_FORMAT": ""}, {"NUM_SPEC_TOKENS": "1"}):
        proc = launch(tmp_path, "--json", env=env)
        assert_planned(proc)
        assert proc.stderr.decode().startswith("preflight:") and proc.stderr.count(b"\n") == 1, (env, proc.stderr)


# -------------------------------------------------------------- 2. option lookalikes and whitespace

WORDS = [
    ("IMAGE", "--privileged"), ("IMAGE", "img:v1 --privileged"), ("IMAGE", ""), ("IMAGE", "img\tv1"),
    ("MOE_BACKEND", "-x"), ("MOE_BACKEND", "mar lin"), ("LOAD_FORMAT", "--evil"), ("NAME", "--rm"), ("NAME", "a b"),
    ("NAME", "x{rank}{"), ("NAME", "{rank.__class__}"), ("NAME", ""), ("WORKER_SSH", "-oProxyCommand=touch%x"),
    ("WORKER_SSH", "me@host\t"), ("WORKER_SSH", "me@ host"), ("CX_NIC", "../../etc"), ("CX_NIC", "eth0:1"),
    ("CX_NIC", "a" * 16), ("CX_NIC", "-i"), ("CX_HCA", "/etc"), ("CX_HCA", "mlx 5"), ("CX_HCA", ".."),
    ("VLLM_CPU_OMP_THREADS_BIND", "0-7 8-15"), ("VLLM_CPU_OMP_THREADS_BIND", "-1"),
    ("MODEL_CACHE_NAME", "../../../etc"), ("DRAFT_CACHE_NAME", "/etc"), ("MODEL_CACHE_NAME", "models--a/../../x"),
    ("SERVED_NAME", "-x"), ("SERVED_NAME", ""),
]


@pytest.mark.parametrize("knob,value", WORDS, ids=[f"{k}={v[:20]!r}" for k, v in WORDS])
def test_option_lookalikes_and_whitespace_in_names(tmp_path, knob, value):
    env_case(tmp_path, knob, value)


RECIPE_WORDS = [
    ('docker_image = "glm53-dflash2-tony:v1"', 'docker_image = "--privileged"', "docker_image"),
    ('distributed_backend = "mp"', 'distributed_backend = "-x"', "distributed_backend"),
    ('shm_size = "16g"', 'shm_size = "--privileged"', "shm_size"),
    ('IMAGE = "glm53-dflash2-tony:v1"', 'IMAGE = "-v/:/host"', "IMAGE"),
    ('ssh = "{WORKER_SSH}"', 'ssh = "-oProxyCommand=x"', "ssh"),
    ('ssh = "{WORKER_SSH}"', 'ssh = "me@spark worker"', "ssh"),
    ('fabric_ip = "10.0.0.2"', 'fabric_ip = "10.0.0.2"\ndocker_host = "-Htcp://evil"', "docker_host"),
    ('fabric_ip = "10.0.0.2"', 'fabric_ip = "10.0.0.2"\nnic = "enp 1"', "nic"),
    ('fabric_ip = "10.0.0.2"', 'fabric_ip = "10.0.0.2"\nhca = "../x"', "hca"),
    ('method = "dflash"', 'method = "--x"', "method"),
]


@pytest.mark.parametrize("old,new,key", RECIPE_WORDS, ids=[c[1][-24:] for c in RECIPE_WORDS])
def test_option_lookalikes_in_the_recipe(tmp_path, old, new, key):
    path = edited(tmp_path, old, new)
    refused(launch(tmp_path, "--recipe", path), str(path), key)


# -------------------------------------------------------------- 3. HF_HOME

@pytest.mark.parametrize("value", ["", "/a:/etc", "relative/hf", "~other/hf", "/a\nb", "-v"])
def test_hf_home_is_a_usable_path(tmp_path, value):
    env_case(tmp_path, "HF_HOME", value)


# -------------------------------------------------------------- 4. value flags have a value

ARGS = [
    ("\"--speculative-config\", '{\"method\":\"dflash\",\"num_speculative_tokens\":4}',\n  \"--tool-call-parser\", \"glm47\",\n"
     '  "--enable-auto-tool-choice",\n  "--reasoning-parser", "glm45",\n]',
     '"--tool-call-parser", "glm47",\n  "--enable-auto-tool-choice",\n  "--reasoning-parser", "glm45",\n  "--speculative-config",\n]',
     "--speculative-config"),
    ('"--block-size", "2304",', '"--block-size",', "--block-size"),
    ('"--block-size", "2304",', '"--block-size", "abc",', "--block-size"),
    ('"--block-size", "2304",', '"--block-size", "2304", "--block-size", "16",', "--block-size"),
    ('"--kv-cache-dtype", "fp8_e4m3",', '"--kv-cache-dtype", "fp8_e4m3", "--kv-cache-memory-bytes", "5",', "--kv-cache-memory"),
    ('"--tool-call-parser", "glm47",', '"--tool-call-parser", "--evil",', "--tool-call-parser"),
    ('"--max-model-len", "524288",', '"--max-model-len", "-1",', "--max-model-len"),
]


@pytest.mark.parametrize("old,new,flag", ARGS, ids=[c[2] + str(i) for i, c in enumerate(ARGS)])
def test_value_flags_have_a_value_of_their_kind(tmp_path, old, new, flag):
    path = edited(tmp_path, old, new)
    refused(launch(tmp_path, "--recipe", path), str(path), flag)


@pytest.mark.parametrize("old,new,flag", [
    ('  "--reasoning-parser", "glm45",\n]', '  "--reasoning-parser", "glm45",\n  "--max-model-len",\n]', "--max-model-len"),
    ('"--block-size", "256",', '"--block-size", "--enable-chunked-prefill",', "--block-size"),
    ('"--gpu-memory-utilization", "0.82",', '"--gpu-memory-utilization=1.2",', "--gpu-memory-utilization"),
])
def test_value_flags_in_a_plain_recipe(tmp_path, old, new, flag):
    path = edited(tmp_path, old, new, base=PLAIN)
    refused(launch(tmp_path, "--recipe", path), str(path), flag)


# -------------------------------------------------------------- 5. node and parallel counts

@pytest.mark.parametrize("old,new,key", [
    ("required_nodes = 2", "required_nodes = 0", "required_nodes"),
    ("required_nodes = 2", "required_nodes = -1", "required_nodes"),
    ("tensor_parallel_size = 2", "tensor_parallel_size = 0", "tensor_parallel_size"),
    ("tensor_parallel_size = 2", "tensor_parallel_size = 4611686018427387904", "tensor_parallel_size"),
    ("pipeline_parallel_size = 1", "pipeline_parallel_size = 0", "pipeline_parallel_size"),
    ("pipeline_parallel_size = 1", "pipeline_parallel_size = -3", "pipeline_parallel_size"),
])
def test_counts_are_at_least_one_and_sane(tmp_path, old, new, key):
    for base in (TUNED, PLAIN):
        path = edited(tmp_path, old, new, base=base)
        refused(launch(tmp_path, "--recipe", path), str(path), key)


# -------------------------------------------------------------- 6. the drafter's cache knob

@pytest.mark.parametrize("value", ["NOPE", "API_PORT", "", "draft_cache_name"])
def test_drafter_cache_knob_names_a_cache_knob(tmp_path, value):
    path = edited(tmp_path, 'cache_name_knob = "DRAFT_CACHE_NAME"', f'cache_name_knob = "{value}"')
    refused(launch(tmp_path, "--recipe", path), str(path), "cache_name_knob")


# -------------------------------------------------------------- 7. node templates

TEMPLATES = ["{rank.nope}", "{nope}", "{0}", "{}", "{rank!r}", "{rank[0]}", "{WORKER_SSH:>{API_PORT}}", "{", "me@}",
             "{rank.__class__.__mro__}"]


@pytest.mark.parametrize("template", TEMPLATES)
def test_node_templates_use_only_rank_and_knobs(tmp_path, template):
    path = edited(tmp_path, 'ssh = "{WORKER_SSH}"', f'ssh = "{template}"')
    refused(launch(tmp_path, "--recipe", path), str(path), "#2", "ssh")


def test_a_template_that_fills_to_a_bad_value_names_the_node(tmp_path):
    path = edited(tmp_path, 'ssh = "{WORKER_SSH}"', 'ssh = "{SERVED_NAME}"')
    refused(launch(tmp_path, "--recipe", path, env={"SERVED_NAME": "me@a b"}), str(path), "#2", "ssh")
    path = edited(tmp_path, 'fabric_ip = "10.0.0.2"', 'fabric_ip = "{API_PORT}"')
    refused(launch(tmp_path, "--recipe", path), str(path), "#2", "fabric_ip")


def test_good_templates_fill_per_rank(tmp_path):
    import json

    text = TUNED.read_text().replace("required_nodes = 2", "required_nodes = 3")
    text = text.replace('fabric_ip = "10.0.0.2"', 'fabric_ip = "10.0.0.2"\nnic = "enp{rank}"')
    text += '\n[[nodes]]\nhost = "spark-3"\nssh = "me@spark-{rank}"\nfabric_ip = "10.0.1.{rank}"\n'
    (tmp_path / "r.toml").write_text(text)
    proc = launch(tmp_path, "--recipe", tmp_path / "r.toml", "--json", target="all")
    assert_planned(proc)
    ranks = json.loads(proc.stdout)["ranks"]
    assert [r["ssh"] for r in ranks] == [None, "user@worker-node", "me@spark-2"]
    assert [r["fabric_ip"] for r in ranks] == ["10.0.0.1", "10.0.0.2", "10.0.1.2"] and ranks[1]["nic"] == "enp1"


# -------------------------------------------------------------- 8. not UTF-8, not a table

def test_recipe_that_is_not_utf8(tmp_path):
    path = tmp_path / "recipe.toml"
    path.write_bytes(b"# caf\xe9\n" + TUNED.read_bytes())
    refused(launch(tmp_path, "--recipe", path), str(path), "UTF-8")


def test_recipe_with_a_bom_is_still_utf8(tmp_path):
    path = tmp_path / "recipe.toml"
    path.write_bytes(b"\xef\xbb\xbf" + TUNED.read_bytes())
    assert_planned(launch(tmp_path, "--recipe", path))


@pytest.mark.parametrize("key,value", [("nodes", "[1, 2]"), ("nodes", '"head"'), ("env", '"x"'), ("kv", "[]"),
                                       ("knobs", "5"), ("drafter", "[1]"), ("args", '"--evil"')])
def test_a_table_where_a_table_is_expected(tmp_path, key, value):
    # The key goes first in the file, its own table renamed away (the nodes cut out: `nodes = [1, 2]` is an
    # array as it should be, and its elements are checked after the top-level keys), so it is what is refused.
    text = TUNED.read_text()
    text = text[:text.index("[[nodes]]")] + text[text.index("# KV geometry"):]
    for header in (f"[{key}]\n", f"{key} = [", f"[{key}."):  # [kv.pages.<dtype>] goes with [kv]
        text = text.replace(header, header.replace(key, "x" + key))
    path = tmp_path / "recipe.toml"
    path.write_text(f"{key} = {value}\n" + text)
    err = refused(launch(tmp_path, "--recipe", path), str(path), key).replace(str(path), "")
    assert "table" in err or "array" in err, err  # TOML's words, not Python's "dict" or "list"


def test_deeply_nested_toml(tmp_path):
    path = tmp_path / "recipe.toml"
    path.write_text(TUNED.read_text() + "\nnest = " + "[" * 50000 + "]" * 50000 + "\n")
    refused(launch(tmp_path, "--recipe", path), str(path), "TOML")


# -------------------------------------------------------------- 9. one fabric address per rank

FABRIC = [
    ('fabric_ip = "10.0.0.2"\n', "", "#2"),  # the worker would borrow the head's 10.0.0.1
    ('host = "spark-head"\nfabric_ip = "10.0.0.1"\n', 'host = "spark-head"\n', "#1"),
    ('fabric_ip = "10.0.0.2"', 'fabric_ip = "10.0.0.1"', "#2"),
    ('fabric_ip = "10.0.0.2"', 'fabric_ip = "{MASTER_ADDR}"', "#2"),
    ('fabric_ip = "10.0.0.2"', 'fabric_ip = "10.0.0.256"', "#2"),
    ('fabric_ip = "10.0.0.2"', 'fabric_ip = "fe80::2"', "#2"),
    ('fabric_ip = "10.0.0.2"', 'fabric_ip = "spark-worker"', "#2"),
    ('fabric_ip = "10.0.0.2"', 'fabric_ip = "010.0.0.2"', "#2"),
    ('fabric_ip = "10.0.0.2"', 'fabric_ip = "0.0.0.0"', "#2"),
    ('fabric_ip = "10.0.0.2"', 'fabric_ip = "10.0.0.2 "', "#2"),
]


@pytest.mark.parametrize("old,new,node", FABRIC, ids=[f"{i}:{c[1][:28]!r}" for i, c in enumerate(FABRIC)])
def test_one_fabric_address_per_rank(tmp_path, old, new, node):
    path = edited(tmp_path, old, new)
    refused(launch(tmp_path, "--recipe", path), str(path), node, "fabric")


def test_three_nodes_without_a_third_fabric_address(tmp_path):
    text = TUNED.read_text().replace("required_nodes = 2", "required_nodes = 3")
    (tmp_path / "r.toml").write_text(text + '\n[[nodes]]\nhost = "spark-3"\nssh = "me@spark-3"\n')
    refused(launch(tmp_path, "--recipe", tmp_path / "r.toml"), "spark-3", "fabric")


def test_builtin_nodes_share_no_address(tmp_path):
    # The plain recipe has no [[nodes]]: the head takes MASTER_ADDR, the worker 10.0.0.2.
    refused(launch(tmp_path, "--recipe", PLAIN, env={"MASTER_ADDR": "10.0.0.2"}), "10.0.0.2")


def test_builtin_two_node_default_keeps_its_addresses(tmp_path):
    import json

    proc = launch(tmp_path, "--recipe", PLAIN, "--json", target="all")
    assert_planned(proc)
    assert [r["fabric_ip"] for r in json.loads(proc.stdout)["ranks"]] == ["10.0.0.1", "10.0.0.2"]


def test_one_node_needs_no_fabric_address(tmp_path):
    text = TUNED.read_text().replace("required_nodes = 2", "required_nodes = 1")
    text = text[:text.index("[[nodes]]")] + '[[nodes]]\nhost = "solo"\n\n' + text[text.index("# KV geometry"):]
    (tmp_path / "r.toml").write_text(text)
    assert_planned(launch(tmp_path, "--recipe", tmp_path / "r.toml"))


# -------------------------------------------------------------- 10. MASTER_ADDR

@pytest.mark.parametrize("value", ["-oProxyCommand=x", "a b", "", "host_name", "10.0.0.1\n", "--master-port", "ex*mple",
                                   "10.0.0.300", "10.0.0", "spark-head.lan", "::1::2", "10.0.0.1/24"])
def test_master_addr_is_an_ip_address(tmp_path, value):
    """It is the fabric address rank 0 listens on: the CX-7 link has addresses, not names (issue 38)."""
    err = refused(launch(tmp_path, env={"MASTER_ADDR": value}), "environment variable", "MASTER_ADDR")
    if value.isprintable() and value:
        assert "IPv4 or IPv6" in err, err


@pytest.mark.parametrize("value", ["127.0.0.1", "::1", "127.3.2.1"])
def test_master_addr_on_loopback_is_refused_for_two_hosts(tmp_path, value):
    """The worker is another machine: no loopback address of the head reaches it (::1 said so, not "reserved")."""
    err = refused(launch(tmp_path, env={"MASTER_ADDR": value}), f"MASTER_ADDR='{value}' is a loopback address")
    assert "set MASTER_ADDR=10.0.0.1" in err and "unicast" not in err


@pytest.mark.parametrize("value", ["192.168.7.1", "fd00::1"])
def test_master_addr_may_be_ipv4_or_ipv6(tmp_path, value):
    proc = launch(tmp_path, "--json", env={"MASTER_ADDR": value})
    assert_planned(proc)
    import json

    argv = json.loads(proc.stdout)["docker_run"]
    assert argv[argv.index("--master-addr") + 1] == value


# -------------------------------------------------------------- 11. more hostile values

def test_newline_in_served_name(tmp_path):
    env_case(tmp_path, "SERVED_NAME", "model\n--enable-lora")


def test_invisible_controls_in_served_name(tmp_path):
    env_case(tmp_path, "SERVED_NAME", "gpt\u202egnp.exe")  # a right-to-left override
    env_case(tmp_path, "SERVED_NAME", "a\u2028b")  # a line separator


def test_non_utf8_bytes_in_an_environment_variable(tmp_path):
    # os.environ encodes a lone surrogate escape back to the raw byte 0xff, as a shell would pass it.
    refused(launch(tmp_path, env={"SERVED_NAME": "caf\udcff"}), "SERVED_NAME")


def test_nul_byte_in_a_recipe_knob(tmp_path):
    path = edited(tmp_path, 'SERVED_NAME = "LibertAIDAI/GLM-5.3-Flash-NVFP4"', 'SERVED_NAME = "a\\u0000b"')
    refused(launch(tmp_path, "--recipe", path), str(path), "SERVED_NAME")


def test_nul_byte_in_an_arg(tmp_path):
    path = edited(tmp_path, '"--reasoning-parser", "glm45"', '"--reasoning-parser", "glm\\u000045"')
    refused(launch(tmp_path, "--recipe", path), str(path))


def test_api_and_master_port_collide(tmp_path):
    refused(launch(tmp_path, env={"API_PORT": "29521"}), "MASTER_PORT")


@pytest.mark.parametrize("old,new,key", [
    ("[env]\n", '[env]\nVLLM_API_KEY = "sk-in-the-recipe"\n', "VLLM_API_KEY"),
    ("[env]\n", '[env]\nVLLM_HOST_IP = "10.0.0.9"\n', "VLLM_HOST_IP"),
    ("[env]\n", '[env]\n"A=B" = "x"\n', "A=B"),
    ("[env]\n", '[env]\n"" = "x"\n', "env"),
    ("[env]\n", '[env]\nBAD = "a\\u0000b"\n', "BAD"),
    ("drafter_page_bytes_per_token_fp8 = 2048", "drafter_page_bytes_per_token_fp8 = 0", "drafter_page"),
    ("drafter_page_bytes_per_token = 4096", "drafter_page_bytes_per_token = 0", "drafter_page_bytes_per_token"),
    ("mla_page_bytes_per_token = 660", "mla_page_bytes_per_token = -660", "mla_page_bytes_per_token"),
    ('status = "ok"', 'status = "blocked"\nblocked_reason = "line one\\nsparkstack: ok"', "blocked_reason"),
    ('model = "LibertAIDAI/GLM-5.3-Flash-NVFP4"', 'model = "../../etc"', "model"),
    ('name = "glm53-flash-dflash2-nvfp4"', 'name = "-x"', "name"),
    ('"--speculative-config", \'{"method":"dflash","num_speculative_tokens":4}\'',
     '"--speculative-config", "' + "[" * 50000 + "]" * 50000 + '"', "--speculative-config"),
    ('NAME = "glm53-tony-rank{rank}"', 'NAME = "x{rank}}}{{"', "NAME"),
])
def test_more_hostile_recipe_values(tmp_path, old, new, key):
    path = edited(tmp_path, old, new)
    refused(launch(tmp_path, "--recipe", path), str(path), key)


def test_recipe_path_with_a_newline(tmp_path):
    refused(launch(tmp_path, "--recipe", tmp_path / "a\nb.toml"), "no such recipe")


# -------------------------------------------------------------- 12. values a real boot refuses 15 minutes in (issue 38)

def model_snapshot(tmp_path, config: dict) -> None:
    """The head's model snapshot in the hub layout, holding only its config.json."""
    import json

    entry = tmp_path / "hf" / "hub" / "models--LibertAIDAI--GLM-5.3-Flash-NVFP4-no-MTP"
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text("c" * 40)
    (entry / "snapshots" / ("c" * 40)).mkdir(parents=True)
    (entry / "snapshots" / ("c" * 40) / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("value", ["user@worker-node:22", "worker-node:2222", "me@10.0.0.2:22"])
def test_worker_ssh_with_a_port_points_to_ssh_config(tmp_path, value):
    err = refused(launch(tmp_path, env={"WORKER_SSH": value}, target="1"), "WORKER_SSH", value)
    assert "ssh_config" in err and "Port" in err, err


@pytest.mark.parametrize("value", ["user@fd00::2", "worker-node", "me@10.0.0.2"])
def test_worker_ssh_forms_ssh_takes(tmp_path, value):
    assert_planned(launch(tmp_path, env={"WORKER_SSH": value}, target="1"))


@pytest.mark.parametrize("value", ["5", "1048576"])
def test_a_kv_pin_below_one_sequence_is_refused(tmp_path, value):
    """The tuned recipe's 524,288-token context needs ~5.06 GiB of pool at its measured 10,354 B per token."""
    err = refused(launch(tmp_path, env={"KV_CACHE_MEMORY": value}), f"KV_CACHE_MEMORY={value}", "max-model-len")
    assert "refuse" in err, err


def test_a_kv_pin_of_one_sequence_is_taken(tmp_path):
    assert_planned(launch(tmp_path, env={"KV_CACHE_MEMORY": str(6 * 2**30)}))


def test_a_kv_pin_of_exactly_one_sequence_is_taken_one_token_more_is_not(tmp_path):
    """The recipe's measured cost: 10,247,694,336 B (its default pin) buys 989,727 tokens. A pool that holds one
    max-model-len sequence exactly is enough for vLLM; one token more of context is not."""
    assert_planned(launch(tmp_path, env={"MAX_MODEL_LEN": "989727"}))
    err = refused(launch(tmp_path, env={"MAX_MODEL_LEN": "989728"}), "KV", "989,727 tokens", "989,728 tokens")
    assert "refuse" in err, err


def test_a_context_past_the_pool_names_the_pool(tmp_path):
    # No snapshot here to read the model's context from: the pinned pool is what bounds it.
    err = refused(launch(tmp_path, env={"MAX_MODEL_LEN": "99999999999"}), "MAX_MODEL_LEN", "989,727 tokens")
    assert "past the model's context" not in err, err


def test_a_context_past_the_models_own_is_refused_with_that_reason(tmp_path):
    model_snapshot(tmp_path, {"max_position_embeddings": 600000})
    err = refused(launch(tmp_path, env={"MAX_MODEL_LEN": "99999999999"}), "MAX_MODEL_LEN=99999999999",
                  "max_position_embeddings", "600,000")
    assert "KV" not in err, err
    assert_planned(launch(tmp_path, env={"MAX_MODEL_LEN": "600000"}))
    refused(launch(tmp_path, env={"MAX_MODEL_LEN": "600001"}), "600,000")


def test_a_model_that_stretches_its_context_is_left_to_vllm(tmp_path):
    model_snapshot(tmp_path, {"max_position_embeddings": 4096, "rope_scaling": {"type": "yarn", "factor": 4.0}})
    assert_planned(launch(tmp_path, env={"MAX_MODEL_LEN": "16384"}))


def test_stop_and_status_work_whatever_the_kv_knobs_say(tmp_path):
    for verb in ("stop", "status"):
        proc = run_in_process(["launch", verb, "--dry-run", "--host-root", tmp_path],
                              {"HF_HOME": str(tmp_path / "hf"), "KV_CACHE_MEMORY": "5"})
        assert "KV_CACHE_MEMORY" not in proc.stderr, (verb, proc.stderr)


@pytest.mark.parametrize("value", ["999999999999999999999999", "9223372036854775808"])
def test_a_number_too_large_is_called_too_large_not_not_a_number(tmp_path, value):
    err = refused(launch(tmp_path, env={"MAX_NUM_SEQS": value}), "MAX_NUM_SEQS")
    assert "is over the largest allowed, 9,223,372,036,854,775,807" in err and "not a whole number" not in err
