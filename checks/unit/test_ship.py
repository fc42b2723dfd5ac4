"""`sparkstack ship` end to end through the real CLI, the real helper and fake ssh/docker (checks/shipfix.py).

Each "host" is its own HOME here; the helper runs there exactly as it would behind sshd. The lab
(checks/lab/test_ship_lab.py) repeats the main cases against real sshd, dockerd and network namespaces.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import scan_cache_dir

import hostfix
import imagefix as fx
import shipfix
from clirun import gone, sparkstack_cmd, start
from inprocess_engine import wait_for
from killfix import loader_view, run_killed_before
from sparkstack import hfcache
from sparkstack.hfcache import entry_for_copy
from sparkstack.remote import Runner
from sparkstack.ship import helper, local
from sparkstack.ship import plan as P
from sparkstack.ship import wire

MODEL, DRAFT = hostfix.MODEL_CACHE, hostfix.DRAFT_CACHE
HUB = ".cache/huggingface/hub"


@pytest.fixture
def ship_world(tmp_path):
    head = tmp_path / "head"
    hostfix.write_hub(head / ".cache/huggingface")
    targets = {name: {"home": str(tmp_path / name)} for name in ("w1", "w2", "nodocker")}
    for t in targets.values():
        Path(t["home"]).mkdir()
    targets["nodocker"]["path"] = shipfix.bare_path(tmp_path / "bare-bin")
    targets["badkey"] = {"home": str(tmp_path / "badkey"), "fail": "Host key verification failed."}
    shipfix.install(tmp_path / "bin")
    log = tmp_path / "calls.jsonl"
    w = {"tmp": tmp_path, "head": head, "log": log, "env": shipfix.env_for(tmp_path / "bin", head, targets, log)}
    w["base"] = tmp_path / "base"
    fx.write_base(w["base"])
    w["src"] = fx.write_overlay_source(tmp_path / "src")
    w["overlay"] = fx.write_overlay(tmp_path / "overlay", pinned_from=w["src"] / "overlay-dflash2")
    return w


def build(w, out: Path, registry: str | None = None) -> dict:
    """An image from the fixture base; a different registry.py patch target makes a different top layer."""
    src = w["src"]
    if registry is not None:
        src = w["tmp"] / f"src-{hashlib.sha256(registry.encode()).hexdigest()[:8]}"
        fx.write_overlay_source(src)
        (src / "overlay-dflash2" / "qwen3_dflash2.py").write_text(registry)
    overlay = fx.write_overlay(out.with_name(out.name + "-overlay"), pinned_from=src / "overlay-dflash2")
    proc = subprocess.run(sparkstack_cmd() + ["image", "build", "--base", str(w["base"]), "--overlay", str(overlay),
                                              "--overlay-src", str(src), "--out", str(out), "--json"],
                          capture_output=True, text=True, env=dict(w["env"], SPARKSTACK_CACHE_DIR=str(w["tmp"] / "c")))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["result"]


def ship(w, *args, check=None) -> subprocess.CompletedProcess:
    proc = subprocess.run(sparkstack_cmd() + ["ship", *map(str, args)], capture_output=True, text=True, env=w["env"],
                          timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    if check is not None:
        assert proc.returncode == check, proc.stdout + proc.stderr
    return proc


def result(proc) -> dict:
    return {h["host"]: h for h in json.loads(proc.stdout)["hosts"]}


def layout_sizes(layout: Path) -> dict[str, int]:
    return {"sha256:" + p.name: p.stat().st_size for p in (layout / "blobs/sha256").iterdir()}


def host_blob(w, host: str, entry: str, blob: str) -> Path:
    return w["tmp"] / host / HUB / entry / "blobs" / blob


def test_first_ship_sends_everything_loads_through_a_pipe_and_links_the_hub(ship_world):
    img = ship_world["tmp"] / "img"
    built = build(ship_world, img)
    out = result(ship(ship_world, "w1", "--image", img, "--json", check=0))["w1"]
    assert out["error"] is None and out["via"] == "mgmt"
    sizes = layout_sizes(img)
    assert out["image"]["blobs_sent"] == len(sizes) and out["image"]["bytes_sent"] == sum(sizes.values())
    assert out["image"]["loaded"] and not out["image"]["already_loaded"]
    (load,) = [c for c in shipfix.calls(ship_world["log"]) if c["argv"][1:2] == ["load"]]
    assert load["stdin_is_pipe"]  # streamed from the host's store: no tar on its disk
    state = json.loads((ship_world["tmp"] / "w1/.engine.json").read_text())
    assert state["names"][built["name"]] == built["config_digest"]
    # The host's store is an OCI layout of this image over shared, content-addressed blobs.
    store = ship_world["tmp"] / "w1/.local/share/sparkstack"
    assert {p.name for p in (store / "blobs/sha256").iterdir()} == {d.split(":")[1] for d in sizes}
    index = json.loads((store / "images" / built["config_digest"].split(":")[1] / "index.json").read_text())
    assert index["manifests"][0]["digest"] == built["manifest_digest"]
    # Weights: every blob sent as a file, snapshot links and refs/main rebuilt; the hub library reads it.
    head_hub = ship_world["head"] / HUB
    for entry, part in zip((MODEL, DRAFT), out["weights"]):
        _, blobs = entry_for_copy(head_hub, entry)
        assert part["entry"] == entry and part["blobs_sent"] == len(blobs)
        assert part["bytes_sent"] == sum(b.size for b in blobs) and part["snapshot"] == "rebuilt"
    scan = scan_cache_dir(ship_world["tmp"] / "w1" / HUB)
    assert scan.warnings == []
    theirs = {r.repo_id: r for r in scan.repos}
    ours = {r.repo_id: r for r in scan_cache_dir(head_hub).repos}
    for repo_id, repo in ours.items():
        (rev,) = theirs[repo_id].revisions
        (mine,) = repo.revisions
        assert rev.commit_hash == mine.commit_hash and rev.refs == frozenset({"main"})
        assert {f.file_name: f.size_on_disk for f in rev.files} == {f.file_name: f.size_on_disk for f in mine.files}
        for f in rev.files:
            assert f.file_path.is_symlink() and not os.readlink(f.file_path).startswith("/")


def test_reship_sends_nothing_and_a_rebuild_sends_only_its_layer_config_and_manifest(ship_world):
    a, b = ship_world["tmp"] / "a", ship_world["tmp"] / "b"
    build(ship_world, a)
    ship(ship_world, "w1", "--image", a, check=0)
    seen = len(shipfix.calls(ship_world["log"]))
    again = ship(ship_world, "w1", "--image", a, "--json", check=0)
    out = result(again)["w1"]
    assert out["image"]["already_loaded"] and out["image"]["bytes_sent"] == 0 and out["image"]["blobs_sent"] == 0
    assert all(p["bytes_sent"] == 0 and p["snapshot"] == "up to date" for p in out["weights"])
    ssh_calls = [c for c in shipfix.calls(ship_world["log"])[seen:] if c["argv"][:1] == ["ssh"]]
    assert len(ssh_calls) == 1  # one round trip: the inventory; nothing to send, link or load
    built = build(ship_world, b, registry="# a one-line change\n")
    new = set(layout_sizes(b)) - set(layout_sizes(a))
    assert len(new) == 3  # the top layer, the config, the manifest
    out = result(ship(ship_world, "w1", "--image", b, "--json", check=0))["w1"]
    assert out["image"]["blobs_sent"] == 3 and out["image"]["bytes_sent"] == sum(layout_sizes(b)[d] for d in new)
    state = json.loads((ship_world["tmp"] / "w1/.engine.json").read_text())
    assert state["names"][built["name"]] == built["config_digest"]


def test_layers_docker_already_holds_are_neither_sent_nor_streamed_into_its_load(ship_world):
    """A worker that got the old image some other way (no sparkstack store there): only the new top layer,
    the config and the manifest go, and docker load gets no file for the layers it has."""
    a, b = ship_world["tmp"] / "a", ship_world["tmp"] / "b"
    build(ship_world, a)
    ship(ship_world, "w1", "--image", a, "--no-weights", check=0)
    shutil.rmtree(ship_world["tmp"] / "w1/.local")  # as if it had come by docker save | docker load
    built = build(ship_world, b, registry="# changed\n")
    new = set(layout_sizes(b)) - set(layout_sizes(a))
    out = result(ship(ship_world, "w1", "--image", b, "--no-weights", "--json", check=0))["w1"]
    base_layers = len(json.loads((b / "blobs/sha256" / built["manifest_digest"].split(":")[1]).read_text())["layers"]) - 1
    assert out["image"]["blobs_sent"] == 3 and out["image"]["bytes_sent"] == sum(layout_sizes(b)[d] for d in new)
    assert out["image"]["blobs_in_docker"] == base_layers and out["image"]["loaded"]
    load = [c for c in shipfix.calls(ship_world["log"]) if c["argv"][1:2] == ["load"]][-1]
    assert load["layer_members"] == 1  # only the new layer's file was in the stream
    state = json.loads((ship_world["tmp"] / "w1/.engine.json").read_text())
    assert state["names"][built["name"]] == built["config_digest"]
    # The store does not hold the whole image, so it records no layout for it.
    assert not (ship_world["tmp"] / "w1/.local/share/sparkstack/images" / built["config_digest"].split(":")[1]).exists()


def test_corrupt_blobs_on_the_host_are_found_and_sent_again(ship_world):
    img = ship_world["tmp"] / "img"
    built = build(ship_world, img)
    ship(ship_world, "w1", "--image", img, check=0)
    _, blobs = entry_for_copy(ship_world["head"] / HUB, MODEL)
    victim = max(blobs, key=lambda b: b.size)
    path = host_blob(ship_world, "w1", MODEL, victim.name)
    st = path.stat()  # as the host's verified record saw it
    with open(path, "r+b") as f:  # a bit flipped in place; the mtime even put back: the ctime still tells
        f.seek(10)
        byte = f.read(1)
        f.seek(10)
        f.write(bytes([byte[0] ^ 1]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    # The image: a store blob damaged, and docker no longer holding the image.
    layer = max(layout_sizes(img).items(), key=lambda kv: kv[1])[0]
    store_blob = ship_world["tmp"] / "w1/.local/share/sparkstack/blobs/sha256" / layer.split(":")[1]
    store_blob.write_bytes(b"x" * store_blob.stat().st_size)
    (ship_world["tmp"] / "w1/.engine.json").unlink()
    out = result(ship(ship_world, "w1", "--image", img, "--json", check=0))["w1"]
    model = next(p for p in out["weights"] if p["entry"] == MODEL)
    assert model["blobs_sent"] == 1 and model["bytes_sent"] == victim.size
    assert path.read_bytes() == victim.path.read_bytes()
    assert out["image"]["blobs_sent"] == 1 and out["image"]["bytes_sent"] == layout_sizes(img)[layer]
    assert out["image"]["loaded"]
    assert json.loads((ship_world["tmp"] / "w1/.engine.json").read_text())["names"][built["name"]] == built["config_digest"]


def test_a_partial_resumes_from_its_verified_prefix_and_a_wrong_one_starts_over(ship_world):
    _, blobs = entry_for_copy(ship_world["head"] / HUB, MODEL)
    victim = max(blobs, key=lambda b: b.size)
    data = victim.path.read_bytes()
    dest = host_blob(ship_world, "w1", MODEL, victim.name)
    dest.parent.mkdir(parents=True)
    partial = dest.with_name(f".{victim.name}.sparkstack-partial")
    half = len(data) // 2
    partial.write_bytes(data[:half])
    out = result(ship(ship_world, "w1", "--no-image", "--model", MODEL, "--json", check=0))["w1"]
    (part,) = out["weights"]
    assert part["bytes_resumed"] == half
    assert part["bytes_sent"] == sum(b.size for b in blobs) - half
    assert dest.read_bytes() == data and not partial.exists()
    # A partial of the right length but the wrong bytes is never trusted by its size.
    dest.unlink()
    partial.write_bytes(b"\0" * half)
    out = result(ship(ship_world, "w1", "--no-image", "--model", MODEL, "--json", check=0))["w1"]
    (part,) = out["weights"]
    assert part["bytes_resumed"] == 0 and part["bytes_sent"] == victim.size and part["blobs_sent"] == 1
    assert dest.read_bytes() == data


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)],
                         ids=["ctrl-c", "term", "hup"])
def test_a_stop_signal_stops_ship_and_its_ssh_too(ship_world, sig, code):
    """A host that never answers holds ship in its probe. Ctrl-C reaches ship and its ssh (the terminal signals the
    whole group); `kill` and a hangup reach ship alone, and ship passes them on: no ssh is left behind."""
    pidfile = ship_world["tmp"] / "ssh.pid"
    targets = json.loads(ship_world["env"]["FAKE_TARGETS"])
    targets["w1"]["stall"] = str(pidfile)
    env = dict(ship_world["env"], FAKE_TARGETS=json.dumps(targets))
    proc = start(sparkstack_cmd() + ["ship", "w1", "--no-image", "--model", MODEL], env=env, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for("ship's ssh started", lambda: pidfile.exists() or proc.poll() is not None)
        ssh = pidfile.read_text()
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # Ctrl-C: the foreground group
        else:
            proc.send_signal(sig)  # `kill PID`: ship alone
        err = proc.communicate(timeout=60)[1]
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert "Traceback" not in err and err.splitlines()[-1].startswith("sparkstack: interrupted")
    wait_for("ship's ssh gone", lambda: gone(ssh))


def _count_wire_bytes(ship_world, *hosts) -> None:
    targets = json.loads(ship_world["env"]["FAKE_TARGETS"])
    for host in hosts:
        targets[host]["count_stdin"] = True
    ship_world["env"]["FAKE_TARGETS"] = json.dumps(targets)


def _wire_bytes(log: Path, host: str) -> int:
    """Every byte the head wrote into ssh towards `host`: helper, frames and payload, over every attempt."""
    return sum(c["stdin_bytes"] for c in shipfix.calls(log) if c.get("target") == host)


def test_a_partial_with_a_corrupt_prefix_is_restarted_at_once_and_counted_not_sent_twice(ship_world):
    """The host's partial has the right length but a flipped first byte. The head must see that from the
    prefix hash and send the blob from byte 0 once: resuming on top of it would only be caught by the final
    hash, and the blob would cross a second time. Judged on what crossed the wire, not on the last attempt."""
    _count_wire_bytes(ship_world, "w1", "w2")
    _, blobs = entry_for_copy(ship_world["head"] / HUB, MODEL)
    victim = max(blobs, key=lambda b: b.size)
    data = victim.path.read_bytes()
    half = len(data) // 2
    dest = host_blob(ship_world, "w1", MODEL, victim.name)
    dest.parent.mkdir(parents=True)
    partial = dest.with_name(f".{victim.name}.sparkstack-partial")
    partial.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:half])
    args = ("--no-image", "--model", MODEL, "--streams", "1", "--json")
    clean = result(ship(ship_world, "w2", *args, check=0))["w2"]  # the same ship to a host that holds nothing
    out = result(ship(ship_world, "w1", *args, check=0))["w1"]
    total = sum(b.size for b in blobs)
    (part,), (clean_part,) = out["weights"], clean["weights"]
    assert clean_part["bytes_sent"] == total and clean_part["partials_restarted"] == 0
    assert part["partials_restarted"] == 1 and part["bytes_resumed"] == 0
    assert part["bytes_sent"] == total and part["blobs_sent"] == len(blobs)
    assert _wire_bytes(ship_world["log"], "w2") > total
    assert _wire_bytes(ship_world["log"], "w1") == _wire_bytes(ship_world["log"], "w2")  # byte for byte: nothing crossed twice
    assert dest.read_bytes() == data and not partial.exists()


@pytest.mark.parametrize("case", ["same-revision", "new-revision"])
def test_a_finish_killed_before_any_step_never_leaves_refs_main_without_a_whole_snapshot(ship_world, tmp_path, case):
    """finish rebuilds a host's snapshot and points refs/main at it. Killed before each of its changes in turn
    (checks/killfix.py), the host's loader finds the old snapshot or the new one, whole, never none.
    same-revision: the host holds the revision with one stale link more, and refs/main names it throughout.
    new-revision: the host's refs/main names an older commit, whose snapshot must stay readable until the ref moves."""
    ship(ship_world, "w1", "--no-image", "--model", MODEL, check=0)
    hub = ship_world["tmp"] / "w1" / HUB
    (entry,) = local.entries_to_ship(ship_world["head"] / HUB, (MODEL,))
    repo_id = hfcache.repo_id_from_folder(MODEL)
    snap = hub / entry.layout.snapshot_dir
    new = {f: (ship_world["head"] / HUB / entry.layout.snapshot_dir / f).read_bytes() for f, _, _ in entry.layout.links}
    if case == "same-revision":
        rel, _blob, target = entry.layout.links[0]
        os.symlink(target, snap / "stale.json")  # same dir depth as links[0]: a good link to a blob the host has
        allowed = {entry.layout.revision: [dict(new, **{"stale.json": new[rel]}), new]}
    else:
        older = "e" * 40
        os.rename(snap, snap.with_name(older))
        (hub / entry.layout.ref_file).write_text(older)
        allowed = {older: [new], entry.layout.revision: [new]}
    doc = {**entry.layout.to_json(), "blobs": [b.wire() for b in entry.blobs]}

    def view(at: Path) -> tuple[str, dict[str, bytes]]:
        return loader_view(at, repo_id)

    def finish(copy: Path):
        def run():
            os.environ["XDG_DATA_HOME"] = str(copy / "data")  # the helper's verified records: not this HOME
            return helper.finish_entry(str(copy / "hub"), doc)
        return run

    assert view(hub)[1] in allowed[view(hub)[0]]
    full = tmp_path / "full"
    shutil.copytree(hub, full / "hub", symlinks=True)
    steps = run_killed_before(-1, finish(full))
    assert steps is not None and steps >= 3
    assert view(full / "hub") == (entry.layout.revision, new)  # run through: the head's snapshot, at main
    for step in range(steps):
        copy = tmp_path / f"killed-{step}"
        shutil.copytree(hub, copy / "hub", symlinks=True)
        assert run_killed_before(step, finish(copy)) is None
        try:
            ref, seen = view(copy / "hub")
        except AssertionError as exc:
            raise AssertionError(f"killed before step {step}: {exc}") from None
        assert seen in allowed.get(ref, []), f"killed before step {step}: refs/main {ref[:8]}, files {sorted(seen)}"


def test_a_partial_longer_than_its_blob_is_started_over_never_kept(ship_world):
    """A partial holding the whole blob and more (a blob that shrank upstream, a stray write): its first `size`
    bytes hash right, but the file is not the blob. It is sent from byte 0, and the host ends with exactly the blob."""
    _, blobs = entry_for_copy(ship_world["head"] / HUB, MODEL)
    victim = max(blobs, key=lambda b: b.size)
    data = victim.path.read_bytes()
    dest = host_blob(ship_world, "w1", MODEL, victim.name)
    dest.parent.mkdir(parents=True)
    partial = dest.with_name(f".{victim.name}.sparkstack-partial")
    partial.write_bytes(data + b"left over")
    out = result(ship(ship_world, "w1", "--no-image", "--model", MODEL, "--json", check=0))["w1"]
    (part,) = out["weights"]
    assert part["bytes_resumed"] == 0 and part["bytes_sent"] == sum(b.size for b in blobs)
    assert dest.read_bytes() == data and not partial.exists()


def test_hosts_ship_at_once_and_one_failing_host_leaves_the_others_done(ship_world):
    img = ship_world["tmp"] / "img"
    build(ship_world, img)
    proc = ship(ship_world, "w1", "w2", "badkey", "--image", img, "--json", "--streams", "2")
    assert proc.returncode == 1
    out = result(proc)
    assert out["w1"]["error"] is None and out["w2"]["error"] is None
    assert out["w1"]["image"]["bytes_sent"] == out["w2"]["image"]["bytes_sent"] > 0
    assert out["badkey"]["error"] == "Host key verification failed."
    assert proc.stderr.strip().splitlines() == ["sparkstack: error: badkey: Host key verification failed."]


def test_a_host_without_docker_gets_one_line_and_nothing_is_sent(ship_world):
    img = ship_world["tmp"] / "img"
    build(ship_world, img)
    proc = ship(ship_world, "nodocker", "--image", img)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "sparkstack: error: nodocker: docker is not installed (no docker on PATH); the image cannot be loaded there"]
    assert not (ship_world["tmp"] / "nodocker/.local/share/sparkstack/blobs").exists()
    # Weights need no docker.
    ship(ship_world, "nodocker", "--no-image", check=0)


def test_dry_run_lists_what_would_go_and_changes_nothing_on_the_host(ship_world):
    img = ship_world["tmp"] / "img"
    build(ship_world, img)
    _, blobs = entry_for_copy(ship_world["head"] / HUB, DRAFT)
    dest = host_blob(ship_world, "w1", DRAFT, blobs[0].name)
    dest.parent.mkdir(parents=True)
    dest.write_bytes(blobs[0].path.read_bytes())
    before = sorted(p for p in (ship_world["tmp"] / "w1").rglob("*"))
    doc = json.loads(ship(ship_world, "w1", "--image", img, "--dry-run", "--json", check=0).stdout)
    assert sorted(p for p in (ship_world["tmp"] / "w1").rglob("*")) == before
    assert not (ship_world["head"] / ".local").exists()  # nor on the head (its store is written only for real)
    (host,) = doc["hosts"]
    draft = next(e for e in host["weights"] if e["entry"] == DRAFT)
    assert draft["blobs_present"] == 1 and draft["present"] == [{"key": f"{DRAFT}/{blobs[0].name}", "size": blobs[0].size}]
    assert draft["blobs_to_send"] == len(blobs) - 1
    assert host["image"]["blobs_to_send"] == len(layout_sizes(img)) and not host["image"]["already_loaded"]
    assert host["bytes_to_send"] == sum(layout_sizes(img).values()) + sum(
        e["bytes_to_send"] for e in host["weights"])
    loads = [c for c in shipfix.calls(ship_world["log"]) if c["argv"][0] == "docker" and "load" in c["argv"]]
    assert loads == []


def test_image_by_config_digest_or_name_from_the_heads_store(ship_world):
    img = ship_world["tmp"] / "img"
    built = build(ship_world, img)
    ship(ship_world, "w1", "--image", img, "--no-weights", check=0)  # also records the image in the head's store
    out = result(ship(ship_world, "w2", "--image", built["config_digest"], "--no-weights", "--json", check=0))["w2"]
    assert out["image"]["loaded"] and out["image"]["config_digest"] == built["config_digest"]
    env = dict(ship_world["env"], IMAGE=built["name"])  # what launch would run, found by its name
    proc = subprocess.run(sparkstack_cmd() + ["ship", "w2", "--no-weights", "--json"], capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    assert result(proc)["w2"]["image"]["already_loaded"]


def test_the_helper_never_links_outside_its_entry(ship_world, tmp_path):
    hub = tmp_path / "w1" / HUB
    (hub / "models--a--b/blobs").mkdir(parents=True)
    blob = "0" * 40
    entry = {"name": "models--a--b", "revision": "1" * 40, "blobs_dir": "models--a--b/blobs",
             "snapshot": "models--a--b/snapshots/" + "1" * 40, "ref": "models--a--b/refs/main",
             "lock": ".locks/models--a--b/x.lock", "blobs": [], "links": [["config.json", blob, "../../../../../etc/passwd"]]}
    req = {"protocol": wire.PROTOCOL, "op": "finish", "hub": str(hub), "entries": [entry]}
    proc = subprocess.run([sys.executable, "-c", wire.BOOT], input=b"%d\n" % len(wire.helper_payload())
                          + wire.helper_payload() + json.dumps(req).encode() + b"\n", capture_output=True,
                          env=dict(os.environ, HOME=str(tmp_path / "w1")))
    assert proc.returncode == 1
    reply = json.loads(proc.stdout)
    assert reply["ok"] is False and "does not point at blob" in reply["error"]
    assert not (hub / "models--a--b/snapshots" / ("1" * 40)).exists()
    bad = dict(entry, links=[], snapshot="../../escape")
    proc = subprocess.run([sys.executable, "-c", wire.BOOT], input=b"%d\n" % len(wire.helper_payload())
                          + wire.helper_payload() + json.dumps(dict(req, entries=[bad])).encode() + b"\n",
                          capture_output=True, env=dict(os.environ, HOME=str(tmp_path / "w1")))
    assert json.loads(proc.stdout)["error"].startswith("bad relative path")


def test_ssh_argv_for_bulk_transfer_on_the_fabric_keeps_the_host_key():
    r = Runner(ssh="me@spark-2", bulk=True).via("10.0.0.2", "192.168.1.20")
    argv = r.argv(["python3", "-c", wire.BOOT])
    i = argv.index("me@spark-2")
    opts = argv[:i]
    for opt in ("StrictHostKeyChecking=yes", "BatchMode=yes", "Compression=no", "HostName=10.0.0.2",
                "HostKeyAlias=192.168.1.20", "Ciphers=^aes128-gcm@openssh.com,aes256-gcm@openssh.com"):
        assert opt in opts
    assert argv[i + 1:] == ["--", "python3 -c " + __import__("shlex").quote(wire.BOOT)]


def _blob(key: str, size: int, area: str = "hub") -> P.Blob:
    return P.Blob(key, area, "d", key.split("/")[-1], "sha256", "0" * 64, size)


def test_the_plan_counts_what_a_host_has_before_checking_room():
    from sparkstack.hfcache import EntryLayout

    layout = EntryLayout("models--a--b", "1" * 40, "b", "s", "r", "l", ())
    entry = P.EntryToShip(layout, (_blob("e/x", 600), _blob("e/y", 500), _blob("e/z", 400)))
    target = P.Target("w", Runner(ssh="w"), "mgmt", "~/.cache/huggingface/hub", None)

    def inv(states: dict, free: int) -> P.Inventory:
        return P.Inventory({k: P.BlobState(*v) for k, v in states.items()}, None, False, False, 0, {},
                           {"hub": P.Room(free, 1, "/home/u/.cache/huggingface/hub"), "store": P.Room(free, 1, "/x")},
                           {}, "3.11")

    # 1500 bytes in all; the host has x whole and 300 bytes of y: 200 + 400 must still be written.
    ok = P.plan_host(target, None, (entry,), inv({"e/x": ("present",), "e/y": ("partial", 300)}, 600))
    assert ok.error is None and ok.room == (("/home/u/.cache/huggingface/hub", 600, 600),)
    assert [b.key for b in ok.send] == ["e/y", "e/z"] and ok.bytes_to_send == 900
    short = P.plan_host(target, None, (entry,), inv({"e/x": ("present",), "e/y": ("partial", 300)}, 599))
    assert short.error.startswith("not enough room on /home/u/.cache/huggingface/hub: 600 B must be written but "
                                  "599 B is free (600 B already there was not counted)")
    assert P.plan_host(target, None, (entry,), "ssh: connect to host w port 22: Connection refused").error.startswith("ssh")


def test_a_head_blob_that_does_not_match_its_name_is_never_shipped(ship_world):
    _, blobs = entry_for_copy(ship_world["head"] / HUB, DRAFT)
    bad = next(b for b in blobs if b.algorithm == "git-sha1")  # the git sha1 rule is checked, not only sha256
    data = bad.path.read_bytes()
    bad.path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    proc = ship(ship_world, "w1", "--no-image", "--model", DRAFT)
    assert proc.returncode == 1
    (line,) = proc.stderr.splitlines()
    assert line == (f"sparkstack: error: w1: the head's copy of {DRAFT}/{bad.name} ({bad.path}) does not match its "
                    "name; not shipped")
    assert not host_blob(ship_world, "w1", DRAFT, bad.name).exists()
    assert not (ship_world["tmp"] / "w1" / HUB / DRAFT / "snapshots").exists()  # no snapshot over a missing blob
