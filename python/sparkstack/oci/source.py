"""Image sources without a daemon: OCI layout dirs, oci-archive tars and docker-archive tars.

`open_image` picks one platform's manifest and config from a source. Every document is
validated (oci/documents.py) and checked against its descriptor's size and digest as it is
read; layer blobs are checked for size here and for content when a layer is scanned.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tarfile
from pathlib import Path
from typing import BinaryIO

from sparkstack import fsio
from sparkstack.errors import SparkstackError
from sparkstack.oci.documents import (
    MAX_DOCUMENT, MAX_INDEX_DEPTH, Descriptor, check_layout_marker, config_parts, docker_entries, index_entries,
    manifest_parts, member_name, parse_json,
)
from sparkstack.oci.model import (
    INDEX_V1, LAYER_GZIP, LAYER_TAR, LAYER_ZSTD, MANIFEST_V1, OCI_EQUIVALENT,
    BlobIdentity, Image, Layer, digest_hex, manifest_for, sha256_digest,
)

# ---------------------------------------------------------------- reading files safely


def open_regular(path: Path, what: str) -> BinaryIO:
    """Open a regular file for reading. O_NONBLOCK so a fifo planted at `path` cannot hang the open."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SparkstackError(f"{what} is missing") from None
    except OSError as exc:
        raise SparkstackError(f"{what}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SparkstackError(f"{what} is not a regular file")
    return os.fdopen(fd, "rb")


def read_limited(f: BinaryIO, limit: int, what: str) -> bytes:
    data = f.read(limit + 1)
    if len(data) > limit:
        raise SparkstackError(f"{what} is larger than {limit} bytes; refusing to read it as a document")
    return data


# ---------------------------------------------------------------- blob sources


class BlobSource:
    """Where an image's blobs live. Subclasses know one container format."""

    label: str

    def open_blob(self, digest: str) -> BinaryIO:
        raise NotImplementedError

    def blob_identity(self, digest: str) -> BlobIdentity:
        """The file and place the blob's bytes are read from, so a cache can tell them apart from any other."""
        raise NotImplementedError

    def blob_file(self, digest: str) -> Path | None:
        """A real file holding the blob, when there is one (so outputs can hardlink it)."""
        return None

    def read_blob(self, digest: str, size: int, what: str) -> bytes:
        """A small blob (manifest, config, nested index), checked against its descriptor's size and digest."""
        where = f"{self.label}: {what} {digest}"
        if size > MAX_DOCUMENT:
            raise SparkstackError(f"{where}: descriptor size {size} is too large for a {what}")
        with self.open_blob(digest) as f:
            data = f.read(size + 1)
        if len(data) != size:
            actual = f"more than {size}" if len(data) > size else str(len(data))
            raise SparkstackError(f"{where}: blob is {actual} bytes, its descriptor says {size}")
        if sha256_digest(data) != digest:
            raise SparkstackError(f"{where}: blob does not match its digest")
        return data

    def read_document(self, digest: str, size: int, what: str) -> object:
        return parse_json(self.read_blob(digest, size, what), f"{self.label}: {what} {digest}")

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
        # Follows symlinked blobs (the Nix side hands over store paths); what is read is checked by digest.
        return open_regular(self.blob_file(digest), f"{self.label}: blob {digest}")

    def blob_identity(self, digest: str) -> BlobIdentity:
        what = f"{self.label}: blob {digest}"
        try:
            st = os.stat(self.blob_file(digest))  # of the target: a symlinked store path is that file
        except FileNotFoundError:
            raise SparkstackError(f"{what} is missing") from None
        except OSError as exc:
            raise SparkstackError(f"{what}: {exc.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise SparkstackError(f"{what} is not a regular file")
        return BlobIdentity.of(st, 0, st.st_size)

    def read_json(self, name: str) -> object:
        where = f"{self.root / name}"
        with open_regular(self.root / name, where) as f:
            return parse_json(read_limited(f, MAX_DOCUMENT, where), where)


class TarArchive(BlobSource):
    """An oci-archive or docker-archive tar, read in place (members are seekable in a plain tar)."""

    def __init__(self, path: Path) -> None:
        self.label = str(path)
        try:
            self.tar = tarfile.open(path, "r:")
        except (tarfile.TarError, OSError) as exc:
            raise SparkstackError(f"{path}: not a readable tar ({exc})") from None
        try:
            members = self.tar.getmembers()
        except (tarfile.TarError, OSError) as exc:
            self.tar.close()
            raise SparkstackError(f"{path}: not a readable tar ({exc})") from None
        self.members = {}
        for m in members:
            if m.isfile():
                try:
                    self.members[member_name(m.name.lstrip("/"), self.label, "member")] = m
                except SparkstackError:
                    continue  # a member outside the archive root is no blob or document of ours

    def has(self, name: str) -> bool:
        return name in self.members

    def open_member(self, name: str) -> BinaryIO:
        member = self.members.get(name)
        if member is None:
            raise SparkstackError(f"{self.label}: no member {name}")
        return self.tar.extractfile(member)

    def member_identity(self, name: str) -> BlobIdentity:
        member = self.members.get(name)
        if member is None:
            raise SparkstackError(f"{self.label}: no member {name}")
        return BlobIdentity.of(os.fstat(self.tar.fileobj.fileno()), member.offset_data, member.size)

    def read_json(self, name: str) -> object:
        where = f"{self.label}: {name}"
        with self.open_member(name) as f:
            return parse_json(read_limited(f, MAX_DOCUMENT, where), where)

    def _blob_member(self, digest: str) -> str:
        try:
            return f"blobs/sha256/{digest_hex(digest)}"
        except ValueError as exc:
            raise SparkstackError(f"{self.label}: {exc}") from None

    def open_blob(self, digest: str) -> BinaryIO:
        return self.open_member(self._blob_member(digest))

    def blob_identity(self, digest: str) -> BlobIdentity:
        return self.member_identity(self._blob_member(digest))

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

    def blob_identity(self, digest: str) -> BlobIdentity:
        if digest in self.by_digest:
            return self.member_identity(self.by_digest[digest])
        return super().blob_identity(digest)


# ---------------------------------------------------------------- opening an image


def open_image(path: str | os.PathLike, platform: str | None = "linux/arm64") -> tuple[BlobSource, Image]:
    """Open an image source and pick the manifest for `platform` (None: the only image it holds)."""
    p = Path(path)
    if p.is_dir():
        src = LayoutDir(p)
        if not os.path.lexists(p / "oci-layout"):
            raise SparkstackError(f"{p}: not an OCI layout (no oci-layout file)")
        return src, _checked(src, lambda: _from_layout(src, platform, f"{p}/"))
    if not p.is_file():
        raise SparkstackError(f"{p}: no such image (expected an OCI layout dir or an image tar)")
    if p.name.endswith((".gz", ".tgz", ".zst")):
        raise SparkstackError(f"{p}: compressed image tars are not supported; decompress it first")
    tar = TarArchive(p)
    if tar.has("index.json") and tar.has("oci-layout"):
        return tar, _checked(tar, lambda: _from_layout(tar, platform, f"{p}: "))
    if tar.has("manifest.json"):
        tar.close()
        docker = DockerArchive(p)
        return docker, _checked(docker, lambda: _from_docker_manifest(docker, platform))
    tar.close()
    if tar.has("index.json"):
        raise SparkstackError(f"{p}: holds index.json but no oci-layout file; not an OCI archive")
    raise SparkstackError(f"{p}: neither an OCI archive (index.json) nor a docker archive (manifest.json)")


def _from_layout(src: LayoutDir | TarArchive, platform: str | None, prefix: str) -> Image:
    """An OCI layout, as a dir or an oci-archive: its oci-layout marker, then index.json."""
    check_layout_marker(src.read_json("oci-layout"), f"{prefix}oci-layout")
    return _from_index(src, src.read_json("index.json"), platform, f"{prefix}index.json")


def _checked(src: BlobSource, load) -> Image:
    """Load the image; every layer blob must be there, a regular file, of the size its descriptor says."""
    try:
        image = load()
        for layer in image.layers:
            actual = src.blob_identity(layer.digest).size
            if actual != layer.size:
                raise SparkstackError(f"{src.label}: layer {layer.digest}: blob is {actual} bytes, "
                                      f"its descriptor says {layer.size}")
        return image
    except BaseException:
        src.close()
        raise


def _platform_matches(have: str, want: str | None) -> bool:
    if want is None:
        return True
    h, w = have.split("/"), want.split("/")
    return h[:2] == w[:2] and (len(w) < 3 or (len(h) > 2 and h[2] == w[2]))


def _from_index(src: BlobSource, doc: object, platform: str | None, where: str) -> Image:
    seen: list[str] = []
    image = _search(src, index_entries(doc, where), platform, where, seen, set(), 0)
    if image is None:
        found = list(dict.fromkeys(seen))  # an index may list the same platform many times
        shown = ", ".join(found[:8]) + (f" and {len(found) - 8} more" if len(found) > 8 else "")
        raise SparkstackError(f"{src.label}: no {platform or 'single'} image (found: {shown or 'none'}); use --platform")
    return image


def _search(src: BlobSource, entries: tuple[Descriptor, ...], platform: str | None, where: str,
            seen: list[str], visited: set[str], depth: int) -> Image | None:
    """Depth-first through an index and its nested indexes; each blob is read at most once."""
    if platform is None and len(entries) > 1:
        raise SparkstackError(f"{where}: holds {len(entries)} manifests; pick one with --platform")
    for desc in entries:
        if desc.platform is not None and not _platform_matches(desc.platform, platform):
            seen.append(desc.platform)
            continue
        if desc.digest in visited:
            continue
        visited.add(desc.digest)
        media = OCI_EQUIVALENT.get(desc.media_type, desc.media_type)
        if media == INDEX_V1:  # a nested multi-arch index
            if depth >= MAX_INDEX_DEPTH:
                raise SparkstackError(f"{where}: indexes nest more than {MAX_INDEX_DEPTH} deep")
            nested_where = f"{src.label}: index {desc.digest}"
            nested = index_entries(src.read_document(desc.digest, desc.size, "index"), nested_where)
            image = _search(src, nested, platform, nested_where, seen, visited, depth + 1)
            if image is not None:
                return image
        elif media == MANIFEST_V1:
            image = _load_manifest(src, desc)
            if _platform_matches(image.platform, platform):
                return image
            seen.append(image.platform)
        # anything else (a signature, an attestation, an artifact) is not an image to pick
    return None


def _load_manifest(src: BlobSource, desc: Descriptor) -> Image:
    manifest = src.read_document(desc.digest, desc.size, "manifest")
    config_desc, layer_descs = manifest_parts(manifest, f"{src.label}: manifest {desc.digest}")
    config = src.read_document(config_desc.digest, config_desc.size, "config")
    platform, diff_ids = config_parts(config, f"{src.label}: config {config_desc.digest}", len(layer_descs))
    layers = tuple(Layer(d.digest, d.media_type, d.size, diff_id) for d, diff_id in zip(layer_descs, diff_ids))
    return Image(desc.digest, manifest, config_desc.digest, config, layers, platform)


def _from_docker_manifest(src: DockerArchive, platform: str | None) -> Image:
    entries = docker_entries(src.read_json("manifest.json"), f"{src.label}: manifest.json")
    if len(entries) != 1:
        raise SparkstackError(f"{src.label}: manifest.json must describe exactly one image, not {len(entries)}")
    config_name, layer_names = entries[0]
    config_digest = src.register(config_name)
    config_size = src.members[config_name].size
    config = src.read_document(config_digest, config_size, "config")
    image_platform, diff_ids = config_parts(config, f"{src.label}: {config_name}", len(layer_names))
    layers = []
    for name, diff_id in zip(layer_names, diff_ids):
        digest = src.register(name)
        with src.open_member(name) as f:
            media = _sniff_media_type(f.read(4))
        layers.append(Layer(digest, media, src.members[name].size, diff_id))
    if not _platform_matches(image_platform, platform):
        raise SparkstackError(f"{src.label}: image is {image_platform}, not {platform}; use --platform")
    # A docker archive has no manifest blob; describe it with the OCI manifest it stands for.
    manifest_bytes, manifest = manifest_for(config_digest, config_size, tuple(layers))
    return Image(sha256_digest(manifest_bytes), manifest, config_digest, config, tuple(layers), image_platform)


def _sniff_media_type(magic: bytes) -> str:
    if magic[:2] == b"\x1f\x8b":
        return LAYER_GZIP
    if magic == b"\x28\xb5\x2f\xfd":
        return LAYER_ZSTD
    return LAYER_TAR
