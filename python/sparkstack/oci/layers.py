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
from sparkstack.oci.model import (
    LAYER_GZIP, LAYER_TAR, LAYER_ZSTD, OPAQUE, WHITEOUT, BlobIdentity, Layer, digest_hex, same_blob_file,
)
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
def digest_first(outer: HashingReader, digest: str, label: str) -> Iterator[None]:
    """Report a content error in a blob that does not match its digest as that mismatch: the root cause."""
    try:
        yield
    except SparkstackError:
        outer.drain()
        if "sha256:" + outer.hash.hexdigest() != digest:
            raise SparkstackError(f"{label}: blob does not match its digest") from None
        raise


@contextmanager
def uncompressed(raw: BinaryIO, media_type: str, label: str) -> Iterator[BinaryIO]:
    """The layer's tar stream. `label` names the source and layer in every decompression error."""
    if media_type == LAYER_GZIP:
        yield _GunzipReader(raw, label)
    elif media_type == LAYER_ZSTD:
        yield _ZstdReader(raw, label)
    elif media_type == LAYER_TAR:
        yield raw
    else:
        raise SparkstackError(f"{label}: unsupported layer media type {media_type}")


class _GunzipReader(io.RawIOBase):
    """Streaming gunzip over concatenated members, without gzip.GzipFile's extra buffering.

    Output is bounded by the caller's buffer (a gzip bomb never inflates a whole input chunk at once),
    and input that ends inside a member is an error, not a quiet end of the tar.
    """

    def __init__(self, raw: BinaryIO, label: str) -> None:
        self.raw, self.label = raw, label
        self.z, self.tail = zlib.decompressobj(31), b""

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while True:
            if not self.tail:
                self.tail = self.raw.read(fsio.CHUNK)
                if not self.tail:
                    if self.z.eof:
                        return 0
                    out = self._inflate(b"", len(buf))  # zlib may still hold output for input it has taken
                    if not out:  # also an empty blob: no gzip member at all
                        raise SparkstackError(f"{self.label}: truncated gzip layer (the stream ends mid-member)")
                    buf[: len(out)] = out
                    return len(out)
            if self.z.eof:  # the next gzip member follows
                self.z = zlib.decompressobj(31)
            out = self._inflate(self.tail, len(buf))
            self.tail = self.z.unused_data if self.z.eof else self.z.unconsumed_tail
            if out:
                buf[: len(out)] = out
                return len(out)

    def _inflate(self, data: bytes, limit: int) -> bytes:
        try:
            return self.z.decompress(data, limit)
        except zlib.error as exc:
            raise SparkstackError(f"{self.label}: corrupt gzip layer ({exc})") from None


ZSTD_MAGIC = 0xFD2FB528


class ZstdFrames:
    """Follows zstd frame structure over the compressed bytes (headers and block sizes only).

    zstandard's stream reader stops quietly when its input ends mid-frame; this tells a complete
    stream from a truncated one. Fed every byte the decompressor reads.
    """

    def __init__(self) -> None:
        self.frames, self.error = 0, ""
        self._skip, self._want, self._got, self._next = 0, 4, bytearray(), self._magic
        self._checksum = False

    @property
    def complete(self) -> bool:
        return not self.error and self.frames > 0 and not self._skip and not self._got and self._next == self._magic

    def feed(self, data: bytes) -> None:
        view, i = memoryview(data), 0
        while i < len(view) and not self.error:
            if self._skip:
                n = min(self._skip, len(view) - i)
                self._skip, i = self._skip - n, i + n
                continue
            n = min(self._want - len(self._got), len(view) - i)
            self._got += view[i:i + n]
            i += n
            if len(self._got) == self._want:
                field, self._got = bytes(self._got), bytearray()
                self._next(field)

    def _expect(self, n: int, then) -> None:
        self._want, self._next = n, then

    def _magic(self, field: bytes) -> None:
        magic = int.from_bytes(field, "little")
        if magic == ZSTD_MAGIC:
            self._expect(1, self._frame_header)
        elif magic & 0xFFFFFFF0 == 0x184D2A50:  # a skippable frame: a 4-byte size, then that many bytes
            self._expect(4, self._skippable)
        else:
            self.error = f"no zstd frame at magic {field.hex()}"

    def _skippable(self, field: bytes) -> None:
        self._skip = int.from_bytes(field, "little")
        self._expect(4, self._magic)

    def _frame_header(self, field: bytes) -> None:
        d = field[0]
        if d & 0x08:
            self.error = "reserved bit set in a zstd frame header"
            return
        single = (d >> 5) & 1
        fcs = (d >> 6) & 3
        self._checksum = bool(d & 0x04)
        # window descriptor, dictionary id, frame content size
        self._skip = (0 if single else 1) + (0, 1, 2, 4)[d & 3] + ((1 if single else 0), 2, 4, 8)[fcs]
        self._expect(3, self._block)

    def _block(self, field: bytes) -> None:
        header = int.from_bytes(field, "little")
        last, kind, size = header & 1, (header >> 1) & 3, header >> 3
        if kind == 3:
            self.error = "reserved zstd block type"
            return
        self._skip = 1 if kind == 1 else size  # an RLE block stores one byte
        if last:
            self.frames += 1
            self._skip += 4 if self._checksum else 0
            self._expect(4, self._magic)


class _Tap(io.RawIOBase):
    """Passes reads through, showing each chunk to `see` on the way."""

    def __init__(self, raw: BinaryIO, see: Callable[[bytes], None]) -> None:
        self.raw, self.see = raw, see

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.see(data)
        return data


class _ZstdReader(io.RawIOBase):
    def __init__(self, raw: BinaryIO, label: str) -> None:
        import zstandard

        self.label, self.errors, self.frames = label, zstandard.ZstdError, ZstdFrames()
        self.reader = zstandard.ZstdDecompressor().stream_reader(_Tap(raw, self.frames.feed), read_across_frames=True,
                                                                  closefd=False)

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        try:
            n = self.reader.readinto(buf)
        except self.errors as exc:
            raise SparkstackError(f"{self.label}: corrupt zstd layer ({exc})") from None
        if self.frames.error:
            raise SparkstackError(f"{self.label}: corrupt zstd layer ({self.frames.error})")
        if n == 0 and not self.frames.complete:
            raise SparkstackError(f"{self.label}: truncated zstd layer (the stream ends mid-frame)")
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

    def load(self, digest: str, identity: BlobIdentity, diff_id: str) -> LayerIndex | None:
        """The cached index, only if it was verified from this very file, unchanged, for this diff_id.

        Anything else (another copy of the blob, a rewritten one, a config naming another diff_id,
        an index from an older sparkstack) is a miss, and the layer is scanned and verified again.
        """
        try:
            doc = json.loads(self._index_path(digest).read_text())
            saved = BlobIdentity(*doc["identity"])
            if doc["digest"] != digest or doc["diff_id"] != diff_id or not same_blob_file(saved, identity):
                return None
            entries = {e[0]: Entry(*e) for e in doc["entries"]}
        except (OSError, ValueError, KeyError, TypeError):
            return None
        self.stats["index_hits"] += 1
        return LayerIndex(digest, entries)

    def save(self, index: LayerIndex, identity: BlobIdentity, diff_id: str) -> None:
        """Record an index verified from the file `identity` names, whose content hashed to `diff_id`."""
        path = self._index_path(index.digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"digest": index.digest, "diff_id": diff_id, "identity": identity.to_json(),
               "entries": [[e.path, e.kind, e.mode, e.size, e.link, e.sha256] for e in index.entries.values()]}
        fsio.write_atomic(path, json.dumps(doc).encode())

    def put_object(self, sha256: str, data: bytes) -> None:
        path = self.object_path(sha256)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            fsio.write_atomic(path, data)

    def read_object(self, sha256: str) -> bytes | None:
        """A captured file's bytes, or None when the object is missing or corrupt (a corrupt one is removed,
        so the caller re-reads its layer: a damaged cache costs a re-read, never a build)."""
        path = self.object_path(sha256)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        if hashlib.sha256(data).hexdigest() != sha256:
            path.unlink(missing_ok=True)
            return None
        return data


def scan_layer(src: BlobSource, layer: Layer, cache: LayerCache, capture: Callable[[str], bool],
               on_progress: Callable[[int], None] | None = None) -> LayerIndex:
    """Stream one layer: verify its digest and diff_id, index every entry, keep wanted file contents."""
    index = LayerIndex(layer.digest)
    label = f"{src.label}: layer {layer.digest}"
    identity = src.blob_identity(layer.digest)  # before reading: what is verified below is this file's content
    with src.open_blob(layer.digest) as raw:
        outer = HashingReader(raw, on_progress)
        with digest_first(outer, layer.digest, label), \
                uncompressed(io.BufferedReader(outer, fsio.CHUNK), layer.media_type, label) as plain:
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
    if outer.count != layer.size:
        raise SparkstackError(f"{label}: blob is {outer.count} bytes, its descriptor says {layer.size}")
    if "sha256:" + outer.hash.hexdigest() != layer.digest:
        raise SparkstackError(f"{label}: blob does not match its digest")
    if "sha256:" + inner.hash.hexdigest() != layer.diff_id:
        raise SparkstackError(f"{label}: diffid mismatch (uncompressed content does not match the config)")
    if src.blob_identity(layer.digest) == identity:  # not rewritten while it was read
        cache.save(index, identity, layer.diff_id)
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
