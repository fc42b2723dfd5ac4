"""Image sources without a daemon: OCI layout dirs, oci-archive tars and docker-archive tars.

`open_image` picks one platform's manifest and config from a source. Small
documents are checked against their digest as they are read.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import tarfile
from pathlib import Path
from typing import BinaryIO

from sparkstack import fsio
from sparkstack.errors import SparkstackError
from sparkstack.oci.model import (
    INDEX_V1, LAYER_GZIP, LAYER_TAR, LAYER_ZSTD, OCI_EQUIVALENT,
    Image, Layer, digest_hex, manifest_for, sha256_digest,
)

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
    manifest_bytes, manifest = manifest_for(config_digest, len(src.read_blob(config_digest)), tuple(layers))
    return Image(sha256_digest(manifest_bytes), manifest, config_digest, config, tuple(layers), image_platform)


def _sniff_media_type(magic: bytes) -> str:
    if magic[:2] == b"\x1f\x8b":
        return LAYER_GZIP
    if magic == b"\x28\xb5\x2f\xfd":
        return LAYER_ZSTD
    return LAYER_TAR
