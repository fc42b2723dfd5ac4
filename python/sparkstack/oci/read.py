"""Read images without a daemon: OCI layout dirs, oci-archive tars and docker-archive tars.

Blobs are verified against their digest the first time they are read. Each
layer's file index (and the content of the files asked for) is kept in a local
cache keyed by layer digest, so a rebuild on the same base reads no base layer
bytes again.
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
    INDEX_V1, LAYER_GZIP, LAYER_TAR, LAYER_ZSTD, OCI_EQUIVALENT,
    Image, Layer, digest_hex, sha256_digest,
)

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
MAX_LINK_HOPS = 40


# ---------------------------------------------------------------- blob sources


class BlobSource:
    """Where an image's blobs live. Subclasses know one container format."""

    label: str

    def open_blob(self, digest: str) -> BinaryIO:
        raise NotImplementedError

    def blob_file(self, digest: str) -> Path | None:
        """A real file holding the blob, when there is one (so outputs can hardlink it)."""
        return None

    def read_blob(self, digest: str, limit: int = 64 << 20) -> bytes:
        with self.open_blob(digest) as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise SparkstackError(f"{self.label}: blob {digest} is too large for a manifest or config")
        if sha256_digest(data) != digest:
            raise SparkstackError(f"{self.label}: blob {digest} does not match its digest")
        return data

    def close(self) -> None:
        pass


class LayoutDir(BlobSource):
    def __init__(self, root: Path) -> None:
        self.root, self.label = root, str(root)

    def blob_file(self, digest: str) -> Path:
        try:
            return self.root / "blobs" / "sha256" / digest_hex(digest)
        except ValueError as exc:
            raise SparkstackError(f"{self.label}: {exc}") from None

    def open_blob(self, digest: str) -> BinaryIO:
        path = self.blob_file(digest)
        try:
            return open(path, "rb")  # follows symlinked blobs (the Nix side hands over store paths)
        except FileNotFoundError:
            raise SparkstackError(f"{self.label}: blob {digest} is missing") from None

    def read_json(self, name: str) -> dict:
        try:
            return json.loads((self.root / name).read_bytes())
        except FileNotFoundError:
            raise SparkstackError(f"{self.label}: no {name}") from None
        except ValueError as exc:
            raise SparkstackError(f"{self.label}: {name} is not JSON ({exc})") from None


class TarArchive(BlobSource):
    """An oci-archive or docker-archive tar, read in place (members are seekable in a plain tar)."""

    def __init__(self, path: Path) -> None:
        self.label = str(path)
        try:
            self.tar = tarfile.open(path, "r:")
        except (tarfile.TarError, OSError) as exc:
            raise SparkstackError(f"{path}: not a readable tar ({exc})") from None
        self.members = {posixpath.normpath(m.name.lstrip("/")): m for m in self.tar.getmembers() if m.isfile()}

    def has(self, name: str) -> bool:
        return name in self.members

    def open_member(self, name: str) -> BinaryIO:
        member = self.members.get(name)
        if member is None:
            raise SparkstackError(f"{self.label}: no member {name}")
        return self.tar.extractfile(member)

    def read_json(self, name: str) -> object:
        with self.open_member(name) as f:
            try:
                return json.loads(f.read())
            except ValueError as exc:
                raise SparkstackError(f"{self.label}: {name} is not JSON ({exc})") from None

    def open_blob(self, digest: str) -> BinaryIO:
        try:
            return self.open_member(f"blobs/sha256/{digest_hex(digest)}")
        except ValueError as exc:
            raise SparkstackError(f"{self.label}: {exc}") from None

    def close(self) -> None:
        self.tar.close()


class DockerArchive(TarArchive):
    """docker save output: manifest.json names the config and layer files by path, not digest."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.by_digest: dict[str, str] = {}

    def register(self, name: str) -> str:
        """Hash a member once and remember it under its digest."""
        h = hashlib.sha256()
        with self.open_member(name) as f:
            while chunk := f.read(fsio.CHUNK):
                h.update(chunk)
        digest = "sha256:" + h.hexdigest()
        self.by_digest[digest] = name
        return digest

    def open_blob(self, digest: str) -> BinaryIO:
        if digest in self.by_digest:
            return self.open_member(self.by_digest[digest])
        return super().open_blob(digest)


# ---------------------------------------------------------------- opening an image


def open_image(path: str | os.PathLike, platform: str | None = "linux/arm64") -> tuple[BlobSource, Image]:
    """Open an image source and pick the manifest for `platform` (None: the only image it holds)."""
    p = Path(path)
    if p.is_dir():
        src = LayoutDir(p)
        if not (p / "oci-layout").exists():
            raise SparkstackError(f"{p}: not an OCI layout (no oci-layout file)")
        return src, _from_index(src, src.read_json("index.json"), platform)
    if not p.is_file():
        raise SparkstackError(f"{p}: no such image (expected an OCI layout dir or an image tar)")
    if p.name.endswith((".gz", ".tgz", ".zst")):
        raise SparkstackError(f"{p}: compressed image tars are not supported; decompress it first")
    tar = TarArchive(p)
    if tar.has("index.json") and tar.has("oci-layout"):
        return tar, _from_index(tar, tar.read_json("index.json"), platform)
    if tar.has("manifest.json"):
        tar.close()
        docker = DockerArchive(p)
        return docker, _from_docker_manifest(docker, platform)
    tar.close()
    raise SparkstackError(f"{p}: neither an OCI archive (index.json) nor a docker archive (manifest.json)")


def _platform_of(desc: dict) -> str | None:
    plat = desc.get("platform")
    if not isinstance(plat, dict):
        return None
    parts = [plat.get("os", ""), plat.get("architecture", "")]
    if plat.get("variant"):
        parts.append(plat["variant"])
    return "/".join(parts)


def _platform_matches(have: str, want: str | None) -> bool:
    if want is None:
        return True
    h, w = have.split("/"), want.split("/")
    return h[:2] == w[:2] and (len(w) < 3 or (len(h) > 2 and h[2] == w[2]))


def _from_index(src: BlobSource, index: object, platform: str | None) -> Image:
    if not isinstance(index, dict) or not isinstance(index.get("manifests"), list) or not index["manifests"]:
        raise SparkstackError(f"{src.label}: index.json lists no manifests")
    if platform is None and len(index["manifests"]) > 1:
        raise SparkstackError(f"{src.label}: holds {len(index['manifests'])} manifests; pick one with --platform")
    seen: list[str] = []
    for desc in index["manifests"]:
        media = OCI_EQUIVALENT.get(desc.get("mediaType"), desc.get("mediaType"))
        if media == INDEX_V1:  # a nested multi-arch index
            nested = json.loads(src.read_blob(desc["digest"]))
            try:
                return _from_index(src, nested, platform)
            except SparkstackError:
                continue
        declared = _platform_of(desc)
        if declared is not None and not _platform_matches(declared, platform):
            seen.append(declared)
            continue
        image = _load_manifest(src, desc["digest"])
        if _platform_matches(image.platform, platform):
            return image
        seen.append(image.platform)
    raise SparkstackError(f"{src.label}: no {platform or 'single'} image (found: {', '.join(seen) or 'none'}); use --platform")


def _config_platform(config: dict) -> str:
    parts = [config.get("os", ""), config.get("architecture", "")]
    if config.get("variant"):
        parts.append(config["variant"])
    return "/".join(parts)


def _diff_ids(src: BlobSource, config: dict, n_layers: int) -> list[str]:
    diff_ids = (config.get("rootfs") or {}).get("diff_ids")
    if not isinstance(diff_ids, list) or len(diff_ids) != n_layers:
        raise SparkstackError(f"{src.label}: config lists {len(diff_ids or [])} diff_ids for {n_layers} layers")
    return diff_ids


def _load_manifest(src: BlobSource, manifest_digest: str) -> Image:
    manifest = json.loads(src.read_blob(manifest_digest))
    config_digest = manifest["config"]["digest"]
    config = json.loads(src.read_blob(config_digest))
    diff_ids = _diff_ids(src, config, len(manifest.get("layers", [])))
    layers = tuple(
        Layer(d["digest"], OCI_EQUIVALENT.get(d["mediaType"], d["mediaType"]), d["size"], diff_id)
        for d, diff_id in zip(manifest["layers"], diff_ids)
    )
    return Image(manifest_digest, manifest, config_digest, config, layers, _config_platform(config))


def _from_docker_manifest(src: DockerArchive, platform: str | None) -> Image:
    entries = src.read_json("manifest.json")
    if not isinstance(entries, list) or len(entries) != 1:
        raise SparkstackError(f"{src.label}: manifest.json must describe exactly one image")
    entry = entries[0]
    config_digest = src.register(posixpath.normpath(entry["Config"]))
    config = json.loads(src.read_blob(config_digest))
    diff_ids = _diff_ids(src, config, len(entry["Layers"]))
    layers = []
    for name, diff_id in zip(entry["Layers"], diff_ids):
        name = posixpath.normpath(name)
        digest = src.register(name)
        with src.open_member(name) as f:
            media = _sniff_media_type(f.read(4))
        layers.append(Layer(digest, media, src.members[name].size, diff_id))
    image_platform = _config_platform(config)
    if not _platform_matches(image_platform, platform):
        raise SparkstackError(f"{src.label}: image is {image_platform}, not {platform}; use --platform")
    # A docker archive has no manifest blob; describe it with the OCI manifest it stands for.
    from sparkstack.oci.write import manifest_for

    manifest_bytes, manifest = manifest_for(config_digest, len(src.read_blob(config_digest)), tuple(layers))
    return Image(sha256_digest(manifest_bytes), manifest, config_digest, config, tuple(layers), image_platform)


def _sniff_media_type(magic: bytes) -> str:
    if magic[:2] == b"\x1f\x8b":
        return LAYER_GZIP
    if magic == b"\x28\xb5\x2f\xfd":
        return LAYER_ZSTD
    return LAYER_TAR


# ---------------------------------------------------------------- layer indexes


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


# ---------------------------------------------------------------- the merged root filesystem


class RootFS:
    """The union of an image's layers, as a container sees it, for the paths asked of it."""

    def __init__(self, src: BlobSource, image: Image, cache: LayerCache | None = None,
                 on_progress: Callable[[int], None] | None = None) -> None:
        self.src, self.image = src, image
        self.cache = cache or LayerCache.default()
        self.on_progress = on_progress
        self.layers: list[LayerIndex] = []

    def index(self, capture: Callable[[str], bool]) -> None:
        """Load every layer's index, scanning (and verifying) only layers the cache does not know."""
        self.layers = []
        for layer in self.image.layers:
            cached = self.cache.load(layer.digest)
            self.layers.append(cached or scan_layer(self.src, layer, self.cache, capture, self.on_progress))

    def lookup(self, path: str) -> tuple[int, Entry] | None:
        """The topmost entry for an exact path, honouring whiteouts and opaque dirs; no link following."""
        ancestors = []
        d = posixpath.dirname(path)
        while d:
            ancestors.append(d)
            d = posixpath.dirname(d)
        for i in range(len(self.layers) - 1, -1, -1):
            entries = self.layers[i].entries
            e = entries.get(path)
            if e is not None and e.kind != "opaque":
                return None if e.kind == "whiteout" else (i, e)
            if e is not None and e.kind == "opaque":
                return (i, Entry(path, "dir", 0o755, 0, "", None))
            for a in ancestors:
                hidden = entries.get(a)
                if hidden is not None and hidden.kind in ("whiteout", "opaque", "file", "symlink", "hardlink"):
                    return None
        return None

    def resolve(self, path: str, follow_last: bool = True) -> str:
        """Resolve symlinks the way the container would; absolute links stay inside the root."""
        todo = [p for p in path.split("/") if p]
        done: list[str] = []
        hops = 0
        while todo:
            name = todo.pop(0)
            if name == ".":
                continue
            if name == "..":
                if not done:
                    raise SparkstackError(f"{self.src.label}: {path!r} resolves outside the image root")
                done.pop()
                continue
            candidate = "/".join(done + [name])
            hit = self.lookup(candidate)
            if hit and hit[1].kind == "symlink" and (todo or follow_last):
                hops += 1
                if hops > MAX_LINK_HOPS:
                    raise SparkstackError(f"{self.src.label}: too many symlinks resolving {path!r}")
                target = hit[1].link
                if target.startswith("/"):
                    done = []
                todo = [p for p in target.split("/") if p] + todo
                continue
            done.append(name)
        return "/".join(done)

    def list_dir(self, directory: str) -> list[str]:
        """Names directly under `directory` in the merged view."""
        directory = self.resolve(directory)
        prefix = directory + "/" if directory else ""
        names = set()
        for layer in self.layers:
            for p in layer.entries:
                if p.startswith(prefix) and "/" not in p[len(prefix):]:
                    names.add(p[len(prefix):])
        return sorted(n for n in names if self.lookup(prefix + n) is not None)

    def read_files(self, paths: list[str]) -> dict[str, bytes | None]:
        """Contents of regular files (None where absent). Re-reads a layer only for contents not cached."""
        located: dict[str, tuple[int, Entry] | None] = {}
        for p in paths:
            located[p] = self._locate_file(p)
        missing_layers = {i for hit in located.values() if hit for i in [hit[0]]
                          if not self.cache.has_object(hit[1].sha256)}
        for i in sorted(missing_layers):
            wanted = {hit[1].path for hit in located.values() if hit and hit[0] == i}
            self.layers[i] = scan_layer(self.src, self.image.layers[i], self.cache, wanted.__contains__, self.on_progress)
        return {p: (self.cache.read_object(hit[1].sha256) if hit else None) for p, hit in located.items()}

    def _locate_file(self, path: str) -> tuple[int, Entry] | None:
        real = self.resolve(path)
        hit = self.lookup(real)
        if hit is None:
            return None
        i, e = hit
        if e.kind == "hardlink":
            target = safe_member_path(e.link, f"{self.src.label}: hardlink {e.path}")
            t = self.layers[i].entries.get(target)
            if t is None or t.kind != "file":
                raise SparkstackError(f"{self.src.label}: hardlink {e.path} points at {e.link!r}, not a file in its layer")
            return i, t
        if e.kind in ("device", "fifo", "other"):
            raise SparkstackError(f"{self.src.label}: {path} is a {e.kind} node; refusing to extract it")
        if e.kind != "file":
            raise SparkstackError(f"{self.src.label}: {path} is a {e.kind}, not a regular file")
        return hit
