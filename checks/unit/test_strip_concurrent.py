"""Strips of one destination at the same time: one writes, the others wait and then find it up to date."""

import fcntl
import os
import select
import subprocess
import time

from safetensors.torch import load_file

import synth
from clirun import sparkstack_cmd

RUNS = 6
MAIN_KEYS = {s.name for specs in synth.DEFAULT_SHARDS.values() for s in specs if not s.mtp}


def _check_output(snap):
    loaded = {}
    for shard in sorted(snap.glob("*.safetensors")):
        loaded.update(load_file(str(shard)))
    assert set(loaded) == MAIN_KEYS


def _leftovers(hub):
    return sorted(p.name for p in hub.iterdir() if p.name.startswith("."))


def test_parallel_strips_of_one_destination_all_succeed(tmp_path):
    flat = tmp_path / "flat"
    synth.write_model_dir(flat)
    entry = synth.cache_from_dir(flat, tmp_path / "hub")
    before = synth.tree_digest(entry)
    procs = [subprocess.Popen(sparkstack_cmd() + ["strip", str(entry)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(RUNS)]
    results = [(p.wait(timeout=120), p.stdout.read(), p.stderr.read()) for p in procs]
    for code, out, err in results:
        assert code == 0, err
        assert "Traceback" not in err and "error" not in err, err
    wrote = [out for _, out, _ in results if out.startswith("wrote ")]
    assert len(wrote) == 1, [out for _, out, _ in results]  # the rest found the first one's output up to date
    assert sum(out.startswith("up to date: ") for _, out, _ in results) == RUNS - 1

    dest = entry.with_name(entry.name + "-no-MTP")
    _check_output(dest / "snapshots" / synth.REVISION)
    assert synth.tree_digest(entry) == before
    assert _leftovers(tmp_path / "hub") == []  # no staging dir, no lock file


def test_second_strip_waits_for_the_first_and_says_so(tmp_path):
    flat = tmp_path / "flat"
    synth.write_model_dir(flat)
    entry = synth.cache_from_dir(flat, tmp_path / "hub")
    dest = entry.with_name(entry.name + "-no-MTP")
    # Stand in for a running strip: hold the lock beside the destination, as the design names it.
    lock = tmp_path / "hub" / f".{dest.name}.sparkstack-lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, f"{os.getpid()}\n".encode())
    proc = subprocess.Popen(sparkstack_cmd() + ["strip", str(entry)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 60
        line = ""
        while time.monotonic() < deadline and not line:
            ready, _, _ = select.select([proc.stderr], [], [], deadline - time.monotonic())
            if ready:
                line = proc.stderr.readline()
                if line == "":
                    break  # the process ended without waiting
        assert "waiting" in line and str(dest) in line and f"pid {os.getpid()}" in line, line
        time.sleep(0.3)
        assert proc.poll() is None and not dest.exists()  # it really waits, having written nothing
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    assert proc.stdout.read().startswith("wrote ")
    assert proc.stderr.read() == ""  # the waiting line was the only one
    _check_output(dest / "snapshots" / synth.REVISION)
    assert not lock.exists()
