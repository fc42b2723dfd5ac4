"""SIGKILL in the middle of a rewrite: the destination is absent or the previous complete version."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import synth
from clirun import start

MIB = 1 << 20
MIXED = "model-00002-of-00002.safetensors"


def _write_big_model(flat: Path, fill: bytes) -> None:
    flat.mkdir(parents=True)
    synth.write_raw_shard(flat / "model-00001-of-00002.safetensors", [("model.layers.0.w", 4 * MIB)], fill)
    mixed = [("model.layers.1.w", 96 * MIB), ("model.layers.2.eh_proj", 32 * MIB), ("model.norm.weight", 96 * MIB)]
    synth.write_raw_shard(flat / MIXED, mixed, fill)
    wm = {"model.layers.0.w": "model-00001-of-00002.safetensors", **{n: MIXED for n, _ in mixed}}
    (flat / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    (flat / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))


def _kill_mid_rewrite(entry: Path, sig: int = signal.SIGKILL) -> tuple[int, str]:
    """Start strip, send `sig` in the middle of a shard's rewrite; its exit code and stderr."""
    cmd = [sys.executable, "-m", "sparkstack.cli", "strip", str(entry)]
    proc = start(cmd, env=dict(os.environ, SPARKSTACK_COPY_METHOD="readwrite"),
                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            partial = [p for p in entry.parent.glob(".sparkstack-*/blobs/.*.partial") if p.stat().st_size > 8 * MIB]
            if partial:
                proc.send_signal(sig)
                err = proc.communicate(timeout=60)[1]
                return proc.returncode, err
            if proc.poll() is not None:
                pytest.fail("strip finished before it could be killed mid-rewrite")
            time.sleep(0.001)
        pytest.fail("never saw a partial rewrite")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_kill_during_first_rewrite_leaves_no_destination(tmp_path, run_cli):
    flat = tmp_path / "flat"
    _write_big_model(flat, os.urandom(MIB))
    entry = synth.cache_from_dir(flat, tmp_path / "hub")
    src_before = synth.tree_digest(entry)
    dest = entry.with_name(entry.name + "-no-MTP")

    _kill_mid_rewrite(entry)
    assert not dest.exists()
    assert synth.tree_digest(entry) == src_before

    run_cli("strip", entry, check=0)
    assert (dest / "refs" / "main").read_text() == synth.REVISION
    assert synth.tree_digest(entry) == src_before
    # The killed run's staging dir is cleaned up by the next run.
    assert not list(entry.parent.glob(".sparkstack-*"))


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)], ids=["term", "hup"])
def test_a_stop_signal_mid_rewrite_ends_strip_as_ctrl_c_does(tmp_path, run_cli, sig, code):
    """`kill` or a hangup: one line, exit 128 + the signal's number, no destination, the source untouched."""
    flat = tmp_path / "flat"
    _write_big_model(flat, os.urandom(MIB))
    entry = synth.cache_from_dir(flat, tmp_path / "hub")
    src_before = synth.tree_digest(entry)

    returncode, err = _kill_mid_rewrite(entry, sig)
    assert returncode == code, err
    assert err.splitlines()[-1] == (f"sparkstack: interrupted by {signal.Signals(sig).name} "
                                    "(outputs are published atomically: nothing half-written)")
    assert "Traceback" not in err
    assert not entry.with_name(entry.name + "-no-MTP").exists()
    assert synth.tree_digest(entry) == src_before


def test_kill_while_updating_keeps_previous_version(tmp_path, run_cli):
    flat = tmp_path / "flat"
    _write_big_model(flat, os.urandom(MIB))
    entry = synth.cache_from_dir(flat, tmp_path / "hub")
    run_cli("strip", entry, check=0)
    dest = entry.with_name(entry.name + "-no-MTP")
    previous = synth.tree_digest(dest)

    flat2 = tmp_path / "flat2"
    _write_big_model(flat2, os.urandom(MIB))
    synth.cache_from_dir(flat2, entry.parent, revision="e" * 40)
    src_before = synth.tree_digest(entry)

    _kill_mid_rewrite(entry)
    assert synth.tree_digest(dest) == previous
    assert synth.tree_digest(entry) == src_before

    proc = run_cli("strip", entry, check=0)
    assert "up to date" not in proc.stdout
    assert (dest / "refs" / "main").read_text() == "e" * 40
    from safetensors import safe_open
    with safe_open(str(dest / "snapshots" / ("e" * 40) / MIXED), "pt") as f:
        assert set(f.keys()) == {"model.layers.1.w", "model.norm.weight"}
