"""Outputs: never replace what sparkstack did not write; "up to date" only when it is true; shipped data found anywhere."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import assert_planned, one_error_line

import imagefix as fx
import synth

REPO = Path(__file__).resolve().parents[2]


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def model(tmp_path):
    synth.write_model_dir(tmp_path / "flat")
    return synth.cache_from_dir(tmp_path / "flat", tmp_path / "hub", repo_id="org/model")


def image_build(run_cli, w, out, *extra, env=None):
    return run_cli("image", "build", "--base", w["base"], "--overlay", w["overlay"], "--overlay-src", w["src"],
                   "--out", out, "--json", *extra, env=env)


# ---------------------------------------------------------------- 1. never delete what sparkstack did not write


def foreign_dir(path: Path) -> dict[str, bytes]:
    (path / "notes").mkdir(parents=True)
    (path / "thesis.tex").write_text("years of work\n")
    (path / "notes" / "todo.txt").write_text("do not delete\n")
    return tree(path)


def test_strip_refuses_a_foreign_out_dir_and_keeps_it(run_cli, model, tmp_path):
    out = tmp_path / "mine"
    before = foreign_dir(out)
    line = one_error_line(run_cli("strip", model, "--out", out))
    assert "not written by sparkstack" in line
    assert tree(out) == before


def test_strip_refuses_a_regular_file_as_out(run_cli, model, tmp_path):
    out = tmp_path / "file"
    out.write_text("precious\n")
    one_error_line(run_cli("strip", model, "--out", out))
    assert out.read_text() == "precious\n"


def test_image_build_refuses_a_foreign_out_dir_and_keeps_it(run_cli, image_world, tmp_path):
    out = tmp_path / "mine"
    before = foreign_dir(out)
    line = one_error_line(image_build(run_cli, image_world, out))
    assert "not written by sparkstack" in line
    assert tree(out) == before


def test_image_build_refuses_a_foreign_tar_and_a_dir_named_tar(run_cli, image_world, tmp_path):
    tar = tmp_path / "backup.tar"
    subprocess.run(["tar", "-cf", tar, "-C", image_world["src"], "."], check=True)
    before = tar.read_bytes()
    line = one_error_line(image_build(run_cli, image_world, tar))
    assert "not an archive sparkstack wrote" in line
    assert tar.read_bytes() == before
    odd = tmp_path / "odd.tar"
    foreign_dir(odd)
    one_error_line(image_build(run_cli, image_world, odd))


def test_one_command_does_not_replace_another_commands_output(run_cli, image_world, model, tmp_path):
    out = tmp_path / "image"
    assert image_build(run_cli, image_world, out).returncode == 0
    before = tree(out)
    line = one_error_line(run_cli("strip", model, "--out", out))
    assert "sparkstack image build" in line
    assert tree(out) == before


def test_previous_outputs_are_replaced_and_marked(run_cli, image_world, model, tmp_path):
    out = tmp_path / "image"
    first = json.loads(image_build(run_cli, image_world, out).stdout)["result"]
    (image_world["src"] / "overlay-dflash2/dflash2/speculator.py").write_text("class DFlash2Speculator:\n    width = 9\n")
    run_cli("pin", "overlay", "--overlay", image_world["overlay"], "--overlay-src", image_world["src"], "--repin", check=0)
    second = json.loads(image_build(run_cli, image_world, out).stdout)["result"]
    assert second["config_digest"] != first["config_digest"] and not second["up_to_date"]
    marker = json.loads((out / ".sparkstack/output.json").read_text())
    assert marker["written_by"] == "sparkstack image build"
    tar = tmp_path / "image.tar"
    assert image_build(run_cli, image_world, tar).returncode == 0
    assert image_build(run_cli, image_world, tar, "--variant", "plain").returncode == 0  # our own archive: replaceable
    stripped = tmp_path / "stripped"
    run_cli("strip", model, "--out", stripped, check=0)
    assert json.loads((stripped / ".sparkstack/output.json").read_text())["written_by"] == "sparkstack strip"


# ---------------------------------------------------------------- 4. "up to date" must be true


def test_strip_sees_a_config_edited_through_the_snapshot_link(run_cli, model, tmp_path):
    out = tmp_path / "stripped"
    run_cli("strip", model, "--out", out, check=0)
    config = model / "snapshots" / synth.REVISION / "config.json"
    doc = json.loads(config.read_text())
    doc["num_hidden_layers"] = doc.get("num_hidden_layers", 2) + 1
    config.write_text(json.dumps(doc))  # writes through the symlink into the blob: same blob name
    proc = run_cli("strip", model, "--out", out, check=0)
    assert "up to date" not in proc.stdout
    served = json.loads((out / "snapshots" / synth.REVISION / "config.json").read_text())
    assert served["num_hidden_layers"] == doc["num_hidden_layers"]
    assert "up to date" in run_cli("strip", model, "--out", out, check=0).stdout


def test_strip_sees_a_shard_rewritten_in_place(run_cli, model, tmp_path):
    out = tmp_path / "stripped"
    run_cli("strip", model, "--out", out, check=0)
    shard = next((model / "snapshots" / synth.REVISION).glob("*.safetensors")).resolve()
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # same name, same size: only the stat identity tells
    shard.write_bytes(bytes(data))
    assert "up to date" not in run_cli("strip", model, "--out", out, check=0).stdout


def test_image_build_up_to_date_only_when_the_output_is_complete(run_cli, image_world, tmp_path):
    out = tmp_path / "image"
    first = json.loads(image_build(run_cli, image_world, out).stdout)["result"]
    plan = json.loads(run_cli("image", "build", "--base", image_world["base"], "--overlay", image_world["overlay"],
                              "--overlay-src", image_world["src"], "--out", out, "--dry-run", "--json", check=0).stdout)
    assert plan["up_to_date"] is True
    again = json.loads(image_build(run_cli, image_world, out).stdout)["result"]
    assert again["up_to_date"] and again["config_digest"] == first["config_digest"]
    # A missing base blob in the output: not up to date; the rebuild restores it.
    layer = first["layer_digest"].split(":")[1]
    base_layer = next(p for p in (out / "blobs/sha256").iterdir() if p.name != layer and p.stat().st_size > 10_000)
    base_layer.unlink()
    rebuilt = json.loads(image_build(run_cli, image_world, out).stdout)["result"]
    assert not rebuilt["up_to_date"] and base_layer.exists()
    run_cli("image", "verify", out, check=0)


@pytest.mark.parametrize("change", ["epoch", "step", "script"])
def test_image_build_fingerprint_covers_the_whole_plan(run_cli, image_world, tmp_path, change):
    out = tmp_path / "image"
    image_build(run_cli, image_world, out)
    env, extra = None, []
    if change == "epoch":
        env = {"SOURCE_DATE_EPOCH": "1700000000"}
    elif change == "step":
        # the optional step's script is a no-op in the fixture: enabling it changes the plan, not the files
        extra = ["--with-step", "prefix_cache_draft_group"]
    elif change == "script":
        # an unpinned overlay lets a script change without overlay.toml changing
        overlay = fx.write_overlay(tmp_path / "unpinned")
        image_world = dict(image_world, overlay=overlay)
        image_build(run_cli, image_world, out, "--allow-unpinned")
        script = image_world["src"] / "overlay-dflash2" / "patch_glm5_drafter_group.py"
        script.write_text(script.read_text() + "\n# harmless edit\n")
        extra = ["--allow-unpinned"]
    proc = image_build(run_cli, image_world, out, *extra, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["result"]["up_to_date"] is False


# ---------------------------------------------------------------- 5. shipped data, from anywhere


def test_launch_and_image_build_find_shipped_data_from_any_directory(run_cli, image_world, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = dict(os.environ, SPARKSTACK_RECIPES="")
    proc = subprocess.run([sys.executable, "-m", "sparkstack.cli", "launch", "0", "--dry-run", "--json"],
                          cwd=elsewhere, capture_output=True, text=True, env=env)
    assert_planned(proc)
    assert json.loads(proc.stdout)["recipe"] == "glm53-flash-dflash2-nvfp4"
    proc = subprocess.run([sys.executable, "-m", "sparkstack.cli", "image", "build", "--base", str(image_world["base"]),
                           "--overlay-src", str(image_world["src"]), "--allow-unpinned", "--out", str(tmp_path / "img"),
                           "--dry-run", "--json"], cwd=elsewhere, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["overlay"]["source"].startswith("tonyd2wild/GLM-5.3-Flash-NVFP4-DFlash2-2x-DGX-Spark@")


def test_a_wheel_install_carries_overlays_and_recipes_and_pin_refuses_its_copy(tmp_path):
    """pip builds a wheel of ./python; installed (no checkout around), it finds both, and never pins its own copy."""
    wheels, target, tree = tmp_path / "wheels", tmp_path / "site", tmp_path / "checkout"
    # Built from a copy: setuptools writes build/ and *.egg-info into the source tree, which a second suite run in
    # the same checkout was building at the same moment. The data dirs' relative symlinks survive the copy.
    junk = shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    for part in ("python", "overlays", "recipes"):
        shutil.copytree(REPO / part, tree / part, symlinks=True, ignore=junk)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(tree / "python"),
                    "-w", wheels], check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target,
                    *wheels.glob("*.whl")], check=True, capture_output=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = dict(os.environ, PYTHONPATH=str(target), SPARKSTACK_RECIPES="")
    proc = subprocess.run([sys.executable, "-m", "sparkstack.cli", "launch", "all", "--dry-run", "--json"],
                          cwd=elsewhere, capture_output=True, text=True, env=env)
    assert_planned(proc)
    assert json.loads(proc.stdout)["recipe_path"].startswith(str(target))
    installed = target / "sparkstack/data/overlays/dflash2/overlay.toml"
    assert installed.is_file() and not installed.is_symlink()
    before = installed.read_bytes()
    src = fx.write_overlay_source(tmp_path / "src")
    proc = subprocess.run([sys.executable, "-m", "sparkstack.cli", "pin", "overlay", "--overlay-src", str(src)],
                          cwd=elsewhere, capture_output=True, text=True, env=env)
    assert "installed copy" in one_error_line(proc)
    assert installed.read_bytes() == before
    # fetch --resolve would pin the recipe: the installed one is refused (before any hub is asked), naming the copy.
    recipe = target / "sparkstack/data/recipes/glm53-flash-dflash2-nvfp4/recipe.toml"
    before = recipe.read_bytes()
    proc = subprocess.run([sys.executable, "-m", "sparkstack.cli", "fetch", "--resolve"], cwd=elsewhere, check=False,
                          capture_output=True, text=True, env={**env, "HF_ENDPOINT": "http://127.0.0.1:9"})
    line = one_error_line(proc)
    assert "shipped recipe" in line and f"cp {recipe} my-recipe.toml" in line and "--recipe ./my-recipe.toml" in line
    assert recipe.read_bytes() == before


def test_pin_overlay_keeps_comments_and_dry_run_writes_nothing(run_cli, tmp_path):
    src = fx.write_overlay_source(tmp_path / "src")
    overlay = fx.write_overlay(tmp_path / "overlay")
    toml = overlay / "overlay.toml"
    toml.write_text("# a comment that must survive\n" + toml.read_text())
    before = toml.read_text()
    plan = json.loads(run_cli("pin", "overlay", "--overlay", overlay, "--overlay-src", src, "--dry-run", "--json",
                              check=0).stdout)
    assert toml.read_text() == before and plan["changes"]
    run_cli("pin", "overlay", "--overlay", overlay, "--overlay-src", src, check=0)
    after = toml.read_text()
    assert after.startswith("# a comment that must survive\n") and "unpinned" not in after.split("[variants")[0]
    import hashlib
    script = src / "overlay-dflash2" / "patch_glm_aux_capture.py"
    sha = hashlib.sha256(script.read_bytes()).hexdigest()
    block = after[after.index('script = "patch_glm_aux_capture.py"'):]
    assert block.split("sha256 = ", 1)[1].startswith(f'"{sha}"')
    assert "up to date" in run_cli("pin", "overlay", "--overlay", overlay, "--overlay-src", src, check=0).stdout


# ---------------------------------------------------------------- found by the attack review


def test_a_corrupted_output_is_not_up_to_date_and_the_rerun_restores_it(run_cli, model, tmp_path):
    import hashlib

    out = tmp_path / "stripped"
    run_cli("strip", model, "--out", out, check=0)
    rewritten = [p for p in (out / "snapshots" / synth.REVISION).glob("*.safetensors")
                 if p.resolve().stat().st_nlink == 1]  # written by strip, not a hardlink of the source
    assert rewritten, "the fixture should have a rewritten shard"
    blob = rewritten[0].resolve()
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))  # same size, same name
    proc = run_cli("strip", model, "--out", out, check=0)
    assert "up to date" not in proc.stdout
    assert hashlib.sha256(rewritten[0].resolve().read_bytes()).hexdigest() == blob.name


def test_stripping_an_older_snapshot_leaves_refs_main_alone(run_cli, model, tmp_path):
    import shutil

    newer = "f" * 40
    shutil.copytree(model / "snapshots" / synth.REVISION, model / "snapshots" / newer, symlinks=True)
    (model / "refs" / "main").write_text(newer)
    out = tmp_path / "stripped"
    run_cli("strip", model, "--out", out, check=0)
    run_cli("strip", model / "snapshots" / synth.REVISION, "--out", out, check=0)
    assert (out / "refs" / "main").read_text() == newer
    assert (out / "snapshots" / synth.REVISION / "config.json").is_file()
    assert "up to date" in run_cli("strip", model, "--out", out, check=0).stdout


@pytest.mark.parametrize("layout", ["flat", "cache"])
def test_a_link_out_of_the_model_is_refused(run_cli, model, tmp_path, layout):
    secret = tmp_path / "secret"
    secret.write_text("SECRET\n")
    src = tmp_path / "flat" if layout == "flat" else model / "snapshots" / synth.REVISION
    link = src / "tokenizer.json"
    link.unlink(missing_ok=True)
    link.symlink_to(secret)
    line = one_error_line(run_cli("strip", src if layout == "flat" else model, "--out", tmp_path / "out"))
    assert "links outside the model" in line
    assert not (tmp_path / "out").exists() and secret.stat().st_nlink == 1


def test_a_fifo_at_refs_main_is_refused_not_waited_on(run_cli, model, tmp_path):
    ref = model / "refs" / "main"
    ref.unlink()
    os.mkfifo(ref)
    proc = subprocess.run([sys.executable, "-m", "sparkstack.cli", "strip", str(model), "--dry-run"],
                          capture_output=True, text=True, timeout=60)
    assert "not a regular file" in one_error_line(proc)


def test_a_killed_tar_build_leaves_nothing_that_the_next_run_keeps(image_world, tmp_path):
    """kill -9 while the archive is being written: the partial lives in a pid-named staging dir beside --out,
    and the next run removes it (the real base would leave 20 GB per kill otherwise)."""
    import signal
    import time

    big = tmp_path / "big"
    fx.write_base(big, layers=fx.default_layers(filler_bytes=96 << 20))
    out = tmp_path / "k.tar"
    argv = [sys.executable, "-m", "sparkstack.cli", "image", "build", "--base", str(big), "--overlay",
            str(image_world["overlay"]), "--overlay-src", str(image_world["src"]), "--out", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(tmp_path.glob(".sparkstack-k.tar-*/image.tar")):
        time.sleep(0.01)
    assert list(tmp_path.glob(".sparkstack-k.tar-*/image.tar")), "the build never started writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()  # nothing half-written at --out
    subprocess.run(argv, check=True, capture_output=True)
    assert out.is_file() and list(tmp_path.glob(".sparkstack-*")) == []


def test_a_corrupt_layer_cache_object_costs_a_reread_not_the_build(run_cli, image_world, tmp_path):
    first = json.loads(image_build(run_cli, image_world, tmp_path / "a").stdout)["result"]
    objects = [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.parent.name == "objects"]
    assert objects
    for obj in objects:
        obj.write_bytes(b"garbage")
    proc = image_build(run_cli, image_world, tmp_path / "b")
    assert proc.returncode == 0, proc.stderr
    second = json.loads(proc.stdout)["result"]
    assert second["config_digest"] == first["config_digest"] and second["cache"]["layer_bytes_read"] > 0


def test_out_may_not_be_the_working_directory_nor_the_base(run_cli, image_world, model, tmp_path):
    here = tmp_path / "empty-cwd"
    here.mkdir()
    for argv in (["strip", str(model), "--out", "."],
                 ["image", "build", "--base", str(image_world["base"]), "--overlay", str(image_world["overlay"]),
                  "--overlay-src", str(image_world["src"]), "--out", "."]):
        proc = subprocess.run([sys.executable, "-m", "sparkstack.cli", *argv], cwd=here, capture_output=True, text=True)
        assert "working directory" in one_error_line(proc)
        assert here.is_dir()
    before = tree(image_world["base"])
    line = one_error_line(image_build(run_cli, image_world, image_world["base"]))
    assert "overlap the base" in line and tree(image_world["base"]) == before


def test_image_build_is_not_up_to_date_over_a_layer_rewritten_in_place(run_cli, image_world, tmp_path):
    out = tmp_path / "image"
    first = json.loads(image_build(run_cli, image_world, out).stdout)["result"]
    layer = out / "blobs/sha256" / first["layer_digest"].split(":")[1]
    data = bytearray(layer.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, same name
    layer.write_bytes(bytes(data))
    again = json.loads(image_build(run_cli, image_world, out).stdout)["result"]
    assert again["up_to_date"] is False
    run_cli("image", "verify", out, check=0)
