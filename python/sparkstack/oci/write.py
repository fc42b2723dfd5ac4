"""Write images: one deterministic layer, a derived config, manifest, index and a docker manifest.json.

Same inputs give the same bytes: entries sorted, fixed mtime, uid/gid 0,
normalised modes, no PAX times, gzip with a fixed header.
"""

from __future__ import annotations

import copy
import dataclasses
import gzip
import hashlib
import io
import os
import posixpath
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from sparkstack import fsio, outputs
from sparkstack.errors import SparkstackError
from sparkstack.oci.model import (
    CONTAINERD_NAME, INDEX_V1, LAYER_GZIP, MANIFEST_V1, OPAQUE, REF_NAME, WHITEOUT, Image, Layer, canonical_json,
    digest_hex, manifest_for, sha256_digest,
)
from sparkstack.oci.source import BlobSource


@dataclass(frozen=True)
class LayerItem:
    """One thing the new layer holds: a file (from bytes or a path), a whiteout, or an opaque dir marker."""

    path: str  # relative to the root
    kind: str  # "file", "whiteout" or "opaque"
    data: bytes | None = None
    source: Path | None = None
    executable: bool = False


@dataclass(frozen=True)
class BuiltLayer:
    blob: Path
    layer: Layer


MAX_EPOCH = 253402300799  # 9999-12-31T23:59:59Z: the last second an ISO timestamp in a config can name


def source_date_epoch() -> int:
    value = os.environ.get("SOURCE_DATE_EPOCH", "0")
    if not (value.isascii() and value.isdigit() and len(value) <= 12 and int(value) <= MAX_EPOCH):
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise SparkstackError(f"SOURCE_DATE_EPOCH={shown!r} is not a whole number of seconds up to {MAX_EPOCH}")
    return int(value)


def _tarinfo(name: str, kind: int, size: int, mode: int, epoch: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode, info.mtime = kind, size, mode, epoch
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


class _HashWriter(io.RawIOBase):
    def __init__(self, raw: BinaryIO) -> None:
        self.raw, self.hash, self.count = raw, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.hash.update(b)
        self.count += len(b)
        self.raw.write(b)
        return len(b)


def build_layer(items: list[LayerItem], workdir: Path, epoch: int) -> BuiltLayer:
    """Write the layer as a gzip blob in `workdir`, returning its digest, size and diff_id."""
    names: dict[str, LayerItem] = {}
    for item in items:
        path = posixpath.normpath(item.path.strip("/"))
        if path.startswith("..") or path == ".":
            raise SparkstackError(f"layer path {item.path!r} is outside the root")
        if item.kind == "whiteout":
            d, b = posixpath.split(path)
            path = posixpath.join(d, WHITEOUT + b)
        elif item.kind == "opaque":
            path = posixpath.join(path, OPAQUE)
        names[path] = item
    dirs = set()
    for path in names:
        d = posixpath.dirname(path)
        while d:
            dirs.add(d)
            d = posixpath.dirname(d)
    blob = workdir / "layer.tar.gz.partial"
    with open(blob, "wb") as f:
        outer = _HashWriter(f)
        with gzip.GzipFile(filename="", mode="wb", fileobj=outer, mtime=0, compresslevel=6) as gz:
            inner = _HashWriter(gz)
            with tarfile.open(fileobj=inner, mode="w|", format=tarfile.GNU_FORMAT) as tar:
                for path in sorted(dirs | set(names)):
                    item = names.get(path)
                    if item is None:
                        tar.addfile(_tarinfo(path, tarfile.DIRTYPE, 0, 0o755, epoch))
                    elif item.kind in ("whiteout", "opaque"):
                        tar.addfile(_tarinfo(path, tarfile.REGTYPE, 0, 0o644, epoch), io.BytesIO(b""))
                    else:
                        _add_file(tar, path, item, epoch)
        f.flush()
        os.fsync(f.fileno())
    digest = "sha256:" + outer.hash.hexdigest()
    final = workdir / digest_hex(digest)
    os.replace(blob, final)
    return BuiltLayer(final, Layer(digest, LAYER_GZIP, outer.count, "sha256:" + inner.hash.hexdigest()))


def _add_file(tar: tarfile.TarFile, path: str, item: LayerItem, epoch: int) -> None:
    mode = 0o755 if item.executable else 0o644
    if item.data is not None:
        tar.addfile(_tarinfo(path, tarfile.REGTYPE, len(item.data), mode, epoch), io.BytesIO(item.data))
        return
    with open(item.source, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        tar.addfile(_tarinfo(path, tarfile.REGTYPE, size, mode, epoch), f)


def _iso(epoch: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def derive_config(base: dict, layer: Layer, labels: dict[str, str], created_by: str, epoch: int) -> dict:
    config = copy.deepcopy(base)
    config.setdefault("rootfs", {"type": "layers", "diff_ids": []})["diff_ids"].append(layer.diff_id)
    if isinstance(config.get("history"), list):
        config["history"].append({"created": _iso(epoch), "created_by": created_by, "comment": "sparkstack image build"})
    run = config.setdefault("config", {})
    run["Labels"] = {**(run.get("Labels") or {}), **labels}
    config["created"] = _iso(epoch)
    return config


@dataclass(frozen=True)
class ImageDocs:
    """Everything small that describes the new image, as bytes ready to write."""

    config: bytes
    manifest: bytes
    index: bytes
    docker_manifest: bytes
    config_digest: str
    manifest_digest: str
    layers: tuple[Layer, ...]
    name: str


def image_docs(base: Image, new_layer: Layer, labels: dict[str, str], created_by: str, repo: str, tag_prefix: str,
               epoch: int, index_annotations: dict[str, str]) -> ImageDocs:
    """The new image's documents. Its tag is `<tag_prefix>-<first 12 hex of the config digest>`.

    `index_annotations` go on index.json itself (who wrote the output, from which inputs); they
    change neither the manifest nor the config, so the image's identity does not depend on them."""
    config = canonical_json(derive_config(base.config, new_layer, labels, created_by, epoch))
    config_digest = sha256_digest(config)
    tag = f"{tag_prefix}-{digest_hex(config_digest)[:12]}"
    name = f"{repo}:{tag}"
    layers = base.layers + (new_layer,)
    manifest, _ = manifest_for(config_digest, len(config), layers)
    manifest_digest = sha256_digest(manifest)
    os_name, arch, *variant = base.platform.split("/")
    platform = {"os": os_name, "architecture": arch, **({"variant": variant[0]} if variant else {})}
    index = canonical_json({
        "schemaVersion": 2,
        "mediaType": INDEX_V1,
        "manifests": [{"mediaType": MANIFEST_V1, "digest": manifest_digest, "size": len(manifest),
                       "platform": platform, "annotations": {REF_NAME: tag, CONTAINERD_NAME: name}}],
        **({"annotations": dict(index_annotations)} if index_annotations else {}),
    })
    docker = canonical_json([{
        "Config": f"blobs/sha256/{digest_hex(config_digest)}",
        "RepoTags": [name],
        "Layers": [f"blobs/sha256/{digest_hex(l.digest)}" for l in layers],
    }])
    return ImageDocs(config, manifest, index, docker, config_digest, manifest_digest, layers, name)


OCI_LAYOUT = b'{"imageLayoutVersion":"1.0.0"}'


LINK_BASE = ("hardlink", "symlink")


def write_output(out: Path, docs: ImageDocs, base_src: BlobSource, built: BuiltLayer, epoch: int,
                 marker: outputs.OutputMarker, link_base: str = "hardlink") -> str:
    """Write the image as an OCI layout dir (base blobs linked) or, for *.tar, one archive.

    `link_base` says how a dir reuses a base blob that is a file: "hardlink" (copied across
    filesystems), or "symlink", absolute, to the blob's resolved path (a Nix build user may not
    hardlink store files, and a copy would duplicate the whole base). A base read from a tar
    has no blob files, so its blobs are copied either way.
    A dir also gets `marker` as `.sparkstack/output.json`, with the identity of every blob it holds,
    so a blob rewritten in place later is noticed (a tar carries the marker in index.json's
    annotations). Returns "dir" or "tar". Both are published atomically.
    """
    if link_base not in LINK_BASE:
        raise SparkstackError(f"link_base {link_base!r}: expected one of {', '.join(LINK_BASE)}")
    small = {
        "oci-layout": OCI_LAYOUT,
        "index.json": docs.index,
        "manifest.json": docs.docker_manifest,
        f"blobs/sha256/{digest_hex(docs.config_digest)}": docs.config,
        f"blobs/sha256/{digest_hex(docs.manifest_digest)}": docs.manifest,
    }
    base_layers = docs.layers[:-1]
    if out.name.endswith(".tar"):
        _write_tar(out, small, base_layers, base_src, built, epoch)
        return "tar"
    with fsio.staging_dir(out.absolute().parent, out.name) as stage:
        blobs = stage / "blobs" / "sha256"
        blobs.mkdir(parents=True)
        for name, data in small.items():
            fsio.write_durable(stage / name, data)
        fsio.link_or_copy(built.blob, blobs / digest_hex(built.layer.digest))
        for layer in base_layers:
            dest = blobs / digest_hex(layer.digest)
            if dest.exists():
                continue
            path = base_src.blob_file(layer.digest)
            if path is not None and link_base == "symlink":
                os.symlink(path.resolve(strict=True), dest)
            elif path is not None:
                fsio.link_or_copy(path.resolve(), dest)
            else:
                _copy_blob(base_src, layer, dest)
        files = tuple((f"blobs/sha256/{p.name}", fsio.file_identity(p)) for p in sorted(blobs.iterdir()))
        (stage / outputs.MARKER).parent.mkdir()
        fsio.write_durable(stage / outputs.MARKER, dataclasses.replace(marker, files=files).to_bytes())
        for d in (blobs, blobs.parent, (stage / outputs.MARKER).parent, stage):
            fsio.fsync_dir(d)
        fsio.replace_dir(stage, out.absolute())
    return "dir"


def _copy_blob(src: BlobSource, layer: Layer, dest: Path) -> None:
    h = hashlib.sha256()
    with src.open_blob(layer.digest) as fin, open(dest, "xb") as fout:
        while chunk := fin.read(fsio.CHUNK):
            h.update(chunk)
            fout.write(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    if "sha256:" + h.hexdigest() != layer.digest:
        raise SparkstackError(f"{src.label}: blob {layer.digest} does not match its digest")


def _write_tar(out: Path, small: dict[str, bytes], base_layers, base_src: BlobSource, built: BuiltLayer, epoch: int) -> None:
    out = out.absolute()
    blobs = {f"blobs/sha256/{digest_hex(l.digest)}": l for l in base_layers}
    blobs[f"blobs/sha256/{digest_hex(built.layer.digest)}"] = built.layer
    # Staged in a dir beside --out named by our pid: a run killed mid-write leaves it for the next run to remove.
    with fsio.staging_dir(out.parent, out.name) as stage:
        tmp = stage / "image.tar"
        with open(tmp, "wb") as f:
            with tarfile.open(fileobj=f, mode="w|", format=tarfile.GNU_FORMAT) as tar:
                for d in ("blobs", "blobs/sha256"):
                    tar.addfile(_tarinfo(d, tarfile.DIRTYPE, 0, 0o755, epoch))
                for name in sorted(set(small) | set(blobs)):
                    if name in small:
                        data = small[name]
                        tar.addfile(_tarinfo(name, tarfile.REGTYPE, len(data), 0o644, epoch), io.BytesIO(data))
                    elif blobs[name] is built.layer:
                        with open(built.blob, "rb") as b:
                            tar.addfile(_tarinfo(name, tarfile.REGTYPE, built.layer.size, 0o644, epoch), b)
                    else:
                        layer = blobs[name]
                        with base_src.open_blob(layer.digest) as b:
                            tar.addfile(_tarinfo(name, tarfile.REGTYPE, layer.size, 0o644, epoch), b)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
        fsio.fsync_dir(out.parent)
