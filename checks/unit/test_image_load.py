"""`image load` against a fake engine that checks the stream, skopeo reading the stream, and `--link-base`.

The fake `docker`/`podman` (first on PATH) reads `load`'s stdin as a tar stream, checks that every
member named blobs/sha256/<hex> hashes to <hex> and that manifest.json names only members present,
and keeps the "loaded" images in a state file; `image inspect` answers from it. It records
whether its stdin was a pipe: the archive must never be a file on disk. The lab tests load into
the real dockerd and podman.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import imagefix as fx

FAKE_ENGINE = r'''#!{python}
import hashlib, json, os, shlex, stat, sys, tarfile
name = os.path.basename(sys.argv[0])
args = sys.argv[1:]
state_path = os.environ["FAKE_STATE"]
state = json.load(open(state_path)) if os.path.exists(state_path) else {"ids": [], "names": {}}
call = {"argv": [name] + args}
if name == "ssh":
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write(json.dumps(call) + "\n")
    command = args[args.index("--") + 1]
    os.execvp(shlex.split(command)[0], shlex.split(command))  # stdin carries on across "ssh"
if args[:1] == ["-H"]:
    call["host"] = args[1]
    args = args[2:]

def save():
    json.dump(state, open(state_path, "w"))

def lookup(ref):
    ref = ref if ref.startswith("sha256:") or ":" in ref else ref + ":latest"
    if ref in state["ids"]:
        return ref
    return state["names"].get(ref)

code = 0
if args[0] == "version":
    print("20.10.0-fake")
elif args[:2] == ["image", "inspect"]:
    found = lookup(args[-1])
    if found:
        print(found if name == "docker" else found.split(":")[1])
    else:
        print(f"Error: No such image: {args[-1]}", file=sys.stderr)
        code = 1
elif args[0] == "tag":
    found = lookup(args[1])
    state["names"][args[2]] = found
    save()
elif args[0] == "load":
    call["stdin_is_pipe"] = stat.S_ISFIFO(os.fstat(0).st_mode)
    members, order = {}, []
    try:
        with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as tar:
            for m in tar:
                data = tar.extractfile(m).read()
                members[m.name] = hashlib.sha256(data).hexdigest()
                order.append(m.name)
                if m.name == "manifest.json":
                    manifest = json.loads(data)
    except Exception as exc:
        print(f"Error: unexpected EOF or bad archive: {exc}", file=sys.stderr)
        call["failed"] = True
        code = 1
    else:
        call["order"] = order
        bad = [n for n, h in members.items() if n.startswith("blobs/sha256/") and n.split("/")[-1] != h]
        entry = manifest[0]
        missing = [p for p in [entry["Config"]] + entry["Layers"] if p not in members]
        if bad or missing:
            print(f"Error: bad blobs {bad} missing {missing}", file=sys.stderr)
            code = 1
        else:
            image_id = "sha256:" + members[entry["Config"]]
            state["ids"].append(image_id)
            for t in entry["RepoTags"] or []:
                state["names"][t] = image_id
            call["manifest"] = manifest
            save()
            print("Loaded image: " + (entry["RepoTags"] or [image_id])[0])
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(call) + "\n")
sys.exit(code)
'''


@pytest.fixture
def fake_engine_world(image_world):
    """image_world, and a fake docker, podman and ssh first on PATH that load what they are streamed."""
    tmp_path = image_world["tmp"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("docker", "podman", "ssh"):
        (bin_dir / name).write_text(FAKE_ENGINE.replace("{python}", sys.executable))
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_STATE": str(tmp_path / "engine.json"),
           "FAKE_LOG": str(tmp_path / "engine.log")}
    return {**image_world, "env": env}


def calls(w) -> list[dict]:
    log = Path(w["env"]["FAKE_LOG"])
    return [json.loads(l) for l in log.read_text().splitlines()] if log.exists() else []


def build(run_cli, w, out, *extra):
    proc = run_cli("image", "build", "--base", w["base"], "--overlay", w["overlay"], "--overlay-src", w["src"],
                   "--out", out, "--json", *extra, check=0)
    return json.loads(proc.stdout)["result"]


def load(run_cli, w, path, *extra, check=None):
    return run_cli("image", "load", path, *extra, env=w["env"], check=check)


def test_load_streams_a_docker_archive_through_a_pipe_then_is_up_to_date(fake_engine_world, run_cli):
    r = build(run_cli, fake_engine_world, fake_engine_world["tmp"] / "img")
    out = load(run_cli, fake_engine_world, fake_engine_world["tmp"] / "img", "--json", check=0)
    doc = json.loads(out.stdout)
    assert doc["result"]["image_id"] == r["config_digest"] and doc["plan"]["action"] == "load"
    (loaded,) = [c for c in calls(fake_engine_world) if c["argv"][1:2] == ["load"]]
    assert loaded["stdin_is_pipe"] is True  # no archive on disk: the engine read a pipe
    assert loaded["order"][0] == "manifest.json"
    hexes = lambda ds: [f"blobs/sha256/{d.split(':')[1]}" for d in ds]  # noqa: E731
    manifest = json.loads((fake_engine_world["tmp"] / "img/blobs/sha256" / r["manifest_digest"].split(":")[1]).read_text())
    assert loaded["manifest"] == [{"Config": hexes([r["config_digest"]])[0], "RepoTags": [r["name"]],
                                   "Layers": hexes(l["digest"] for l in manifest["layers"])}]
    Path(fake_engine_world["env"]["FAKE_LOG"]).unlink()
    again = load(run_cli, fake_engine_world, fake_engine_world["tmp"] / "img", check=0)
    assert again.stdout.startswith("up to date")
    assert [c for c in calls(fake_engine_world) if c["argv"][1] not in ("version", "image")] == []  # only read-only questions


def test_an_engine_holding_the_id_under_another_name_only_gets_a_tag(fake_engine_world, run_cli):
    r = build(run_cli, fake_engine_world, fake_engine_world["tmp"] / "img")
    load(run_cli, fake_engine_world, fake_engine_world["tmp"] / "img", check=0)
    state = json.loads(Path(fake_engine_world["env"]["FAKE_STATE"]).read_text())
    state["names"] = {}
    Path(fake_engine_world["env"]["FAKE_STATE"]).write_text(json.dumps(state))
    Path(fake_engine_world["env"]["FAKE_LOG"]).unlink()
    proc = load(run_cli, fake_engine_world, fake_engine_world["tmp"] / "img", check=0)
    assert proc.stdout.startswith("tagged")
    assert [c["argv"] for c in calls(fake_engine_world) if c["argv"][1] == "tag"] == [["docker", "tag", r["config_digest"], r["name"]]]
    assert not [c for c in calls(fake_engine_world) if c["argv"][1] == "load"]


def test_a_corrupt_blob_aborts_the_load_and_nothing_is_loaded(fake_engine_world, run_cli):
    build(run_cli, fake_engine_world, fake_engine_world["tmp"] / "img")
    layer = fake_engine_world["digests"]["layers"][0]
    blob = fake_engine_world["tmp"] / "img/blobs/sha256" / layer.split(":")[1]
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.unlink()  # a hardlink of the base's blob: replace it, do not edit the base through it
    blob.write_bytes(bytes(data))
    proc = load(run_cli, fake_engine_world, fake_engine_world["tmp"] / "img")
    assert proc.returncode == 1 and layer in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    state = Path(fake_engine_world["env"]["FAKE_STATE"])
    assert not state.exists() or json.loads(state.read_text())["ids"] == []


def test_a_foreign_layout_with_symlinked_blobs_loads_untagged(fake_engine_world, run_cli):
    layout = fake_engine_world["tmp"] / "linked"
    (layout / "blobs/sha256").mkdir(parents=True)
    for p in (fake_engine_world["base"] / "blobs/sha256").iterdir():
        (layout / "blobs/sha256" / p.name).symlink_to(p)
    for name in ("index.json", "oci-layout"):
        shutil.copy(fake_engine_world["base"] / name, layout / name)
    proc = load(run_cli, fake_engine_world, layout, "--json", check=0)
    doc = json.loads(proc.stdout)
    assert doc["plan"]["name"] is None and doc["result"]["image_id"] == fake_engine_world["digests"]["config"]
    (loaded,) = [c for c in calls(fake_engine_world) if c["argv"][1:2] == ["load"]]
    assert loaded["manifest"][0]["RepoTags"] == []


def test_load_on_a_rank_crosses_ssh_stdin_with_the_command_joined_safely(fake_engine_world, run_cli):
    r = build(run_cli, fake_engine_world, fake_engine_world["tmp"] / "img")
    sock = "unix:///run/odd dir/docker.sock"  # a space: only shlex.join keeps it one word
    load(run_cli, fake_engine_world, fake_engine_world["tmp"] / "img", "--host", "rank1", "--docker-host", sock, check=0)
    (ssh,) = [c for c in calls(fake_engine_world) if c["argv"][0] == "ssh" and "load" in c["argv"][-1]]
    assert ssh["argv"][1:5] == ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
    assert ssh["argv"][-1] == f"docker -H '{sock}' load"
    (loaded,) = [c for c in calls(fake_engine_world) if c["argv"][:1] == ["docker"] and c["argv"][-1] == "load"]
    assert loaded["host"] == sock and loaded["stdin_is_pipe"]
    assert json.loads(Path(fake_engine_world["env"]["FAKE_STATE"]).read_text())["names"][r["name"]] == r["config_digest"]


def test_podman_engine(fake_engine_world, run_cli):
    r = build(run_cli, fake_engine_world, fake_engine_world["tmp"] / "img")
    proc = load(run_cli, fake_engine_world, fake_engine_world["tmp"] / "img", "--engine", "podman", "--json", check=0)
    assert json.loads(proc.stdout)["result"]["image_id"] == r["config_digest"]  # podman's bare hex, normalised
    assert [c["argv"][:2] for c in calls(fake_engine_world) if c["argv"][1:2] == ["load"]] == [["podman", "load"]]
    bad = load(run_cli, fake_engine_world, fake_engine_world["tmp"] / "img", "--engine", "podman", "--docker-host", "unix:///x")
    assert bad.returncode == 2


def test_an_engine_that_answers_with_another_id_fails_the_check(fake_engine_world, run_cli, tmp_path):
    """The fake loads faithfully; this one claims a different ID afterwards: the load must not pass."""
    build(run_cli, fake_engine_world, fake_engine_world["tmp"] / "img")
    liar = tmp_path / "liar"
    liar.mkdir()
    (liar / "docker").write_text(f"#!/bin/sh\ncase \"$*\" in *inspect*) echo sha256:{'ab' * 32};; "
                                 "*load*) cat >/dev/null;; *) echo 20.10;; esac\n")
    (liar / "docker").chmod(0o755)
    proc = run_cli("image", "load", fake_engine_world["tmp"] / "img", env={**fake_engine_world["env"], "PATH": f"{liar}:{os.environ['PATH']}"})
    assert proc.returncode == 1 and "not the config digest" in proc.stderr


def test_the_stream_is_a_docker_archive_skopeo_reads(fake_engine_world, tmp_path):
    """skopeo (an independent reader) takes the stream as a docker-archive with the same config and diff_ids."""
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        pytest.fail("skopeo is required") if os.environ.get("SPARKSTACK_REQUIRE_TOOLS") else pytest.skip("no skopeo")
    from sparkstack.oci.load import write_docker_archive
    from sparkstack.oci.source import open_image

    src, image = open_image(fake_engine_world["base"], "linux/arm64")
    archive = tmp_path / "stream.tar"  # only the test keeps the stream as a file, to hand it to skopeo
    with open(archive, "wb") as f:
        write_docker_archive(f, src, image, "fixture/base:1")
    src.close()
    proc = subprocess.run([skopeo, "inspect", "--config", f"docker-archive:{archive}"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    config = json.loads(proc.stdout)
    want = json.loads((fake_engine_world["base"] / "blobs/sha256" / fake_engine_world["digests"]["config"].split(":")[1]).read_text())
    assert config["rootfs"]["diff_ids"] == want["rootfs"]["diff_ids"]
    # dir: keeps the source's bytes (an oci: copy would re-serialise the config to convert it).
    proc = subprocess.run([skopeo, "copy", f"docker-archive:{archive}", f"dir:{tmp_path / 'copied'}"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    copied = json.loads((tmp_path / "copied/manifest.json").read_text())
    assert copied["config"]["digest"] == fake_engine_world["digests"]["config"]
    # skopeo hands docker-archive layers over uncompressed: their digests are the diff_ids.
    assert [l["digest"] for l in copied["layers"]] == want["rootfs"]["diff_ids"]


# ---------------------------------------------------------------- --link-base


def test_symlinked_output_links_to_the_base_and_passes_verify_and_umoci(fake_engine_world, run_cli, tmp_path):
    umoci = shutil.which("umoci") or pytest.fail("umoci is required")
    # The base's blobs are themselves symlinks (as Nix hands them over): links must reach the real files.
    store = tmp_path / "store"
    store.mkdir()
    for p in (fake_engine_world["base"] / "blobs/sha256").iterdir():
        shutil.move(p, store / p.name)
        p.symlink_to(store / p.name)
    r = build(run_cli, fake_engine_world, tmp_path / "out", "--link-base", "symlink")
    blobs = tmp_path / "out/blobs/sha256"
    for layer in fake_engine_world["digests"]["layers"]:
        link = blobs / layer.split(":")[1]
        assert link.is_symlink() and os.readlink(link) == str(store / layer.split(":")[1])
    own = [blobs / d.split(":")[1] for d in (r["config_digest"], r["manifest_digest"], r["layer_digest"])]
    assert not any(p.is_symlink() for p in own)  # what the build wrote itself is real files
    run_cli("image", "verify", tmp_path / "out", check=0)
    tag = r["name"].split(":")[1]
    proc = subprocess.run([umoci, "unpack", "--image", f"{tmp_path / 'out'}:{tag}", str(tmp_path / "bundle")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "bundle/rootfs" / fx.VLLM / "model_executor/models/qwen3_dflash2.py").is_file()


def test_link_base_is_part_of_the_fingerprint(fake_engine_world, run_cli, tmp_path):
    out = tmp_path / "out"
    a = build(run_cli, fake_engine_world, out)
    assert not any(p.is_symlink() for p in (out / "blobs/sha256").iterdir())
    assert build(run_cli, fake_engine_world, out)["up_to_date"] is True
    b = build(run_cli, fake_engine_world, out, "--link-base", "symlink")
    assert b["up_to_date"] is False  # switching the link kind rebuilds
    assert b["config_digest"] == a["config_digest"]  # ... the same image
    assert any(p.is_symlink() for p in (out / "blobs/sha256").iterdir())
    assert build(run_cli, fake_engine_world, out, "--link-base", "symlink")["up_to_date"] is True
    dry = run_cli("image", "build", "--base", fake_engine_world["base"], "--overlay", fake_engine_world["overlay"], "--overlay-src", fake_engine_world["src"],
                  "--out", out, "--dry-run", "--json", check=0)
    assert json.loads(dry.stdout)["link_base"] == "hardlink" and json.loads(dry.stdout)["up_to_date"] is False
