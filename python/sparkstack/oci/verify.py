"""`image verify`: re-hash every blob of an image and check each layer's diff_id, trusting no cache."""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sparkstack import fsio
from sparkstack.errors import SparkstackError
from sparkstack.oci.model import Image, digest_hex
from sparkstack.oci.layers import HashingReader, uncompressed
from sparkstack.oci.source import BlobSource, DockerArchive, LayoutDir, TarArchive, open_image


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
            with src.open_blob(layer.digest) as raw:
                counted = HashingReader(raw, on_progress)
                with uncompressed(io.BufferedReader(counted, fsio.CHUNK), layer.media_type) as plain:
                    plain_hash = HashingReader(plain)
                    plain_hash.drain()
                counted.drain()
            diff_id = "sha256:" + plain_hash.hash.hexdigest()
            if "sha256:" + counted.hash.hexdigest() != layer.digest:
                raise SparkstackError(f"{path}: layer {layer.digest} does not match its digest")
            if diff_id != layer.diff_id:
                raise SparkstackError(f"{path}: layer {layer.digest} diffid mismatch: content is {diff_id}")
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
        path = src.root / "manifest.json"
        if not path.exists():
            return False
        entries = src.read_json("manifest.json")
    elif isinstance(src, TarArchive) and src.has("manifest.json"):
        entries = src.read_json("manifest.json")
    else:
        return False
    want_config = f"blobs/sha256/{digest_hex(image.config_digest)}"
    want_layers = [f"blobs/sha256/{digest_hex(l.digest)}" for l in image.layers]
    if not entries or entries[0].get("Config") != want_config or entries[0].get("Layers") != want_layers:
        raise SparkstackError(f"{src.label}: manifest.json does not describe the same image as index.json")
    return True
