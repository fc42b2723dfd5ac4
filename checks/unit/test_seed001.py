"""Seed 001 (the blog's MXFP8 recipe) against the shipped recipe, field by field and comment by comment, read from
the seed's own text: ../shared/seeds/001-mxfp8-recipe.toml.txt beside this checkout (its first line is its path in
the seed's tree). Never against a copy of ours. Every field the seed has is the shipped recipe's, equal; every
field the shipped recipe adds is listed below with its reason; every comment line of the seed is in the shipped
recipe, in the seed's order. Without shared/ beside the checkout, these skip and say why."""

import json
import tomllib
from pathlib import Path

import pytest
from clirun import PLANNED

from sparkstack.launch.plan import plan_launch_from_recipe
from sparkstack.recipe import load_recipe

SHIPPED = Path(__file__).parents[2] / "recipes/glm53-flash-dflash2-mxfp8/recipe.toml"
SEED_FILE = Path(__file__).resolve().parents[3] / "shared/seeds/001-mxfp8-recipe.toml.txt"
SEED_PATH = "launcher/recipes/glm53-flash-dflash2-mxfp8/recipe.toml"  # the seed's first line: where it lived

# Every field the shipped recipe has beyond the seed's, and why. None replaces a field of the seed's.
ADDITIONS = {
    "model_revision": "sparkstack's: the hub commit fetch pins, so that both ranks serve the same bytes",
    "gpu_memory_gib": "sparkstack's: what preflight's free-memory check measures against; 121.63, the seed's own "
                      "GB10 figure (its --gpu-memory-utilization comment)",
    "status": "sparkstack's: launch refuses a blocked recipe unless --force",
    "blocked_reason": "sparkstack's: the seed's STATUS block (BLOCKED on GB10) as one line launch prints",
    "serves_mtp": "sparkstack's: the seed serves the checkpoint unstripped on purpose; this says so",
    "serves_mtp_reason": "sparkstack's: why, for preflight's mtp-strip line",
    "drafter": "sparkstack's: the drafter repo fetch downloads, its pinned revision and its licence",
    "boot": "sparkstack's: the boot lines verify expects",
    "kv": "sparkstack's: the seed's MATH (page bytes per token) as figures `plan kv` and preflight check",
}


@pytest.fixture(scope="module")
def seed_text() -> str:
    if not SEED_FILE.is_file():
        pytest.skip(f"{SEED_FILE} is not beside this checkout: these compare the recipe with seed 001's own text")
    first, text = SEED_FILE.read_text().split("\n", 1)
    assert first == SEED_PATH
    return text


def comment_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("#")]


def test_every_field_of_seed_001_is_the_shipped_recipes(seed_text):
    seed, shipped = tomllib.loads(seed_text), tomllib.loads(SHIPPED.read_text())
    differ = sorted(k for k in seed if shipped.get(k) != seed[k])
    assert differ == [], {k: (seed[k], shipped.get(k)) for k in differ}
    # the seed's display name, images and args as it writes them
    assert shipped["name"] == "GLM-5.3-Flash + DFlash2 draft (vLLM, 2x Spark, spec-k7)"
    assert (shipped["docker_image"], shipped["docker_image_dir"]) == ("glm53-flash-dflash2:local", "glm53-flash-dflash2")
    assert sorted(set(shipped) - set(seed)) == sorted(ADDITIONS)


def test_every_comment_of_seed_001_is_kept_in_its_order(seed_text):
    shipped = comment_lines(SHIPPED.read_text())
    at = 0
    for line in comment_lines(seed_text):
        assert line in shipped[at:], f"seed 001's comment is not in the recipe (after line {at}): {line!r}"
        at = shipped.index(line, at) + 1


def test_the_seeds_reasons_are_there_as_it_gives_them(seed_text):
    """The facts issue 37 names, read from the seed, found in the recipe: the fork's reason and its paths forward."""
    text = SHIPPED.read_text()
    for fact in ("indexes_kv_by_block_stride, so unify PADS the strided pages instead", "on GB10's 121.63",
                 "PATHS FORWARD", "give up — acceptance-rate comparison falls back to MTP"):
        assert fact in seed_text and fact in text, fact


def test_seed_001_as_written_loads_and_serves_as_glm53(seed_text, tmp_path):
    seed = tmp_path / "recipe.toml"
    seed.write_text(seed_text)
    for recipe in (seed, SHIPPED):
        plan = plan_launch_from_recipe(load_recipe(str(recipe)), {"HF_HOME": str(tmp_path)})
        argv = list(plan.ranks[0].engine_argv)
        assert argv[argv.index("--served-model-name") + 1] == "glm53" and argv.count("--served-model-name") == 1
        # the seed's own copies of flags the launcher writes itself appear once, as the launcher writes them
        assert argv.count("--trust-remote-code") == 1 and argv.count("--distributed-executor-backend") == 1


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
