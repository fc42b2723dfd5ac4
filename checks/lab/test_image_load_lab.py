"""`image load` into real engines: a private dockerd, podman, and the lab worker's dockerd over ssh.

Each check of the image ID asks the engine itself (docker/podman image inspect), not sparkstack.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import imagefix as fx
from conftest import require


def _build(tmp_path: Path, run_cli, *extra: str) -> tuple[Path, dict]:
    """A fresh fixture image (random filler, so a new config digest every time) as an OCI layout dir."""
    base = tmp_path / "base"
    fx.write_base(base, arch="amd64")
    src = fx.write_overlay_source(tmp_path / "src")
    overlay = fx.write_overlay(tmp_path / "overlay", pinned_from=src / "overlay-dflash2")
    out = tmp_path / "image"
    proc = run_cli("image", "build", "--base", base, "--overlay", overlay, "--overlay-src", src, "--out", out,
                   "--platform", "linux/amd64", "--json", *extra, env={"SPARKSTACK_CACHE_DIR": str(tmp_path / "cache")},
                   check=0)
    return out, json.loads(proc.stdout)["result"]


def test_load_into_dockerd_then_up_to_date(tmp_path, run_cli, dockerd):
    out, built = _build(tmp_path, run_cli)
    t0 = time.monotonic()
    proc = run_cli("image", "load", out, "--docker-host", dockerd.host, "--json", check=0)
    print(f"\nimage load of a {sum(p.stat().st_size for p in (out / 'blobs/sha256').iterdir())} B fixture: "
          f"{time.monotonic() - t0:.2f} s")
    doc = json.loads(proc.stdout)
    assert doc["plan"]["action"] == "load" and doc["plan"]["name"] == built["name"]
    assert dockerd.run("image", "inspect", "--format", "{{.Id}}", built["name"]).stdout.strip() == built["config_digest"]
    again = run_cli("image", "load", out, "--docker-host", dockerd.host, check=0)
    assert again.stdout.startswith("up to date"), again.stdout
    # The ID without the tag: only a tag is added, nothing is streamed.
    dockerd.run("tag", built["name"], "keep/this:one")
    dockerd.run("rmi", built["name"])
    tagged = json.loads(run_cli("image", "load", out, "--docker-host", dockerd.host, "--json", check=0).stdout)
    assert tagged["plan"]["action"] == "tag" and tagged["result"]["bytes_sent"] == 0
    assert dockerd.run("image", "inspect", "--format", "{{.Id}}", built["name"]).stdout.strip() == built["config_digest"]


def test_symlinked_output_loads_into_dockerd(tmp_path, run_cli, dockerd):
    out, built = _build(tmp_path, run_cli, "--link-base", "symlink")
    assert any(p.is_symlink() for p in (out / "blobs/sha256").iterdir())
    run_cli("image", "load", out, "--docker-host", dockerd.host, check=0)
    assert dockerd.run("image", "inspect", "--format", "{{.Id}}", built["name"]).stdout.strip() == built["config_digest"]


@pytest.fixture
def podman_env():
    require("podman")
    store = Path(tempfile.mkdtemp(prefix="pm-", dir="/tmp"))  # podman wants a runroot under 50 characters
    (store / "storage.conf").write_text(f'[storage]\ndriver = "vfs"\ngraphroot = "{store}/root"\nrunroot = "{store}/run"\n')
    hard = subprocess.run(["sh", "-c", "ulimit -Hn"], capture_output=True, text=True).stdout.strip()
    (store / "containers.conf").write_text(
        f'[containers]\ndefault_ulimits = ["nofile={hard}:{hard}", "nproc=32768:32768"]\n'
        '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n')
    env = {"CONTAINERS_STORAGE_CONF": str(store / "storage.conf"), "CONTAINERS_CONF": str(store / "containers.conf")}
    yield env
    subprocess.run(["rm", "-rf", str(store)])  # vfs: plain dirs, no mounts to undo


def test_load_into_podman_then_up_to_date(tmp_path, run_cli, podman_env):
    out, built = _build(tmp_path, run_cli)
    run_cli("image", "load", out, "--engine", "podman", env=podman_env, check=0)
    p = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", built["name"]], capture_output=True,
                       text=True, env=dict(os.environ, **podman_env))
    assert p.returncode == 0, p.stderr
    assert "sha256:" + p.stdout.strip() == built["config_digest"]
    again = run_cli("image", "load", out, "--engine", "podman", env=podman_env, check=0)
    assert again.stdout.startswith("up to date"), again.stdout


def test_load_on_the_worker_over_ssh(tmp_path, run_cli, lab):
    out, built = _build(tmp_path, run_cli)
    worker_docker = lab.worker.dockerd.host
    argv = [sys.executable, "-m", "sparkstack.cli", "image", "load", str(out), "--host", "worker",
            "--ssh-config", str(lab.ssh_config), "--docker-host", worker_docker, "--json"]
    proc = lab.head.run(*argv, check=False)  # from the head's namespace, as a user on the head would
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["plan"]["where"] == "worker" and doc["plan"]["load_argv"][0] == "ssh"
    got = lab.worker.docker("image", "inspect", "--format", "{{.Id}}", built["name"]).stdout.strip()
    assert got == built["config_digest"]
    assert lab.head.docker("image", "inspect", built["name"], check=False).returncode != 0  # only the worker got it
    again = lab.head.run(*argv[:-1], check=False)
    assert again.returncode == 0 and again.stdout.startswith("up to date"), again.stdout + again.stderr
