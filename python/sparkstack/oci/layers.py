"""Layers: streaming decompression, verification, and a per-layer file index kept in a local cache.

Each layer's index (and the content of the files asked for) is cached keyed by
layer digest, so a rebuild on the same base reads no base layer bytes again.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import tarfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from sparkstack import fsio
from sparkstack.errors import SparkstackError
from sparkstack.oci.model import LAYER_GZIP, LAYER_TAR, LAYER_ZSTD, OPAQUE, WHITEOUT, Layer, digest_hex
from sparkstack.oci.source import BlobSource

@dataclass(frozen=True)
class Entry:
    path: str  # normalised, relative to the root, no leading "/"
    kind: str  # file, dir, symlink, hardlink, device, fifo, whiteout, opaque
    mode: int
    size: int
    link: str  # symlink target or hardlink target
    sha256: str | None  # content hash of regular files


@dataclass
class LayerIndex:
    digest: str
    entries: dict[str, Entry] = field(default_factory=dict)


def safe_member_path(name: str, label: str) -> str:
    """Normalise a tar member name; refuse names that climb out of the root."""
    parts: list[str] = []
    for part in name.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise SparkstackError(f"{label}: member {name!r} climbs out of the image root")
            parts.pop()
        else:
            parts.append(part)
    return "/".join(parts)


class HashingReader(io.RawIOBase):
    """Counts and hashes bytes as they are read through it."""

    def __init__(self, raw: BinaryIO, on_progress: Callable[[int], None] | None = None) -> None:
        self.raw, self.hash, self.count, self.on_progress = raw, hashlib.sha256(), 0, on_progress

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        n = self.raw.readinto(buf) if hasattr(self.raw, "readinto") else self._copy_into(buf)
        if n:
            self.hash.update(memoryview(buf)[:n])
            self.count += n
            if self.on_progress:
                self.on_progress(n)
        return n

    def _copy_into(self, buf) -> int:
        data = self.raw.read(len(buf))
        buf[: len(data)] = data
        return len(data)

    def drain(self) -> None:
        while self.read(fsio.CHUNK):
            pass


@contextmanager
def uncompressed(raw: BinaryIO, media_type: str) -> Iterator[BinaryIO]:
    if media_type == LAYER_GZIP:
        yield _GunzipReader(raw)
    elif media_type == LAYER_ZSTD:
        import zstandard

        with zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=False) as r:
            yield r
    elif media_type == LAYER_TAR:
        yield raw
    else:
        raise SparkstackError(f"unsupported layer media type {media_type}")


class _GunzipReader(io.RawIOBase):
    """Streaming gunzip over concatenated members, without gzip.GzipFile's extra buffering."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw, self.z, self.pending = raw, zlib.decompressobj(31), b""

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while not self.pending:
            chunk = self.raw.read(1 << 20)
            if not chunk:
                if self.z.unused_data:
                    chunk, self.z = self.z.unused_data, zlib.decompressobj(31)
                    self.pending = self.z.decompress(chunk)
                    continue
                return 0
            try:
                self.pending = self.z.decompress(chunk)
            except zlib.error as exc:
                raise SparkstackError(f"corrupt gzip layer ({exc})") from None
            if self.z.eof and self.z.unused_data:
                rest, self.z = self.z.unused_data, zlib.decompressobj(31)
                self.pending += self.z.decompress(rest)
        n = min(len(buf), len(self.pending))
        buf[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n


def _kind(member: tarfile.TarInfo) -> str:
    if member.isreg():
        return "file"
    if member.isdir():
        return "dir"
    if member.issym():
        return "symlink"
    if member.islnk():
        return "hardlink"
    if member.ischr() or member.isblk():
        return "device"
    if member.isfifo():
        return "fifo"
    return "other"


class LayerCache:
    """Per-layer indexes and captured file contents, on disk, keyed by digest."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.stats = {"layer_bytes_read": 0, "layers_read": 0, "index_hits": 0}

    @staticmethod
    def default() -> LayerCache:
        base = os.environ.get("SPARKSTACK_CACHE_DIR") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sparkstack")
        return LayerCache(Path(base) / "oci")

    def _index_path(self, digest: str) -> Path:
        return self.root / "layers" / f"{digest_hex(digest)}.json"

    def object_path(self, sha256: str) -> Path:
        return self.root / "objects" / sha256

    def load(self, digest: str) -> LayerIndex | None:
        try:
            doc = json.loads(self._index_path(digest).read_text())
        except (OSError, ValueError):
            return None
        self.stats["index_hits"] += 1
        return LayerIndex(digest, {e[0]: Entry(*e) for e in doc["entries"]})

    def save(self, index: LayerIndex) -> None:
        path = self._index_path(index.digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"digest": index.digest, "verified": True,
               "entries": [[e.path, e.kind, e.mode, e.size, e.link, e.sha256] for e in index.entries.values()]}
        fsio.write_atomic(path, json.dumps(doc).encode())

    def has_object(self, sha256: str) -> bool:
        return self.object_path(sha256).is_file()

    def put_object(self, sha256: str, data: bytes) -> None:
        path = self.object_path(sha256)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            fsio.write_atomic(path, data)

    def read_object(self, sha256: str) -> bytes:
        data = self.object_path(sha256).read_bytes()
        if hashlib.sha256(data).hexdigest() != sha256:
            raise SparkstackError(f"layer cache object {sha256} is corrupt; remove {self.root} and rebuild")
        return data


def scan_layer(src: BlobSource, layer: Layer, cache: LayerCache, capture: Callable[[str], bool],
               on_progress: Callable[[int], None] | None = None) -> LayerIndex:
    """Stream one layer: verify its digest and diff_id, index every entry, keep wanted file contents."""
    index = LayerIndex(layer.digest)
    label = f"{src.label}: layer {layer.digest[:19]}"
    with src.open_blob(layer.digest) as raw:
        outer = HashingReader(raw, on_progress)
        with uncompressed(io.BufferedReader(outer, fsio.CHUNK), layer.media_type) as plain:
            inner = HashingReader(plain)
            try:
                with tarfile.open(fileobj=io.BufferedReader(inner, fsio.CHUNK), mode="r|") as tar:
                    for member in tar:
                        _index_member(tar, member, index, cache, capture, label)
            except tarfile.TarError as exc:
                raise SparkstackError(f"{label}: broken tar ({exc})") from None
            inner.drain()
        outer.drain()
    cache.stats["layer_bytes_read"] += outer.count
    cache.stats["layers_read"] += 1
    if "sha256:" + outer.hash.hexdigest() != layer.digest:
        raise SparkstackError(f"{label}: blob does not match its digest")
    if "sha256:" + inner.hash.hexdigest() != layer.diff_id:
        raise SparkstackError(f"{label}: diffid mismatch (uncompressed content does not match the config)")
    cache.save(index)
    return index


def _index_member(tar: tarfile.TarFile, member: tarfile.TarInfo, index: LayerIndex, cache: LayerCache,
                  capture: Callable[[str], bool], label: str) -> None:
    path = safe_member_path(member.name, label)
    if not path:
        return
    directory, base = posixpath.split(path)
    if base == OPAQUE:
        index.entries[directory] = Entry(directory, "opaque", 0, 0, "", None)
        return
    if base.startswith(WHITEOUT):
        target = posixpath.join(directory, base[len(WHITEOUT):])
        index.entries[target] = Entry(target, "whiteout", 0, 0, "", None)
        return
    kind = _kind(member)
    link = member.linkname if kind in ("symlink", "hardlink") else ""
    sha = None
    if kind == "file":
        f = tar.extractfile(member)
        h = hashlib.sha256()
        keep = capture(path)
        parts = []
        while chunk := f.read(fsio.CHUNK):
            h.update(chunk)
            if keep:
                parts.append(chunk)
        sha = h.hexdigest()
        if keep:
            cache.put_object(sha, b"".join(parts))
    if path in index.entries and index.entries[path].kind == "opaque" and kind == "dir":
        return  # the opaque marker already stands for this dir in this layer
    index.entries[path] = Entry(path, kind, member.mode & 0o7777, member.size if kind == "file" else 0, link, sha)
