"""The built image loads into a real dockerd and podman, keeps its identity, and runs its gates."""

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import imagefix as fx
from conftest import require


def _python_world(tmp_path, rootfs_tar):
    base = tmp_path / "base"
    fx.write_base(base, layers=[("none", rootfs_tar)] + fx.default_layers(), arch="amd64")
    src = fx.write_overlay_source(tmp_path / "src")
    overlay = fx.write_overlay(tmp_path / "overlay", pinned_from=src / "overlay-dflash2")
    return base, src, overlay


def test_image_loads_and_runs_in_docker_and_podman(tmp_path, run_cli, dockerd, python_rootfs_tar):
    base, src, overlay = _python_world(tmp_path, python_rootfs_tar)
    out = tmp_path / "image.tar"
    proc = run_cli("image", "build", "--base", base, "--overlay", overlay, "--overlay-src", src, "--out", out,
                   "--platform", "linux/amd64", "--json", env={"SPARKSTACK_CACHE_DIR": str(tmp_path / "cache")}, check=0)
    result = json.loads(proc.stdout)["result"]

    loaded = dockerd.run("load", "-i", str(out))
    assert result["name"] in loaded.stdout
    # Identity survives `docker load`: docker's image ID is our config digest.
    assert dockerd.run("image", "inspect", "--format", "{{.Id}}", result["name"]).stdout.strip() == result["config_digest"]

    config = json.loads(dockerd.run("image", "inspect", "--format", "{{json .Config.Labels}}", result["name"]).stdout)
    gates = json.loads(config["org.sparkstack.gates.runtime"])
    site = "/" + fx.SITE
    # The fixture base's python is 3.11, so its sys.path lacks the 3.12 dist-packages: add it, then run the gates.
    for argv in gates + [["python3", "-c",
                          "from vllm.model_executor.models.registry import ModelRegistry; "
                          "assert 'DFlash2DraftModel' in ModelRegistry.get_supported_archs()"]]:
        ran = dockerd.run("run", "--rm", "--pull", "never", "--network", "host", "-e", f"PYTHONPATH={site}",
                          result["name"], *argv, check=False)
        assert ran.returncode == 0, ran.stderr

    require("podman")
    store = Path(tempfile.mkdtemp(prefix="pm-", dir="/tmp"))  # podman wants a runroot under 50 characters
    podman = ["podman", "--root", str(store / "root"), "--runroot", str(store / "run"), "--storage-driver", "vfs",
              "--events-backend", "file", "--cgroup-manager", "cgroupfs"]
    p = subprocess.run(podman + ["load", "-i", str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    p = subprocess.run(podman + ["image", "inspect", "--format", "{{.Id}}", result["name"]], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "sha256:" + p.stdout.strip() == result["config_digest"]
    shutil.rmtree(store, ignore_errors=True)
