"""`image verify`: re-hash every blob of an image and check each layer's diff_id, trusting no cache."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sparkstack import fsio
from sparkstack.errors import SparkstackError
from sparkstack.oci.documents import docker_entries
from sparkstack.oci.model import Image, digest_hex
from sparkstack.oci.layers import HashingReader, digest_first, uncompressed
from sparkstack.oci.source import BlobSource, DockerArchive, LayoutDir, TarArchive, open_image


@dataclass(frozen=True)
class ImageVerifyPlan:
    """What `image verify` would check, from the image's documents alone: no layer is hashed."""

    path: Path
    image: Image

    @property
    def bytes_to_check(self) -> int:
        return sum(layer.size for layer in self.image.layers)

    def to_json(self) -> dict:
        img = self.image
        return {"path": str(self.path), "config_digest": img.config_digest, "manifest_digest": img.manifest_digest,
                "layers": [{"digest": l.digest, "size": l.size, "diff_id": l.diff_id} for l in img.layers]}


def plan_image_verify(path: Path, platform: str | None) -> ImageVerifyPlan:
    """Read the image's documents (index, manifest, config) and close it again."""
    src, img = open_image(path, platform)
    src.close()
    return ImageVerifyPlan(path, img)


@dataclass(frozen=True)
class VerifyReport:
    path: str
    config_digest: str
    manifest_digest: str
    layers: int
    bytes_checked: int
    docker_manifest: bool

    def to_json(self) -> dict:
        return dict(self.__dict__)


def verify_image(path: Path, platform: str | None = None,
                 on_progress: Callable[[int], None] | None = None) -> VerifyReport:
    src, image = open_image(path, platform)
    try:
        checked = 0
        for layer in image.layers:
            label = f"{path}: layer {layer.digest}"
            with src.open_blob(layer.digest) as raw:
                counted = HashingReader(raw, on_progress)
                with digest_first(counted, layer.digest, label), \
                        uncompressed(io.BufferedReader(counted, fsio.CHUNK), layer.media_type, label) as plain:
                    plain_hash = HashingReader(plain)
                    plain_hash.drain()
                counted.drain()
            diff_id = "sha256:" + plain_hash.hash.hexdigest()
            if counted.count != layer.size:
                raise SparkstackError(f"{label}: blob is {counted.count} bytes, its descriptor says {layer.size}")
            if "sha256:" + counted.hash.hexdigest() != layer.digest:
                raise SparkstackError(f"{label}: blob does not match its digest")
            if diff_id != layer.diff_id:
                raise SparkstackError(f"{label}: diffid mismatch: content is {diff_id}")
            checked += counted.count
        docker = _check_docker_manifest(src, image)
    finally:
        src.close()
    return VerifyReport(str(path), image.config_digest, image.manifest_digest, len(image.layers), checked, docker)


def _check_docker_manifest(src: BlobSource, image: Image) -> bool:
    """An OCI layout that also carries manifest.json must point it at the same config and layers."""
    if isinstance(src, DockerArchive):
        return True
    if isinstance(src, LayoutDir):
        if not os.path.lexists(src.root / "manifest.json"):
            return False
        where = str(src.root / "manifest.json")
    elif isinstance(src, TarArchive) and src.has("manifest.json"):
        where = f"{src.label}: manifest.json"
    else:
        return False
    entries = docker_entries(src.read_json("manifest.json"), where)
    want = (f"blobs/sha256/{digest_hex(image.config_digest)}",
            tuple(f"blobs/sha256/{digest_hex(l.digest)}" for l in image.layers))
    if len(entries) != 1 or entries[0] != want:
        raise SparkstackError(f"{where}: does not describe the same image as index.json")
    return True
