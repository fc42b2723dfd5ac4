"""OCI/docker image data: descriptors, media types and what one image is made of. Pure data."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

MANIFEST_V1 = "application/vnd.oci.image.manifest.v1+json"
INDEX_V1 = "application/vnd.oci.image.index.v1+json"
CONFIG_V1 = "application/vnd.oci.image.config.v1+json"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
DOCKER_MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"

# Docker media types name the same bytes as their OCI twins.
OCI_EQUIVALENT = {
    "application/vnd.docker.container.image.v1+json": CONFIG_V1,
    "application/vnd.docker.image.rootfs.diff.tar": LAYER_TAR,
    "application/vnd.docker.image.rootfs.diff.tar.gzip": LAYER_GZIP,
    "application/vnd.docker.image.rootfs.diff.tar.zstd": LAYER_ZSTD,
    DOCKER_MANIFEST_V2: MANIFEST_V1,
    DOCKER_MANIFEST_LIST: INDEX_V1,
}

# Layer tar conventions: a whiteout hides a lower path, an opaque marker hides a dir's lower contents.
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"

REF_NAME = "org.opencontainers.image.ref.name"
CONTAINERD_NAME = "io.containerd.image.name"


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_json(doc: object) -> bytes:
    """The byte form sparkstack writes for manifests, configs and indexes: sorted, compact, stable."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def digest_hex(digest: str) -> str:
    algo, _, hexpart = digest.partition(":")
    if algo != "sha256" or len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
        raise ValueError(f"not a sha256 digest: {digest!r}")
    return hexpart


@dataclass(frozen=True)
class Layer:
    digest: str  # of the blob as stored (compressed or not)
    media_type: str  # OCI media type
    size: int
    diff_id: str  # sha256 of the uncompressed tar, from the config


@dataclass(frozen=True)
class BlobIdentity:
    """Which bytes on disk a blob is: the stat of the file holding it, and where in that file it sits."""

    device: int
    inode: int
    file_size: int
    mtime_ns: int
    ctime_ns: int
    links: int
    offset: int  # of the blob's first byte in the file (a tar member's data); 0 for a layout blob
    size: int  # the blob's own length

    @staticmethod
    def of(st, offset: int, size: int) -> BlobIdentity:
        return BlobIdentity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_nlink, offset, size)

    def to_json(self) -> list[int]:
        return [self.device, self.inode, self.file_size, self.mtime_ns, self.ctime_ns, self.links, self.offset, self.size]


def same_blob_file(saved: BlobIdentity, now: BlobIdentity) -> bool:
    """Is `now` the very file `saved` was verified from, unwritten since?

    Any write changes the ctime, and a write that also restores the mtime still does. The one ctime change
    forgiven is one that comes with a new link count: `image build` hardlinks base blobs into its output,
    which bumps the ctime of a blob nobody wrote.
    """
    if (saved.device, saved.inode, saved.file_size, saved.mtime_ns, saved.offset, saved.size) != (
            now.device, now.inode, now.file_size, now.mtime_ns, now.offset, now.size):
        return False
    return saved.ctime_ns == now.ctime_ns or saved.links != now.links


@dataclass(frozen=True)
class Image:
    """One platform's image: its manifest, config and layers, as read from a source."""

    manifest_digest: str
    manifest: dict
    config_digest: str
    config: dict
    layers: tuple[Layer, ...]
    platform: str  # "os/arch[/variant]"

    @property
    def identity(self) -> str:
        """The config digest: docker's image ID, which survives `docker load`."""
        return self.config_digest


def manifest_for(config_digest: str, config_size: int, layers: tuple[Layer, ...]) -> tuple[bytes, dict]:
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_V1,
        "config": {"mediaType": CONFIG_V1, "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": l.media_type, "digest": l.digest, "size": l.size} for l in layers],
    }
    return canonical_json(manifest), manifest
