"""A minbase Debian bookworm rootfs with python3, as one layer tar: debootstrapped once per machine, cached, under
a file lock (two xdist workers, or .ci/run and a worker, never share the scratch root).

The lab's `python_rootfs_tar` fixture reads it. .ci/run fills the cache early, beside its other setup, so that no
test waits for debootstrap (about 35 s on a fresh machine): `python checks/lab/rootfs.py` prints the cached path.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))  # checks/, for imagefix

ROOTFS_CACHE = Path(os.environ.get("SPARKSTACK_TEST_ROOTFS_CACHE", "/var/cache/sparkstack-tests"))
CACHED = ROOTFS_CACHE / "bookworm-python3-stdlib.tar"


class RootfsError(RuntimeError):
    pass


class NoMirror(RootfsError):
    pass


def debian_mirror() -> str:
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
    raise NoMirror("no Debian mirror configured for debootstrap")


def ensure() -> Path:
    """The cached tar, made first if absent."""
    ROOTFS_CACHE.mkdir(parents=True, exist_ok=True)
    with open(ROOTFS_CACHE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not CACHED.exists():
            _debootstrap()
    return CACHED


def _debootstrap() -> None:
    root = ROOTFS_CACHE / "bookworm-python3.tmp"
    shutil.rmtree(root, ignore_errors=True)
    proc = subprocess.run(["debootstrap", "--variant=minbase", "--include=python3", "bookworm", str(root),
                           debian_mirror()], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RootfsError(f"debootstrap failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    import imagefix

    partial = CACHED.with_suffix(".partial")
    partial.write_bytes(imagefix.rootfs_tar(root))
    partial.rename(CACHED)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    try:
        print(ensure())
    except RootfsError as exc:
        sys.exit(f"rootfs: {exc}")
