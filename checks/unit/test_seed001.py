"""Seed 001 (the blog's MXFP8 recipe) against the shipped recipe, field by field. Every difference is either gone
or listed below with its reason.

Seed 001's own text is not in this repository. SEED is its content as it was recorded when this project began (its
keys, args, speculative config and env), plus `--served-model-name glm53`, which issue 29 quotes from it; the values of `docker_image` and
`docker_image_dir` are not recorded anywhere here, so the seed below has the keys' names only (that record lists
them without values). Loaded as a recipe, it must give what the seed serves: the name glm53."""

import json
import tomllib
from pathlib import Path

import pytest
from clirun import PLANNED

from sparkstack.launch.plan import plan_launch_from_recipe
from sparkstack.recipe import load_recipe

SHIPPED = Path(__file__).parents[2] / "recipes/glm53-flash-dflash2-mxfp8/recipe.toml"
UNKNOWN = object()  # a value the seed has that this repository does not record

SEED = {
    "engine": "vllm",
    "name": "glm53-flash-dflash2-mxfp8",
    "docker_image": UNKNOWN,
    "docker_image_dir": UNKNOWN,
    "model": "local-inference-lab/GLM-5.3-Flash-NVFP4",
    "required_nodes": 2,
    "tensor_parallel_size": 2,
    "pipeline_parallel_size": 1,
    "distributed_backend": "mp",
    "shm_size": "32gb",
    "args": [
        "--served-model-name", "glm53",
        "--gpu-memory-utilization", "0.82", "--kv-cache-memory-bytes", "10737418240", "--kv-cache-dtype", "fp8_ds_mla",
        "--block-size", "256", "--max-model-len", "524288", "--max-num-seqs", "8", "--max-num-batched-tokens", "4096",
        "--enable-chunked-prefill", "--async-scheduling", "--enable-prefix-caching", "--disable-custom-all-reduce",
        "--language-model-only", "--load-format", "instanttensor", "--enforce-eager",
        "--speculative-config", "'" + json.dumps({"method": "dflash", "model": "local-inference-lab/GLM-5.3-Flash-DFlash2-MXFP8",
                                                  "num_speculative_tokens": 7, "kv_cache_dtype": "auto"},
                                                 separators=(",", ":")) + "'",
        "--tool-call-parser", "glm47", "--enable-auto-tool-choice", "--reasoning-parser", "glm45",
    ],
    "env": {"HF_HUB_OFFLINE": "1", "VLLM_MLA_NOPE_PAD_ROPE": "1", "VLLM_ENGINE_READY_TIMEOUT_S": "3600",
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "VLLM_USE_AOT_COMPILE": "0",
            "TORCH_USE_RTLD_GLOBAL": "1", "VLLM_NO_USAGE_STATS": "1", "TORCH_CUDA_ARCH_LIST": "12.1a",
            "FLASHINFER_CUDA_ARCH_LIST": "12.1f", "CUTE_DSL_ARCH": "sm_121a", "CMAKE_CUDA_ARCHITECTURES": "121",
            "OMP_NUM_THREADS": "4"},
}

# Every field of the shipped recipe that is not the seed's, and why. A field the seed has must be equal, or here.
DIFFERENCES = {
    "docker_image": "the seed's value is not recorded in this repository; launch runs the IMAGE it is given (the "
                    "built image's tag), so this name only matters to a user's own `docker build`",
    "docker_image_dir": "as docker_image: the seed's value is not recorded here, and sparkstack builds no Dockerfile",
    "model_revision": "sparkstack's: the hub commit fetch pins, so that both ranks serve the same bytes",
    "status": "sparkstack's: launch refuses a blocked recipe unless --force",
    "blocked_reason": "sparkstack's: why it is blocked on GB10 (the drafter's KV page is no multiple of the MLA page)",
    "serves_mtp": "sparkstack's: the seed serves the checkpoint unstripped on purpose; this says so",
    "serves_mtp_reason": "sparkstack's: why, for preflight's mtp-strip line",
    "drafter": "sparkstack's: the drafter repo fetch downloads, its pinned revision and its licence",
    "boot": "sparkstack's: the boot lines verify expects",
    "kv": "sparkstack's: the page figures `plan kv` and preflight check",
}


def test_seed_001_loaded_as_a_recipe_serves_as_glm53(tmp_path):
    seed = tmp_path / "seed001.toml"
    fields = {k: v for k, v in SEED.items() if v is not UNKNOWN}
    body = "\n".join(f"{k} = {json.dumps(v)}" for k, v in fields.items() if k != "env")
    body += "\ndocker_image = \"seed-image-name-not-recorded\"\n[env]\n"
    body += "\n".join(f"{k} = {json.dumps(v)}" for k, v in SEED["env"].items())
    seed.write_text(body + "\n")
    for recipe in (seed, SHIPPED):
        plan = plan_launch_from_recipe(load_recipe(str(recipe)), {"HF_HOME": str(tmp_path)})
        argv = list(plan.ranks[0].engine_argv)
        assert argv[argv.index("--served-model-name") + 1] == "glm53" and argv.count("--served-model-name") == 1


def test_the_shipped_recipe_is_seed_001_but_for_the_listed_differences():
    shipped = tomllib.loads(SHIPPED.read_text())
    unexplained = []
    for key in sorted(set(SEED) | set(shipped)):
        if key in DIFFERENCES:
            continue
        if key not in shipped or key not in SEED or SEED[key] != shipped[key]:
            unexplained.append(key)
    assert unexplained == [], f"fields that differ from seed 001 without a reason: {unexplained}"
    # Each listed difference is a real one: a reason for a field that now matches is a stale reason.
    stale = [k for k in DIFFERENCES if k in SEED and SEED[k] is not UNKNOWN and SEED[k] == shipped.get(k)]
    assert stale == [] and all(k in shipped for k in DIFFERENCES)


def test_the_recipe_keeps_seed_001s_investigation():
    text = SHIPPED.read_text()
    for what in ("--disable-hybrid-kv-cache-manager", '"kv_cache_dtype":"fp8"', "other target KV dtypes",
                 "89 against eager's 92", "fork"):
        assert what in text, what


@pytest.mark.parametrize("recipe", ["glm53-flash-dflash2-mxfp8"])
def test_a_recipe_serving_mtp_on_purpose_says_why(recipe):
    assert "num_nextn_predict_layers > 0" in load_recipe(recipe).serves_mtp_reason


NVFP4 = Path(__file__).parents[2] / "recipes/glm53-flash-dflash2-nvfp4/recipe.toml"


@pytest.mark.parametrize("on_purpose", [False, True])
def test_mtp_strip_passes_a_recipe_that_serves_mtp_on_purpose(run_cli, tmp_path, on_purpose):
    import hostfix
    import standins

    standins.install(tmp_path / "bin")
    root, home = hostfix.write_host(tmp_path / "root"), hostfix.write_hub(tmp_path / "hf")
    snap = next((home / "hub" / hostfix.MODEL_CACHE / "snapshots").iterdir())
    config = json.loads((snap / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1  # the checkpoint as published: its MTP layer announced
    (snap / "config.json").unlink()  # a link into blobs/: replace the link, never the blob
    (snap / "config.json").write_text(json.dumps(config))
    recipe = tmp_path / "recipe.toml"
    text = NVFP4.read_text()
    if on_purpose:
        text = text.replace('status = "ok"\n', 'status = "ok"\nserves_mtp = true\nserves_mtp_reason = "the loader '
                                               'skips them while num_nextn_predict_layers > 0"\n')
    recipe.write_text(text)
    proc = run_cli("launch", "0", "--dry-run", "--json", "--host-root", root, "--recipe", recipe,
                   env={"HF_HOME": str(home), "VLLM_API_KEY": "k", "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}, check=PLANNED)
    strip = next(c for c in json.loads(proc.stdout)["preflight"] if c["check"] == "mtp-strip")
    if on_purpose:
        assert strip["status"] == "pass" and "on purpose" in strip["detail"] and "loader skips them" in strip["detail"]
    else:
        assert strip["status"] == "fail" and "num_nextn_predict_layers = 1" in strip["detail"]
