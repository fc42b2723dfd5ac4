#!/usr/bin/env python3
"""Benchmark: full image build vs overlay-only rebuild on a base with a >= 1 GiB layer.

The base is the test fixture's vLLM tree plus one big uncompressed layer. It
times (1) a cold build (empty layer cache), (2) a rebuild after one overlay file
changed, and counts the base-layer bytes each one read: the rebuild should read
none, because the per-layer index cache serves it. Ratios, not absolute times,
are the result.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import imagefix as fx  # noqa: E402

MIB = 1 << 20


class _Repeat(io.RawIOBase):
    """`size` bytes made of one random block, repeated: fast to produce, still incompressible per block."""

    def __init__(self, size: int) -> None:
        self.left, self.block, self.pos = size, os.urandom(MIB), 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        n = min(len(buf), self.left, MIB - self.pos)
        buf[:n] = self.block[self.pos:self.pos + n]
        self.pos = (self.pos + n) % MIB
        self.left -= n
        return n


def big_layer(path: Path, size: int) -> tuple[str, int]:
    """Write an uncompressed layer holding one `size`-byte file; return (sha256 digest, size)."""
    h = hashlib.sha256()

    class _Hashed(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, b) -> int:
            h.update(b)
            return out.write(b)

    with open(path, "wb") as out:
        with tarfile.open(fileobj=_Hashed(), mode="w|", format=tarfile.GNU_FORMAT) as tar:
            info = tarfile.TarInfo("opt/weights.bin")
            info.size = size
            tar.addfile(info, _Repeat(size))
    return "sha256:" + h.hexdigest(), path.stat().st_size


def make_base(root: Path, big_mib: int) -> None:
    fx.write_base(root)  # three small layers with the fake vLLM tree
    blob_tmp = root / "big.tmp"
    digest, size = big_layer(blob_tmp, big_mib * MIB)
    blob_tmp.rename(root / "blobs/sha256" / digest.split(":")[1])
    # Put the big layer at the bottom of the stack: rewrite config, manifest and index.
    index = json.loads((root / "index.json").read_text())
    blob = lambda d: root / "blobs/sha256" / d.split(":")[1]  # noqa: E731
    manifest = json.loads(blob(index["manifests"][0]["digest"]).read_text())
    config = json.loads(blob(manifest["config"]["digest"]).read_text())
    config["rootfs"]["diff_ids"].insert(0, digest)
    config["history"].insert(0, {"created_by": "big layer"})
    manifest["layers"].insert(0, {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest, "size": size})

    def put(doc: dict) -> tuple[str, int]:
        data = json.dumps(doc).encode()
        d = "sha256:" + hashlib.sha256(data).hexdigest()
        blob(d).write_bytes(data)
        return d, len(data)

    cfg, cfg_size = put(config)
    manifest["config"].update(digest=cfg, size=cfg_size)
    man, man_size = put(manifest)
    index["manifests"][0].update(digest=man, size=man_size)
    (root / "index.json").write_text(json.dumps(index))


def timed_build(sparkstack: str, args: list[str], env: dict) -> tuple[float, dict]:
    t0 = time.perf_counter()
    proc = subprocess.run([sparkstack, "image", "build", *args, "--json"], capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"build failed: {proc.stderr.strip()}")
    return elapsed, json.loads(proc.stdout)["result"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--big-mib", type=int, default=1024)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sparkstack = shutil.which("sparkstack") or str(Path(sys.executable).with_name("sparkstack"))

    work = Path(tempfile.mkdtemp(prefix="image-bench-", dir=args.workdir))
    try:
        base = work / "base"
        make_base(base, args.big_mib)
        src = fx.write_overlay_source(work / "src")
        overlay = fx.write_overlay(work / "overlay", pinned_from=src / "overlay-dflash2")
        env = dict(os.environ, SPARKSTACK_CACHE_DIR=str(work / "cache"))
        common = ["--base", str(base), "--overlay", str(overlay), "--overlay-src", str(src)]
        full_s, full = timed_build(sparkstack, common + ["--out", str(work / "out1")], env)
        (src / "overlay-dflash2/dflash2/speculator.py").write_text("class DFlash2Speculator:\n    width = 4\n")
        subprocess.run([sparkstack, "pin", "overlay", "--overlay", str(overlay), "--overlay-src", str(src), "--repin"],
                       check=True, capture_output=True, env=env)
        re_s, rebuilt = timed_build(sparkstack, common + ["--out", str(work / "out2")], env)
        results = {
            "big_layer_bytes": args.big_mib * MIB,
            "full_build_s": round(full_s, 3), "full_build_layer_bytes_read": full["cache"]["layer_bytes_read"],
            "rebuild_s": round(re_s, 3), "rebuild_layer_bytes_read": rebuilt["cache"]["layer_bytes_read"],
            "ratio_full_over_rebuild": round(full_s / re_s, 2),
            "full_manifest": full["manifest_digest"], "rebuild_manifest": rebuilt["manifest_digest"],
            "base_layers_shared": full["base_config_digest"] == rebuilt["base_config_digest"],
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"base: fixture vLLM tree + one {results['big_layer_bytes'] / MIB:.0f} MiB layer")
    print(f"full build (cold cache):  {results['full_build_s']:.3f} s, base layer bytes read {results['full_build_layer_bytes_read']:,}")
    print(f"overlay-only rebuild:     {results['rebuild_s']:.3f} s, base layer bytes read {results['rebuild_layer_bytes_read']:,}")
    print(f"full / rebuild = {results['ratio_full_over_rebuild']}")


if __name__ == "__main__":
    main()
