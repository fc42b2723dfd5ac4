"""launch --image: precedence (IMAGE env > --image > recipe), the built layout's identity, and preflight per rank."""

import json
import os
from pathlib import Path

import pytest
from clirun import PLANNED

import hostfix
import imagefix as fx
import standins


@pytest.fixture
def built_image_world(tmp_path, run_cli):
    base, src = tmp_path / "base", fx.write_overlay_source(tmp_path / "src")
    fx.write_base(base)
    overlay = fx.write_overlay(tmp_path / "overlay", pinned_from=src / "overlay-dflash2")
    built = tmp_path / "image"
    result = json.loads(run_cli("image", "build", "--base", base, "--overlay", overlay, "--overlay-src", src,
                                "--out", built, "--json", env={"SPARKSTACK_CACHE_DIR": str(tmp_path / "cache")},
                                check=0).stdout)["result"]
    home = hostfix.write_hub(tmp_path / "hf")
    standins.install(tmp_path / "bin")
    env = {"HF_HOME": str(home), "RECORD_LOG": str(tmp_path / "calls.jsonl"),
           "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    return {"tmp": tmp_path, "built": built, "result": result, "env": env,
            "root": hostfix.write_host(tmp_path / "hostroot")}


def plan(run_cli, w, *args, env=None):
    proc = run_cli("launch", "all", "--dry-run", "--json", "--host-root", w["root"], *args,
                   env={**w["env"], **(env or {})}, check=PLANNED)
    return json.loads(proc.stdout)


def test_precedence_env_then_flag_then_recipe(run_cli, built_image_world):
    recipe = plan(run_cli, built_image_world)
    assert recipe["image_source"] == "recipe" and recipe["image"] == "glm53-dflash2-tony:v1"
    flag = plan(run_cli, built_image_world, "--image", "registry.example/vllm:v9")
    assert flag["image_source"] == "flag" and flag["image"] == "registry.example/vllm:v9"
    assert flag["image_config_digest"] is None
    env = plan(run_cli, built_image_world, "--image", "registry.example/vllm:v9", env={"IMAGE": "mine:1"})
    assert env["image_source"] == "env" and env["image"] == "mine:1"
    for rank in env["ranks"]:
        assert "mine:1" in rank["docker_run"] and "registry.example/vllm:v9" not in rank["docker_run"]
    # the flag the user gave lost: the plan says so, and says nothing when nothing lost
    assert "IMAGE is set in the environment: it wins over --image" in env["notes"]
    assert not any("--image" in note for note in flag["notes"] + plan(run_cli, built_image_world, env={"IMAGE": "mine:1"})["notes"])


def test_a_built_layout_runs_by_its_content_addressed_tag(run_cli, built_image_world):
    doc = plan(run_cli, built_image_world, "--image", built_image_world["built"])
    digest = built_image_world["result"]["config_digest"]
    assert doc["image_config_digest"] == digest and doc["image_source"] == "flag"
    assert doc["image"] == built_image_world["result"]["name"] and doc["image"].endswith(digest.split(":")[1][:12])
    for rank in doc["ranks"]:
        assert doc["image"] in rank["docker_run"]
    assert doc["would_load"] == {"rank": 0, "from": str(built_image_world["built"]), "config_digest": digest, "if_missing": True}
    calls = standins.recorded(Path(built_image_world["env"]["RECORD_LOG"]))
    assert [c for c in calls if c[0] == "docker"] == []  # a plain dry run asks no docker at all


def test_probe_a_worker_without_the_built_image_fails_naming_ship(run_cli, built_image_world):
    digest = built_image_world["result"]["config_digest"]
    doc = plan(run_cli, built_image_world, "--image", built_image_world["built"], "--probe",
               env={"STANDIN_IMAGE_ID": "", "STANDIN_REMOTE_IMAGE_ID": ""})
    images = {c["rank"]: c for c in doc["preflight"] if c["check"] == "image"}
    assert images[0]["status"] == "pass" and "launch loads it" in images[0]["detail"]
    assert images[1]["status"] == "fail" and "sparkstack ship" in images[1]["detail"]
    assert doc["would_load"]["if_missing"] is False
    # A worker holding another image under the same tag fails too; one holding the built digest passes.
    doc = plan(run_cli, built_image_world, "--image", built_image_world["built"], "--probe",
               env={"STANDIN_IMAGE_ID": digest, "STANDIN_REMOTE_IMAGE_ID": "sha256:" + "cd" * 32})
    images = {c["rank"]: c for c in doc["preflight"] if c["check"] == "image"}
    assert images[1]["status"] == "fail" and "not the built" in images[1]["detail"]
    assert doc["would_load"] is None  # the head already holds it
    doc = plan(run_cli, built_image_world, "--image", built_image_world["built"], "--probe",
               env={"STANDIN_IMAGE_ID": digest, "STANDIN_REMOTE_IMAGE_ID": digest})
    checks = {(c["check"], c["rank"]): c["status"] for c in doc["preflight"]}
    assert checks[("image", 0)] == checks[("image", 1)] == checks[("image-identity", None)] == "pass"


@pytest.mark.parametrize("value", ["./no-such-dir/", "/nonexistent/image.tar", "{junk}"])
def test_a_bad_image_flag_is_one_line(run_cli, built_image_world, value):
    if value == "{junk}":
        junk = built_image_world["tmp"] / "junk"
        junk.mkdir()
        (junk / "index.json").write_text("{}")
        value = str(junk)
    proc = run_cli("launch", "0", "--dry-run", "--image", value, env=built_image_world["env"])
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1 and "--image" in proc.stderr


def test_launch_of_a_worker_alone_loads_nothing_on_the_head_and_records_the_workers_image(run_cli, built_image_world):
    """`launch 1 --image LAYOUT`: the head, not launched, is not touched (its load is for `launch 0`/`all`), and
    the run record names the image the started rank holds."""
    digest = built_image_world["result"]["config_digest"]
    env = {**built_image_world["env"], "STANDIN_IMAGE_ID": "", "STANDIN_REMOTE_IMAGE_ID": digest,
           "STANDIN_REMOTE_RECORD_LOG": str(built_image_world["tmp"] / "worker.jsonl"),
           "SPARKSTACK_STATE_DIR": str(built_image_world["tmp"] / "state")}
    proc = run_cli("launch", "1", "--image", built_image_world["built"], "--host-root", built_image_world["root"], "--worker-delay", "0",
                   "--json", env=env, check=0)
    head = standins.recorded(Path(built_image_world["env"]["RECORD_LOG"]))
    assert not [c for c in head if c[0] == "docker" and ("load" in c or "run" in c)]
    worker = standins.recorded(built_image_world["tmp"] / "worker.jsonl")
    assert [c for c in worker if c[:2] == ["docker", "run"]]
    record = json.loads(Path(json.loads(proc.stdout)["record"]).read_text())
    assert record["image_id"] == digest
