"""Fixtures that need real daemons and root. They skip with a reason where that is impossible,
and fail instead of skipping when SPARKSTACK_REQUIRE_LAB is set (CI sets it)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from daemons import DaemonError, Dockerd  # noqa: E402

ROOTFS_CACHE = Path(os.environ.get("SPARKSTACK_TEST_ROOTFS_CACHE", "/var/cache/sparkstack-tests"))


def unavailable(reason: str):
    if os.environ.get("SPARKSTACK_REQUIRE_LAB"):
        pytest.fail(f"lab requirement missing (SPARKSTACK_REQUIRE_LAB is set): {reason}")
    pytest.skip(reason)


def require(*tools: str) -> None:
    if os.geteuid() != 0:
        unavailable("the lab needs root")
    for tool in tools:
        if shutil.which(tool) is None:
            unavailable(f"{tool} is not installed")


@pytest.fixture(scope="session")
def dockerd(tmp_path_factory):
    """One private dockerd in this network namespace, for the whole session."""
    require("dockerd", "docker")
    d = Dockerd(tmp_path_factory.mktemp("dockerd"))
    try:
        d.start()
    except DaemonError as exc:
        d.stop()
        pytest.fail(str(exc))
    yield d
    d.stop()


def _debian_mirror() -> str:
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        try:
            for line in path.read_text().splitlines():
                words = line.split()
                if words[:1] == ["URIs:"] and "security" not in words[1]:
                    return words[1]
                if words[:1] == ["deb"] and "debian" in line and "security" not in line:
                    return words[1]
        except OSError:
            continue
    unavailable("no Debian mirror configured for debootstrap")


@pytest.fixture(scope="session")
def python_rootfs_tar():
    """A minimal Debian rootfs with python3, as one layer tar (debootstrap once, cached on this machine)."""
    require("debootstrap")
    cached = ROOTFS_CACHE / "bookworm-python3.tar"
    if not cached.exists():
        ROOTFS_CACHE.mkdir(parents=True, exist_ok=True)
        root = ROOTFS_CACHE / "bookworm-python3.tmp"
        shutil.rmtree(root, ignore_errors=True)
        proc = subprocess.run(["debootstrap", "--variant=minbase", "--include=python3-minimal", "bookworm", str(root),
                               _debian_mirror()], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.fail(f"debootstrap failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
        import imagefix

        partial = cached.with_suffix(".partial")
        partial.write_bytes(imagefix.rootfs_tar(root))
        partial.rename(cached)
        shutil.rmtree(root, ignore_errors=True)
    return cached.read_bytes()
