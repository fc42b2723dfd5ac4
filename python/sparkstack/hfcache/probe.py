"""Is one snapshot of a hub cache entry whole? Standard library only (python3 >= 3.8), so that it runs on a worker.

Imported here by `hfcache.snapshot_state`; its source travels to a worker as `python3 -c SOURCE HUB ENTRY
REVISION` (read-only: it opens files, writes nothing) and prints one JSON line: {"complete", "detail", "shards"}.
"""

import json
import os
import struct
import sys

INDEX_NAME = "model.safetensors.index.json"
MAX_HEADER = 100 << 20  # the safetensors library's own cap on a header


def broken_links(snap):
    """Files of the snapshot that are not (links to) regular files: what `rsync -a` of the links alone leaves."""
    out = []
    for dirpath, _, filenames in os.walk(snap):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.isfile(path):
                out.append(os.path.relpath(path, snap))
    return sorted(out)


def _data_end(path):
    """Where a safetensors file's data must end (8 + header length + the last tensor's end), or None if unreadable."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                return None
            (n,) = struct.unpack("<Q", raw)
            if n > MAX_HEADER:
                return None
            header = json.loads(f.read(n))
        ends = [e["data_offsets"][1] for k, e in header.items() if k != "__metadata__"]
        return 8 + n + max(ends, default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError):
        return None


def snapshot_report(snap, check_sizes=True):
    """{"complete", "detail", "shards"}: no broken link, every shard the index names present (at the size its
    header implies, when `check_sizes`)."""

    def report(complete, detail, shards=()):
        return {"complete": complete, "detail": detail, "shards": list(shards)}

    if not os.path.isdir(snap):
        return report(False, f"{snap} does not exist")
    broken = broken_links(snap)
    if broken:
        return report(False, f"{len(broken)} broken link(s), e.g. {broken[0]} (copied links without their blobs?)")
    index = os.path.join(snap, INDEX_NAME)
    if os.path.exists(index):
        try:
            with open(index, "rb") as f:
                shards = sorted(set(json.loads(f.read())["weight_map"].values()))
            if not all(isinstance(s, str) and s and not s.startswith("/") and ".." not in s.split("/") for s in shards):
                raise TypeError
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return report(False, f"{index} is not a valid index")
    else:
        shards = sorted(n for n in os.listdir(snap) if n.endswith(".safetensors"))
    if not shards:
        return report(False, f"{snap} has no safetensors shards")
    for shard in shards:
        path = os.path.join(snap, shard)
        if not os.path.isfile(path):
            return report(False, f"{shard} is named in the index but missing (an unfinished download?)")
        if check_sizes:
            want, size = _data_end(path), os.path.getsize(path)
            if want != size:
                said = "is unreadable" if want is None else f"says {want}"
                return report(False, f"{shard} is {size} bytes, but its header {said}")
    return report(True, f"{len(shards)} shards complete", shards)


if __name__ == "__main__":
    hub, name, revision = sys.argv[1:4]
    snapshot = os.path.join(os.path.expanduser(hub), name, "snapshots", revision)
    print(json.dumps(snapshot_report(snapshot)))
