"""Carry out a StripPlan: stage every output beside the destination, verify it, then publish atomically."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sparkstack import fsio, outputs
from sparkstack.errors import SparkstackError
from sparkstack.hfcache import blob_is_intact, blobs_dir, git_blob_name, publish_snapshot, snapshot_dir, snapshot_link_target
from sparkstack.safetensors_header import read_header
from sparkstack.strip.plan import COMMAND, FORMAT_VERSION, ShardPlan, StripPlan, is_up_to_date
from sparkstack.units import human_bytes


@dataclass(frozen=True)
class OutputFile:
    relpath: str
    how: str  # "link", "copy", "rewrite" or "new"
    size: int
    blob: str | None  # blob name in the output cache entry (None for a flat output)
    identity: tuple[int, int, int, int] = (0, 0, 0, 0)  # of the real file: see file_identity


@dataclass(frozen=True)
class StripResult:
    dest: Path
    revision: str | None
    up_to_date: bool
    files: tuple[OutputFile, ...]
    copy_method: str | None

    def to_json(self) -> dict:
        return {
            "dest": str(self.dest), "revision": self.revision, "up_to_date": self.up_to_date,
            "copy_method": self.copy_method,
            "files": [{"file": f.relpath, "how": f.how, "size": f.size, "blob": f.blob} for f in self.files],
        }

    def lines(self, plan: StripPlan) -> list[str]:
        """The human form of what a strip wrote."""
        at = f" @ {self.revision}" if self.revision else ""
        if self.up_to_date:
            return [f"up to date: {self.dest}{at}"]
        counts = {how: sum(1 for f in self.files if f.how == how) for how in ("rewrite", "link", "copy", "new")}
        return [f"wrote {self.dest}{at}",
                "  " + ", ".join(f"{n} {how}" for how, n in counts.items() if n)
                + f"; {human_bytes(plan.bytes_to_write)} written, {human_bytes(plan.bytes_freed)} freed"]


def apply_strip(plan: StripPlan, on_progress: Callable[[int], None] | None = None,
               on_wait: Callable[[Path, int | None], None] = lambda dest, pid: None) -> StripResult:
    """`on_wait(dest, holder_pid)` is called once if another strip of the same destination holds it."""
    if plan.up_to_date:
        return StripResult(plan.dest.root, plan.dest.revision, True, (), None)
    with fsio.dest_lock(plan.dest.root, on_wait):
        # Another strip may have published this very output while we planned or waited.
        if is_up_to_date(plan.dest, plan.fingerprint, plan.source.at_main):
            return StripResult(plan.dest.root, plan.dest.revision, True, (), None)
        return _apply_locked(plan, on_progress)


def _apply_locked(plan: StripPlan, on_progress: Callable[[int], None] | None) -> StripResult:
    dest = plan.dest
    copier = fsio.RangeCopier()
    with fsio.staging_dir(dest.root.parent, dest.root.name) as stage:
        out = _Staged(stage, plan, copier, on_progress)
        for shard in plan.shards:
            if shard.action == "rewrite":
                out.add_rewritten(shard)
            elif shard.action == "link":
                out.add_existing(shard.relpath, shard.source.path, shard.source.blob)
        for f in plan.carried:
            out.add_existing(f.relpath, f.path, f.blob)
        for relpath, data in plan.new_files:
            out.add_new(relpath, data)
        stamp = {
            "created_by": COMMAND, "format": FORMAT_VERSION, "fingerprint": plan.fingerprint,
            "source": str(plan.source.root), "revision": plan.source.revision,
            "outputs": {f.relpath: list(f.identity) for f in out.files},
        }
        bookkeeping = {dest.stamp.name: (json.dumps(stamp, indent=2, sort_keys=True) + "\n").encode(),
                       outputs.MARKER.name: outputs.OutputMarker(COMMAND).to_bytes()}
        if dest.kind == "cache":
            # Stripping an older snapshot must not move the output's refs/main back under launch's feet.
            publish_snapshot(stage, dest.root, dest.revision, bookkeeping, set_main=plan.source.at_main)
        else:
            _publish_flat(stage, dest.root, bookkeeping)
    return StripResult(dest.root, dest.revision, False, tuple(out.files), copier.method)


class _Staged:
    """Builds the output tree inside the staging dir, laid out like the final destination."""

    def __init__(self, stage: Path, plan: StripPlan, copier: fsio.RangeCopier,
                 on_progress: Callable[[int], None] | None) -> None:
        self.plan = plan
        self.copier = copier
        self.on_progress = on_progress
        self.cache = plan.dest.kind == "cache"
        self.blobs = blobs_dir(stage)  # the stage is laid out as the entry will be
        self.final_blobs = blobs_dir(plan.dest.root)
        self.model_dir = snapshot_dir(stage, plan.dest.revision) if self.cache else stage
        self.model_dir.mkdir(parents=True, exist_ok=True)
        if self.cache:
            self.blobs.mkdir(exist_ok=True)
        self.files: list[OutputFile] = []

    def _place(self, relpath: str, how: str, size: int, blob: str | None) -> None:
        target = self.model_dir / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        if self.cache:
            os.symlink(snapshot_link_target(relpath, blob), target)
            real = self.blobs / blob if (self.blobs / blob).exists() else self.final_blobs / blob
        else:
            real = target
        self.files.append(OutputFile(relpath, how, size, blob, fsio.file_identity(real)))

    def _record_plain(self, relpath: str, how: str, size: int) -> None:
        # The stage is renamed into place whole, so the identity taken here is the published file's.
        self.files.append(OutputFile(relpath, how, size, None, fsio.file_identity(self.model_dir / relpath)))

    def _have_blob(self, blob: str, same_as: Path | None = None) -> bool:
        """Already staged, or already published and intact: the very file `same_as` (a hardlink of the source),
        or a blob whose bytes still match its name. Anything else is staged afresh and replaces it."""
        if (self.blobs / blob).exists():
            return True
        final = self.final_blobs / blob
        if not final.exists():
            return False
        try:
            if same_as is not None and os.path.samefile(final, same_as):
                return True
        except OSError:
            return False
        return blob_is_intact(final, blob)

    def add_existing(self, relpath: str, src: Path, blob: str | None) -> None:
        """A file whose bytes do not change: hardlink it (or copy it across filesystems)."""
        size = src.stat().st_size
        if not self.cache:
            (self.model_dir / relpath).parent.mkdir(parents=True, exist_ok=True)
            how = fsio.link_or_copy(src, self.model_dir / relpath)
            self._record_plain(relpath, how, size)
            return
        if blob is None:  # a plain file inside a snapshot: name it as the hub would
            data = src.read_bytes() if not relpath.endswith(".safetensors") else None
            blob = git_blob_name(data) if data is not None else fsio.sha256_file(src)
        how = "link"
        if not self._have_blob(blob, same_as=src):
            how = fsio.link_or_copy(src, self.blobs / blob)
        self._place(relpath, how, size, blob)

    def add_new(self, relpath: str, data: bytes) -> None:
        if not self.cache:
            fsio.write_durable(self.model_dir / relpath, data)
            self._record_plain(relpath, "new", len(data))
            return
        blob = git_blob_name(data)
        if not self._have_blob(blob):
            fsio.write_durable(self.blobs / blob, data)
        self._place(relpath, "new", len(data), blob)

    def add_rewritten(self, shard: ShardPlan) -> None:
        """Write the new header, then kernel-copy the kept byte ranges, hashing as they stream."""
        tmp = (self.blobs if self.cache else self.model_dir) / f".{Path(shard.relpath).name}.partial"
        tmp.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(shard.new_prefix)
        src_fd = os.open(shard.source.path, os.O_RDONLY)
        dst_fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(dst_fd, shard.new_prefix)
            dst_off = len(shard.new_prefix)
            for src_off, length in _runs(shard):
                self.copier.copy(src_fd, shard.header.data_start + src_off, dst_fd, dst_off, length,
                                 digest=digest, on_progress=self.on_progress)
                dst_off += length
            os.fsync(dst_fd)
        finally:
            os.close(dst_fd)
            os.close(src_fd)
        _verify_rewritten(tmp, shard)
        sha = digest.hexdigest()
        if self.cache:
            if self._have_blob(sha):
                tmp.unlink()
            else:
                os.rename(tmp, self.blobs / sha)
            self._place(shard.relpath, "rewrite", shard.out_size, sha)
        else:
            final = self.model_dir / shard.relpath
            final.parent.mkdir(parents=True, exist_ok=True)
            os.rename(tmp, final)
            self._record_plain(shard.relpath, "rewrite", shard.out_size)


def _runs(shard: ShardPlan) -> list[tuple[int, int]]:
    """Merge kept tensors that sit back to back in the source into single (offset, length) copies."""
    runs: list[list[int]] = []
    for t in shard.kept:
        if runs and runs[-1][0] + runs[-1][1] == t.begin:
            runs[-1][1] += t.nbytes
        else:
            runs.append([t.begin, t.nbytes])
    return [(o, n) for o, n in runs]


def _verify_rewritten(path: Path, shard: ShardPlan) -> None:
    """Re-read the header we wrote and check it says exactly what the plan meant."""
    written = read_header(path)
    if written.tensors != shard.new_tensors or written.metadata != shard.header.metadata:
        raise SparkstackError(f"{shard.relpath}: rewritten header does not match the plan")
    names = {t.name for t in written.tensors}
    if names & set(shard.dropped):
        raise SparkstackError(f"{shard.relpath}: dropped tensors are still present after rewrite")
    source = {t.name: (t.dtype, t.shape, t.nbytes) for t in shard.kept}
    if {t.name: (t.dtype, t.shape, t.nbytes) for t in written.tensors} != source:
        raise SparkstackError(f"{shard.relpath}: kept tensors' dtype or shape changed in rewrite")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _publish_flat(stage: Path, dest: Path, bookkeeping: dict[str, bytes]) -> None:
    (stage / ".sparkstack").mkdir()
    for name, data in bookkeeping.items():
        fsio.write_durable(stage / ".sparkstack" / name, data)
    for dirpath, _, _ in os.walk(stage):
        fsio.fsync_dir(dirpath)
    fsio.replace_dir(stage, dest)
