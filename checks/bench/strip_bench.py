#!/usr/bin/env python3
"""Benchmark: MTP strip the old way vs `sparkstack strip` vs the least work that produces the same output.

Builds a synthetic HF cache entry with the real checkpoint's proportions (many
clean shards; MTP in one mixed shard plus one all-MTP shard, together at most 5%
of the bytes), then measures in one run, side by side:

  (a) old:   cp -a of the entry, then safetensors (torch) load + save_file of the MTP-bearing shards
  (b) ours:  sparkstack strip
  (c) floor: cp of the MTP-bearing shards + fsync + sha256sum of each

and prints wall time, peak RSS and extra disk bytes for each, then a/b and (b - start-up)/c.
The page cache is warmed first (drop_caches is not permitted here), so all three read from memory.
Ratios, never absolute times, are the result: this machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MIB = 1 << 20
LAYERS = 45
REV = "b" * 40


def _header(tensors: list[tuple[str, int]]) -> bytes:
    doc, cursor = {"__metadata__": {"format": "pt"}}, 0
    for name, n in tensors:
        doc[name] = {"dtype": "U8", "shape": [n], "data_offsets": [cursor, cursor + n]}
        cursor += n
    body = json.dumps(doc, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    return len(body).to_bytes(8, "little") + body


def _write_blob(blobs: Path, tensors: list[tuple[str, int]]) -> str:
    """Write one raw safetensors shard straight into blobs/, named by its sha256. Fast: a repeated random block."""
    fill = os.urandom(MIB)
    digest = hashlib.sha256()
    tmp = blobs / ".incoming"
    with open(tmp, "wb") as f:
        head = _header(tensors)
        f.write(head)
        digest.update(head)
        for _, n in tensors:
            while n:
                k = min(n, MIB)
                f.write(fill[:k])
                digest.update(fill[:k])
                n -= k
    name = digest.hexdigest()
    tmp.rename(blobs / name)
    return name


def build_entry(hub: Path, shards: int, shard_mib: int, mixed_mib: int, tensor_mib: int) -> tuple[Path, list[str]]:
    entry = hub / "models--bench--GLM-5.3-Flash-synthetic"
    blobs, snap = entry / "blobs", entry / "snapshots" / REV
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    total = shards + 1
    names = [f"model-{i:05d}-of-{total:05d}.safetensors" for i in range(1, total + 1)]
    weight_map: dict[str, str] = {}
    main_tensors = (shards - 1) * (shard_mib // tensor_mib) + (mixed_mib // 2) // tensor_mib
    per_layer = -(-main_tensors // LAYERS)  # spread main tensors over layers 0..44
    counter = 0

    def main_tensor() -> str:
        nonlocal counter
        layer, j = divmod(counter, per_layer)
        counter += 1
        return f"model.layers.{layer}.mlp.experts.w{j}.weight"

    for i, shard in enumerate(names):
        if i < shards - 1:  # clean shards
            tensors = [(main_tensor(), tensor_mib * MIB) for _ in range(shard_mib // tensor_mib)]
        elif i == shards - 1:  # mixed: half main, half MTP
            half = mixed_mib // 2
            tensors = [(main_tensor(), tensor_mib * MIB) for _ in range(half // tensor_mib)]
            tensors += [(f"model.layers.{LAYERS}.mlp.experts.w{k}.weight", tensor_mib * MIB) for k in range(half // tensor_mib)]
        else:  # all MTP
            tensors = [(f"model.layers.{LAYERS}.shared_head.w{k}", tensor_mib * MIB) for k in range(shard_mib // 2 // tensor_mib)]
        blob = _write_blob(blobs, tensors)
        (snap / shard).symlink_to(f"../../blobs/{blob}")
        weight_map.update({name: shard for name, _ in tensors})
    for rel, doc in (("config.json", {"num_hidden_layers": LAYERS, "num_nextn_predict_layers": 1}),
                     ("model.safetensors.index.json", {"metadata": {}, "weight_map": weight_map})):
        data = json.dumps(doc, indent=2).encode()
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        (blobs / blob).write_bytes(data)
        (snap / rel).symlink_to(f"../../blobs/{blob}")
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text(REV)
    return entry, names[shards - 1:]


OLD_WAY = r"""
import json, sys
from pathlib import Path
from safetensors.torch import load_file, save_file
snap, layers = Path(sys.argv[1]), int(sys.argv[2])
def mtp(k):
    parts = k.split(".")
    return any(p in ("mtp", "mtp_layers", "nextn", "shared_head") for p in parts) or any(
        a == "layers" and b.isdigit() and int(b) >= layers for a, b in zip(parts, parts[1:]))
for shard in sys.argv[3:]:
    p = snap / shard
    tensors = load_file(str(p))
    kept = {k: v for k, v in tensors.items() if not mtp(k)}
    p.unlink()  # cp -a kept the symlink; write a real file in its place
    if kept:
        save_file(kept, str(p), metadata={"format": "pt"})
idx = json.loads((snap / "model.safetensors.index.json").read_text())
idx["weight_map"] = {k: v for k, v in idx["weight_map"].items() if not mtp(k)}
(snap / "model.safetensors.index.json").unlink()
(snap / "model.safetensors.index.json").write_text(json.dumps(idx, indent=2))
"""


def run_steps(steps: list[list[str]]) -> tuple[float, int]:
    """Run commands one after another; return wall seconds and the largest peak RSS (bytes) among them."""
    peak = 0
    t0 = time.perf_counter()
    for argv in steps:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"bench step failed ({proc.returncode}): {' '.join(argv)}")
        peak = max(peak, usage.ru_maxrss * 1024)
    return time.perf_counter() - t0, peak


def extra_disk(out: Path, source: Path) -> int:
    """Bytes allocated under `out` in inodes that the source does not already own (hardlinks cost nothing)."""
    src_inodes = {p.lstat().st_ino for p in source.rglob("*")}
    seen, total = set(), 0
    for p in out.rglob("*"):
        st = p.lstat()
        if p.is_file() and not p.is_symlink() and st.st_ino not in src_inodes and st.st_ino not in seen:
            seen.add(st.st_ino)
            total += st.st_blocks * 512
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--shard-mib", type=int, default=128)
    ap.add_argument("--mixed-mib", type=int, default=None, help="size of the mixed shard (default: --shard-mib)")
    ap.add_argument("--tensor-mib", type=int, default=16)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    mixed_mib = args.mixed_mib or args.shard_mib
    sparkstack = shutil.which("sparkstack") or str(Path(sys.executable).with_name("sparkstack"))

    work = Path(tempfile.mkdtemp(prefix="strip-bench-", dir=args.workdir))
    try:
        hub = work / "hub"
        entry, mtp_shards = build_entry(hub, args.shards, args.shard_mib, mixed_mib, args.tensor_mib)
        snap = entry / "snapshots" / REV
        mtp_blobs = [str((snap / s).resolve()) for s in mtp_shards]
        total_bytes = sum(p.stat().st_size for p in (entry / "blobs").iterdir())
        mtp_bytes = sum(os.path.getsize(b) for b in mtp_blobs)
        subprocess.run(["cat", *map(str, (entry / "blobs").iterdir())], stdout=subprocess.DEVNULL, check=True)

        startup = run_steps([[sparkstack, "--help"]])
        old = work / "old"
        a = run_steps([["cp", "-a", str(entry), str(old)],
                       [sys.executable, "-c", OLD_WAY, str(old / "snapshots" / REV), str(LAYERS), *mtp_shards]])
        ours = hub / "models--bench--GLM-5.3-Flash-synthetic-no-MTP"
        b = run_steps([[sparkstack, "strip", str(entry)]])
        floor = work / "floor"
        floor.mkdir()
        c = run_steps([["cp", *mtp_blobs, str(floor)],
                       ["sync", *(str(floor / Path(m).name) for m in mtp_blobs)],
                       ["sha256sum", *(str(floor / Path(m).name) for m in mtp_blobs)]])
        rewritten = (ours / "snapshots" / REV / mtp_shards[0]).stat().st_size
        results = {
            "input": {"shards": args.shards + 1, "bytes": total_bytes, "mtp_bearing_bytes": mtp_bytes,
                      "mtp_bearing_share": round(mtp_bytes / total_bytes, 4), "rewritten_shard_bytes": rewritten},
            "startup_s": round(startup[0], 3),
            "a_old": {"wall_s": round(a[0], 3), "peak_rss": a[1], "extra_disk": extra_disk(old, entry)},
            "b_sparkstack": {"wall_s": round(b[0], 3), "peak_rss": b[1], "extra_disk": extra_disk(ours, entry)},
            "c_floor": {"wall_s": round(c[0], 3), "peak_rss": c[1], "extra_disk": extra_disk(floor, entry)},
        }
        results["ratio_a_over_b"] = round(a[0] / b[0], 2)
        results["ratio_b_minus_startup_over_c"] = round(max(b[0] - startup[0], 0.0) / c[0], 2)
        results["ratio_b_extra_disk_over_rewritten"] = round(results["b_sparkstack"]["extra_disk"] / rewritten, 3)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    if args.json:
        print(json.dumps(results, indent=2))
        return
    inp = results["input"]
    print(f"input: {inp['shards']} shards, {inp['bytes'] / MIB:.0f} MiB; MTP-bearing {inp['mtp_bearing_bytes'] / MIB:.0f} MiB "
          f"({inp['mtp_bearing_share']:.1%}); rewritten shard {inp['rewritten_shard_bytes'] / MIB:.0f} MiB")
    print(f"{'method':<16}{'wall s':>10}{'peak RSS MiB':>14}{'extra disk MiB':>16}")
    for key, label in (("a_old", "(a) old way"), ("b_sparkstack", "(b) sparkstack"), ("c_floor", "(c) floor")):
        r = results[key]
        print(f"{label:<16}{r['wall_s']:>10.3f}{r['peak_rss'] / MIB:>14.1f}{r['extra_disk'] / MIB:>16.1f}")
    print(f"start-up (sparkstack --help): {results['startup_s']:.3f} s")
    print(f"a/b = {results['ratio_a_over_b']}   (b - start-up)/c = {results['ratio_b_minus_startup_over_c']}   "
          f"b extra disk / rewritten shard = {results['ratio_b_extra_disk_over_rewritten']}")


if __name__ == "__main__":
    main()
