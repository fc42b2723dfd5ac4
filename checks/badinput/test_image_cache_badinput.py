"""A warm layer cache may never bless bytes it did not check (driving the real CLI).

Each test warms the cache with a good build, then damages the base in place, keeping its digests
in the documents, and expects the next build to re-verify and refuse with one line, publishing nothing.
An unchanged base must still be served from the cache.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import imagefix as fx
from clirun import one_error_line


def _build(tmp: Path, base: Path, src: Path, overlay: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkstack.cli", "image", "build", "--base", str(base),
                           "--overlay", str(overlay), "--overlay-src", str(src), "--out", str(out), "--json"],
                          capture_output=True, text=True, timeout=120)


def _built(proc) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["result"]


def _refused(proc, tmp: Path, out: Path, *fragments) -> None:
    line = one_error_line(proc)  # exit 1: the damaged base was refused
    for f in fragments:
        assert f in line, f"{f!r} not in: {line}"
    assert not out.exists() and not list(tmp.glob(f".{out.name}*")) and not list(tmp.glob(".sparkstack-*"))


def _flip_in_place(path: Path, keep_mtime: bool = False) -> None:
    """One byte flipped through the same inode; optionally the mtime put back, as `touch -r` would."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(st.st_size // 2)
        b = f.read(1)
        f.seek(st.st_size // 2)
        f.write(bytes([b[0] ^ 0x01]))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_ino == st.st_ino


@pytest.mark.parametrize("warm_out", ["out1", "out1.tar"])
def test_layer_flipped_in_place_after_a_warm_build(image_world, warm_out):
    tmp, src, overlay, digests = (image_world[k] for k in ("tmp", "src", "overlay", "digests"))
    _built(_build(tmp, tmp / "base", src, overlay, tmp / warm_out))
    layer = digests["layers"][0]
    _flip_in_place(fx.blob_path(tmp / "base", layer))
    _refused(_build(tmp, tmp / "base", src, overlay, tmp / "out2"), tmp, tmp / "out2", layer, "digest")


def test_layer_flipped_with_its_mtime_restored(image_world):
    """ctime still moves. (The warm build writes a tar, so no hardlink changes the blob's link count.)"""
    tmp, src, overlay, digests = (image_world[k] for k in ("tmp", "src", "overlay", "digests"))
    _built(_build(tmp, tmp / "base", src, overlay, tmp / "out1.tar"))
    layer = digests["layers"][1]
    _flip_in_place(fx.blob_path(tmp / "base", layer), keep_mtime=True)
    _refused(_build(tmp, tmp / "base", src, overlay, tmp / "out2"), tmp, tmp / "out2", layer, "digest")


def test_config_names_a_wrong_diff_id_after_a_warm_build(image_world):
    tmp, src, overlay, digests = (image_world[k] for k in ("tmp", "src", "overlay", "digests"))
    _built(_build(tmp, tmp / "base", src, overlay, tmp / "out1"))
    fx.restack(tmp / "base", config=lambda c: (c["rootfs"]["diff_ids"].__setitem__(0, "sha256:" + "0" * 64), c)[1])
    _refused(_build(tmp, tmp / "base", src, overlay, tmp / "out2"), tmp, tmp / "out2", digests["layers"][0], "diffid")


def test_another_copy_of_the_base_is_verified_on_its_own(image_world):
    """Same digests, other files: a corrupt second copy (say, a re-download) is not vouched for by the first."""
    tmp, src, overlay, digests = (image_world[k] for k in ("tmp", "src", "overlay", "digests"))
    _built(_build(tmp, tmp / "base", src, overlay, tmp / "out1"))
    shutil.copytree(tmp / "base", tmp / "copy")
    layer = digests["layers"][2]
    _flip_in_place(fx.blob_path(tmp / "copy", layer))
    _refused(_build(tmp, tmp / "copy", src, overlay, tmp / "out2"), tmp, tmp / "out2", layer, "digest")


def test_oci_archive_flipped_in_place_after_a_warm_build(image_world):
    tmp, src, overlay, digests = (image_world[k] for k in ("tmp", "src", "overlay", "digests"))
    fx.layout_to_oci_archive(tmp / "base", tmp / "base.tar")
    _built(_build(tmp, tmp / "base.tar", src, overlay, tmp / "out1"))
    layer = digests["layers"][0]
    blob = fx.blob_path(tmp / "base", layer).read_bytes()
    archive = bytearray((tmp / "base.tar").read_bytes())
    at = archive.find(blob) + len(blob) // 2  # the member's data, found independently of sparkstack
    with open(tmp / "base.tar", "r+b") as f:
        f.seek(at)
        f.write(bytes([archive[at] ^ 0x01]))
    _refused(_build(tmp, tmp / "base.tar", src, overlay, tmp / "out2"), tmp, tmp / "out2", layer, "digest")


def test_unchanged_base_is_served_from_the_cache(image_world):
    """Dir outputs hardlink the base blobs (ctime moves, content does not): rebuilds still read no layer bytes."""
    tmp, src, overlay, digests = (image_world[k] for k in ("tmp", "src", "overlay", "digests"))
    first = _built(_build(tmp, tmp / "base", src, overlay, tmp / "out1"))
    assert first["cache"]["layers_read"] >= 3 and first["cache"]["layer_bytes_read"] > 0
    for out in ("out2", "out3.tar", "out4"):
        again = _built(_build(tmp, tmp / "base", src, overlay, tmp / out))
        assert again["cache"]["layer_bytes_read"] == 0 and again["cache"]["layers_read"] == 0, (out, again["cache"])
        assert again["cache"]["index_hits"] == 3
        assert again["config_digest"] == first["config_digest"]
