"""launch with a pinned recipe: the argv names the pinned snapshots whatever refs/main says (with a warning when
refs/main names another one), and preflight checks those snapshots on the head and, over ssh, on the worker."""

import json
import os
import shutil
import subprocess

import hostfix
import pytest
import standins
import synth
from clirun import assert_planned, sparkstack_cmd
from hub_standin import recipe_copy

PIN = synth.REVISION  # the commit write_hub lays both entries out at
OTHER = "f" * 40


@pytest.fixture
def two_homes(tmp_path):
    head_home, worker_home = tmp_path / "head", tmp_path / "worker"
    hostfix.write_hub(head_home / "hf")
    worker_home.mkdir()
    standins.install(tmp_path / "bin")
    w = {"tmp": tmp_path, "hub": head_home / "hf/hub", "worker_hub": worker_home / "hf/hub",
         "root": hostfix.write_host(tmp_path / "root"), "log": tmp_path / "calls.jsonl"}
    # HF_HOME="~/hf": the head and the worker (the ssh stand-in's own HOME) each expand it at home.
    w["env"] = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", RECORD_LOG=str(w["log"]),
                    HOME=str(head_home), STANDIN_REMOTE_HOME=str(worker_home), HF_HOME="~/hf", VLLM_API_KEY="k",
                    SPARKSTACK_RECIPES="")
    return w


def launch(w, recipe, *extra):
    proc = subprocess.run(sparkstack_cmd() + ["launch", "0", "--recipe", str(recipe), "--dry-run", "--json",
                                              "--host-root", str(w["root"]), *extra],
                          capture_output=True, text=True, env=w["env"], timeout=120, check=False)
    assert_planned(proc)
    return json.loads(proc.stdout)


def checks_of(doc, rank=None):
    return {c["check"]: c for c in doc["preflight"] if c["rank"] == rank or (rank is None and c["rank"] in (None, 0))}


def test_the_pinned_snapshot_is_served_and_a_moved_refs_main_is_a_warning(two_homes):
    recipe = recipe_copy(two_homes["tmp"] / "pinned.toml", PIN, PIN)
    doc = launch(two_homes, recipe)
    argv = doc["docker_run"]
    assert f"/root/.cache/huggingface/hub/{hostfix.MODEL_CACHE}/snapshots/{PIN}" in argv
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["model"] == f"/root/.cache/huggingface/hub/{hostfix.DRAFT_CACHE}/snapshots/{PIN}"
    checks = checks_of(doc)
    assert checks["model-revision"]["status"] == checks["drafter-revision"]["status"] == "pass"
    # A newer download moves refs/main of both entries: the argv stays on the pin, preflight says so.
    for cache in (hostfix.MODEL_CACHE, hostfix.DRAFT_CACHE):
        shutil.copytree(two_homes["hub"] / cache / "snapshots" / PIN, two_homes["hub"] / cache / "snapshots" / OTHER, symlinks=True)
        (two_homes["hub"] / cache / "refs/main").write_text(OTHER)
    doc = launch(two_homes, recipe)
    assert f"/root/.cache/huggingface/hub/{hostfix.MODEL_CACHE}/snapshots/{PIN}" in doc["docker_run"]
    assert doc["model_revision"] == doc["drafter_revision"] == PIN
    checks = checks_of(doc)
    for label in ("model", "drafter"):
        assert checks[f"{label}-revision"]["status"] == "warn"
        assert f"serving the pinned {PIN[:12]}, but refs/main names {OTHER[:12]}" in checks[f"{label}-revision"]["detail"]
    assert [c for c in doc["preflight"] if c["status"] == "fail"] == []
    # Unpinned, the same cache serves refs/main, as before.
    doc = launch(two_homes, recipe_copy(two_homes["tmp"] / "unpinned.toml"))
    assert doc["model_revision"] == OTHER and "model-revision" not in checks_of(doc)


def test_a_pinned_snapshot_the_head_lacks_fails_even_when_refs_main_is_complete(two_homes):
    doc = launch(two_homes, recipe_copy(two_homes["tmp"] / "pinned.toml", OTHER, PIN))
    checks = checks_of(doc)
    assert checks["model-snapshot"]["status"] == "fail" and f"snapshots/{OTHER} does not exist" in checks["model-snapshot"]["detail"]
    assert checks["drafter-snapshot"]["status"] == "pass"


def _links_only(w):
    """`rsync -a` of the snapshot dirs alone: the links arrive, their blobs do not."""
    for cache in (hostfix.MODEL_CACHE, hostfix.DRAFT_CACHE):
        shutil.copytree(w["hub"] / cache / "snapshots", w["worker_hub"] / cache / "snapshots", symlinks=True)


def _truncated_shard(w):
    shutil.copytree(w["hub"], w["worker_hub"], symlinks=True)
    blob = (w["worker_hub"] / hostfix.MODEL_CACHE / "snapshots" / PIN / "model-00002-of-00003.safetensors").resolve()
    blob.write_bytes(blob.read_bytes()[:-8])


WORKER = {
    "nothing there": (lambda w: None, "model", f"snapshots/{PIN} does not exist"),
    "links without blobs": (_links_only, "model", "broken link(s), e.g. "),
    "a truncated shard": (_truncated_shard, "model", "model-00002-of-00003.safetensors is "),
}


@pytest.mark.parametrize("case", sorted(WORKER))
def test_the_workers_snapshot_is_checked_there_over_ssh(two_homes, case):
    make, label, detail = WORKER[case]
    make(two_homes)
    doc = launch(two_homes, recipe_copy(two_homes["tmp"] / "pinned.toml", PIN, PIN), "--probe")
    worker = checks_of(doc, rank=1)
    assert worker[f"{label}-snapshot"]["status"] == "fail", worker
    assert detail in worker[f"{label}-snapshot"]["detail"] and "run `sparkstack ship spark-worker`" in worker[f"{label}-snapshot"]["detail"]
    assert checks_of(doc)["model-snapshot"]["status"] == "pass"  # the head's own copy is whole
    # The check ran on the worker (through ssh), with python3 alone, and acted on nothing there.
    sent = [c for c in standins.recorded(two_homes["log"]) if c[0] == "ssh"]
    assert any("python3 -c" in c[-1] and f"'~/hf/hub' {hostfix.MODEL_CACHE} {PIN}" in c[-1] for c in sent), sent


def test_a_whole_worker_snapshot_passes(two_homes):
    shutil.copytree(two_homes["hub"], two_homes["worker_hub"], symlinks=True)
    before = synth.tree_digest(two_homes["worker_hub"])
    doc = launch(two_homes, recipe_copy(two_homes["tmp"] / "pinned.toml", PIN, PIN), "--probe")
    worker = checks_of(doc, rank=1)
    assert worker["model-snapshot"]["status"] == worker["drafter-snapshot"]["status"] == "pass"
    index = json.loads((two_homes["hub"] / hostfix.MODEL_CACHE / "snapshots" / PIN / "model.safetensors.index.json").read_text())
    assert f"{len(set(index['weight_map'].values()))} shards complete" in worker["model-snapshot"]["detail"]
    assert synth.tree_digest(two_homes["worker_hub"]) == before
