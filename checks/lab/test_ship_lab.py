"""`sparkstack ship` across the lab: real sshd (on the fabric address, same host key), real dockerd, workers
that are machines of their own (a private tmpfs HOME each), wire bytes read from the veth counters.

Each claim is checked on the worker itself: its docker's image ID, its files (through its own mount
namespace), huggingface_hub's scanner over its hub; never only from what sparkstack reports.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from huggingface_hub import scan_cache_dir

import shiplab
from lab import FABRIC_IF, MGMT_IF, machine_processes, veth_bytes

REV_A, REV_B = "a" * 40, "b" * 40


@pytest.fixture(scope="module")
def ship_lab(lab, tmp_path_factory):
    """The lab plus a second worker (with docker) and a bare one (no docker, an 8 MiB HOME)."""
    work = tmp_path_factory.mktemp("ship")
    lab.add_worker("worker2")
    lab.add_worker("bare", docker=False, home_mib=8)
    head_home = work / "head-home"
    hub = head_home / shiplab.HEAD_HUB
    hub.mkdir(parents=True)
    w = {"lab": lab, "work": work, "hub": hub, "env": shiplab.head_env(head_home),
         "recipe": shiplab.recipe(lab, work, ["worker", "worker2", "bare"])}
    w["base"] = shiplab.busybox_base(work / "base")
    with lab.worker.left_as_found():
        yield w
    for name in ("bare", "worker2"):
        lab.remove_worker(name)


def ship(w, *args, check=None):
    proc = shiplab.ship(w["lab"], w["env"], *args, "--recipe", w["recipe"], "--ssh-config", w["lab"].ssh_config)
    assert "Traceback" not in proc.stderr, proc.stderr
    if check is not None:
        assert proc.returncode == check, proc.stdout + proc.stderr
    return proc


def hosts(proc) -> dict:
    return {h["host"]: h for h in json.loads(proc.stdout)["hosts"]}


def worker_image_id(host, ref: str) -> str | None:
    proc = host.docker("image", "inspect", "--format", "{{.Id}}", ref, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def test_image_first_ship_then_a_one_file_rebuild_then_nothing(ship_lab):
    lab, work = ship_lab["lab"], ship_lab["work"]
    payload = os.urandom(1 << 20)
    a = shiplab.build_image(ship_lab["base"], work, work / "img-a", payload)
    fab0, mgmt0 = veth_bytes(lab.head, FABRIC_IF), veth_bytes(lab.head, MGMT_IF)
    out = hosts(ship(ship_lab, "worker", "--image", work / "img-a", "--no-weights", "--json", check=0))["worker"]
    sizes = shiplab.blob_sizes(work / "img-a")
    assert out["via"] == "fabric" and out["error"] is None
    assert out["image"]["blobs_sent"] == len(sizes) and out["image"]["bytes_sent"] == sum(sizes.values())
    assert out["image"]["loaded"] and worker_image_id(lab.worker, a["name"]) == a["config_digest"]
    # The bytes crossed the fabric (HostKeyAlias: the management key vouched for it); management stayed quiet.
    assert veth_bytes(lab.head, FABRIC_IF) - fab0 >= out["image"]["bytes_sent"]
    assert veth_bytes(lab.head, MGMT_IF) - mgmt0 < 64 << 10
    # The worker's docker runs it, and it holds the overlay file byte for byte.
    ran = lab.worker.docker("run", "--rm", "--network", "none", "--entrypoint", "/bin/busybox", a["name"],
                            "sha256sum", f"/{shiplab.fx.VLLM}/payload.bin")
    assert ran.stdout.split()[0] == hashlib.sha256(payload).hexdigest()

    changed = bytearray(payload)
    changed[12345] ^= 0xFF
    b = shiplab.build_image(ship_lab["base"], work, work / "img-b", bytes(changed))
    new = {d: s for d, s in shiplab.blob_sizes(work / "img-b").items() if d not in sizes}
    assert set(new) == {b["layer_digest"], b["config_digest"], b["manifest_digest"]}
    out = hosts(ship(ship_lab, "worker", "--image", work / "img-b", "--no-weights", "--json", check=0))["worker"]
    assert out["image"]["blobs_sent"] == 3 and out["image"]["bytes_sent"] == sum(new.values())
    assert out["image"]["blobs_present"] == 1  # the base layer, and nothing else, was already there
    assert worker_image_id(lab.worker, b["name"]) == b["config_digest"]

    # A worker whose store is gone but whose docker holds the base (as after a docker save | load): the real
    # dockerd loads an archive that leaves out the layer it holds; only the new layer, config, manifest go.
    shutil.rmtree(lab.worker.path("/root/.local"))
    changed[54321] ^= 0xFF
    b2 = shiplab.build_image(ship_lab["base"], work, work / "img-b2", bytes(changed))
    out = hosts(ship(ship_lab, "worker", "--image", work / "img-b2", "--no-weights", "--json", check=0))["worker"]
    assert out["image"]["blobs_sent"] == 3 and out["image"]["blobs_in_docker"] == 1 and out["image"]["loaded"]
    assert worker_image_id(lab.worker, b2["name"]) == b2["config_digest"]

    again = ship(ship_lab, "worker", "--image", work / "img-b", "--no-weights", "--json", check=0)
    out = hosts(again)["worker"]
    assert out["image"]["already_loaded"] and out["image"]["blobs_sent"] == 0 and out["image"]["bytes_sent"] == 0
    assert "up to date" in ship(ship_lab, "worker", "--image", work / "img-b", "--no-weights", check=0).stdout


def _partials(host, entry: Path) -> list[Path]:
    blobs = host.path(f"{shiplab.WORKER_HUB}/{entry.name}/blobs")
    return sorted(blobs.glob(".*.sparkstack-partial")) if blobs.is_dir() else []


def test_weights_land_as_a_hub_entry_and_a_corrupted_blob_is_found_and_resent(ship_lab):
    lab = ship_lab["lab"]
    entry = shiplab.write_entry(ship_lab["hub"], "lab/small", [3 << 20, 1 << 20], REV_A)
    out = hosts(ship(ship_lab, "worker", "--no-image", "--model", entry.name, "--json", check=0))["worker"]
    (part,) = out["weights"]
    blobs = sorted((entry / "blobs").iterdir())
    assert part["blobs_sent"] == len(blobs) and part["bytes_sent"] == sum(b.stat().st_size for b in blobs)
    hub = lab.worker.path(shiplab.WORKER_HUB)  # the worker's own HOME, seen through its mount namespace
    scan = scan_cache_dir(hub)
    assert scan.warnings == []
    (repo,) = [r for r in scan.repos if r.repo_id == "lab/small"]
    (rev,) = repo.revisions
    assert rev.commit_hash == REV_A and rev.refs == frozenset({"main"}) and len(rev.files) == 4
    assert all(f.file_path.is_symlink() for f in rev.files)
    # Flip a byte of the biggest shard on the worker: the next ship finds it by its hash and sends it again.
    shard = max(blobs, key=lambda b: b.stat().st_size)
    theirs = hub / entry.name / "blobs" / shard.name
    with open(theirs, "r+b") as f:
        f.seek(1000)
        f.write(b"\xff" if f.read(1) != b"\xff" else b"\x00")
    out = hosts(ship(ship_lab, "worker", "--no-image", "--model", entry.name, "--json", check=0))["worker"]
    (part,) = out["weights"]
    assert part["blobs_sent"] == 1 and part["bytes_sent"] == shard.stat().st_size
    assert hashlib.sha256(theirs.read_bytes()).hexdigest() == shard.name
    # An unchanged entry: nothing goes.
    (part,) = hosts(ship(ship_lab, "worker", "--no-image", "--model", entry.name, "--json", check=0))["worker"]["weights"]
    assert part["blobs_sent"] == 0 and part["bytes_sent"] == 0 and part["snapshot"] == "up to date"


def test_a_corrupted_image_blob_in_the_workers_store_is_resent(ship_lab):
    lab, work = ship_lab["lab"], ship_lab["work"]
    c = shiplab.build_image(ship_lab["base"], work, work / "img-c", os.urandom(1 << 20))
    ship(ship_lab, "worker", "--image", work / "img-c", "--no-weights", check=0)
    lab.worker.docker("rmi", c["name"])
    store_blob = lab.worker.path(f"/root/.local/share/sparkstack/blobs/sha256/{c['layer_digest'].split(':')[1]}")
    store_blob.write_bytes(b"\0" * store_blob.stat().st_size)
    out = hosts(ship(ship_lab, "worker", "--image", work / "img-c", "--no-weights", "--json", check=0))["worker"]
    assert out["image"]["blobs_sent"] == 1
    assert out["image"]["bytes_sent"] == shiplab.blob_sizes(work / "img-c")[c["layer_digest"]]
    assert out["image"]["loaded"] and worker_image_id(lab.worker, c["name"]) == c["config_digest"]


def test_a_ship_killed_mid_transfer_resumes_without_resending_what_was_verified(ship_lab):
    lab = ship_lab["lab"]
    entry = shiplab.write_entry(ship_lab["hub"], "lab/big", [96 << 20, 96 << 20], REV_A)
    total = sum(b.stat().st_size for b in (entry / "blobs").iterdir())
    proc = shiplab.ship_popen(lab, ship_lab["env"], "worker", "--no-image", "--model", entry.name, "--streams", "1",
                              "--recipe", ship_lab["recipe"], "--ssh-config", lab.ssh_config)
    deadline = time.monotonic() + 60
    try:
        while True:  # kill it once a blob is partly there
            parts = _partials(lab.worker, entry)
            if any(p.stat().st_size >= 16 << 20 for p in parts if p.exists()):
                break
            assert proc.poll() is None, "the ship ended before it could be killed: " + proc.communicate()[1]
            assert time.monotonic() < deadline
            time.sleep(0.005)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    # ssh sees its stdin close, the helper its EOF, and exits; the partial stays. Wait for that exit (on a loaded
    # machine a fixed pause was sometimes shorter, and the resumed ship then met a partial still growing).
    deadline = time.monotonic() + 60
    while machine_processes(lab.worker, b"sparkstack-ship-helper"):
        assert time.monotonic() < deadline, "the killed ship's helper never exited on the worker"
        time.sleep(0.05)
    left = [p for p in _partials(lab.worker, entry)]
    assert left and all(0 < p.stat().st_size < 96 << 20 for p in left)
    prefix = sum(p.stat().st_size for p in left)
    out = hosts(ship(ship_lab, "worker", "--no-image", "--model", entry.name, "--json", check=0))["worker"]
    (part,) = out["weights"]
    assert part["bytes_resumed"] == prefix  # the verified prefix was not sent again...
    assert part["bytes_sent"] <= total - prefix  # ...nor was any blob finished before the kill
    assert _partials(lab.worker, entry) == []
    hub = lab.worker.path(shiplab.WORKER_HUB)
    for blob in (entry / "blobs").iterdir():
        assert (hub / entry.name / "blobs" / blob.name).read_bytes() == blob.read_bytes()
    (repo,) = [r for r in scan_cache_dir(hub).repos if r.repo_id == "lab/big"]
    assert repo.revisions and not scan_cache_dir(hub).warnings


def test_no_docker_a_full_disk_and_a_wrong_host_key_each_give_one_line(ship_lab):
    lab, work = ship_lab["lab"], ship_lab["work"]
    if not (work / "img-a").exists():
        shiplab.build_image(ship_lab["base"], work, work / "img-a", os.urandom(1 << 20))
    proc = ship(ship_lab, "bare", "--image", work / "img-a", "--no-weights", check=1)
    assert proc.stderr.splitlines() == [
        "sparkstack: error: bare: docker is not installed (no docker on PATH); the image cannot be loaded there"]
    entry = shiplab.write_entry(ship_lab["hub"], "lab/toobig", [12 << 20], REV_B)
    proc = ship(ship_lab, "bare", "--no-image", "--model", entry.name, check=1)
    (line,) = proc.stderr.splitlines()
    assert line.startswith("sparkstack: error: bare: not enough room on /root") and "12.0 MiB must be written" in line
    assert not lab.hosts["bare"].path(f"{shiplab.WORKER_HUB}/{entry.name}").exists()  # nothing was sent
    # A known_hosts that holds another key for the worker.
    d = lab.ssh_dir
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / "other_key")], check=True)
    pub = (work / "other_key.pub").read_text().split()
    (work / "wrong_known_hosts").write_text(f"{lab.worker.mgmt_ip} {pub[0]} {pub[1]}\n")
    bad = work / "bad_ssh_config"
    bad.write_text(lab.ssh_config.read_text().replace(str(d / "known_hosts"), str(work / "wrong_known_hosts")))
    proc = shiplab.ship(lab, ship_lab["env"], "worker", "--no-image", "--model", entry.name, "--recipe", ship_lab["recipe"],
                        "--ssh-config", bad)
    assert proc.returncode == 1 and proc.stderr.splitlines() == [
        "sparkstack: error: worker: Host key verification failed."]


def test_two_workers_at_once(ship_lab):
    lab, work = ship_lab["lab"], ship_lab["work"]
    d = shiplab.build_image(ship_lab["base"], work, work / "img-d", os.urandom(4 << 20))
    entry = shiplab.write_entry(ship_lab["hub"], "lab/pair", [8 << 20, 8 << 20, 2 << 20], REV_A)
    proc = ship(ship_lab, "worker", "worker2", "--image", work / "img-d", "--model", entry.name, "--json", check=0)
    out = hosts(proc)
    for name in ("worker", "worker2"):
        assert out[name]["error"] is None and out[name]["via"] == "fabric"
        assert worker_image_id(lab.hosts[name], d["name"]) == d["config_digest"]
        (part,) = out[name]["weights"]
        assert part["bytes_sent"] == sum(b.stat().st_size for b in (entry / "blobs").iterdir())
        scan = scan_cache_dir(lab.hosts[name].path(shiplab.WORKER_HUB))
        assert "lab/pair" in {r.repo_id for r in scan.repos} and not scan.warnings
    # Both ran at once: each started before the other finished.
    a, b = out["worker"], out["worker2"]
    assert a["started_s"] < b["started_s"] + b["seconds"] and b["started_s"] < a["started_s"] + a["seconds"]
    # Each worker's bytes went over its own fabric link.
    assert veth_bytes(lab.head, lab.hosts["worker2"].head_fabric_if) >= part["bytes_sent"]
