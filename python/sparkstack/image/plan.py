"""The image build plan: everything `image build` will do, decided before a base layer byte is read.

The plan opens only the base's small documents (index, manifest, config), hashes
the overlay's inputs into one fingerprint, and compares it with the fingerprint
recorded by the previous output at --out. "Up to date" is decided here, and only
when that output is also complete: every blob present, at its size.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

from sparkstack import __version__, fsio, outputs
from sparkstack.errors import SparkstackError
from sparkstack.oci.model import CONTAINERD_NAME
from sparkstack.oci.source import open_image
from sparkstack.oci.write import LINK_BASE, source_date_epoch
from sparkstack.patch.engine import needed_paths
from sparkstack.patch.overlay import Overlay, Step, load_overlay
from sparkstack.patch.source import check_pinned, opened_source, require_source, source_files

COMMAND = "sparkstack image build"
# Bump when the same inputs would give a different image, so old outputs stop counting as up to date.
FORMAT_VERSION = 1


@dataclass(frozen=True)
class ExistingOutput:
    """The image already at --out, as its own documents describe it."""

    name: str | None  # its io.containerd.image.name, when the index carries one
    config_digest: str
    manifest_digest: str
    layer_digest: str


@dataclass(frozen=True)
class BuildPlan:
    base: Path
    platform: str
    base_manifest_digest: str
    base_config_digest: str
    overlay: Overlay
    overlay_src: Path  # as given: a dir or a bundle; patch.source.opened_source finds the files in it
    steps: tuple[Step, ...]
    variant: str
    wheel_dir: Path | None
    out: Path
    allow_unpinned: bool
    epoch: int
    link_base: str  # how a dir output reuses base blobs: "hardlink" or "symlink"
    fingerprint: str
    existing: ExistingOutput | None  # set only when the output at --out is this plan's, complete

    @property
    def up_to_date(self) -> bool:
        return self.existing is not None

    @property
    def marker(self) -> outputs.OutputMarker:
        return outputs.OutputMarker(COMMAND, self.fingerprint)

    def to_json(self) -> dict:
        o = self.overlay
        return {
            "base": str(self.base), "platform": self.platform, "base_manifest": self.base_manifest_digest,
            "base_config": self.base_config_digest, "out": str(self.out), "variant": self.variant,
            "overlay": {"name": o.name, "source": o.source_label, "given": str(self.overlay_src),
                        "unpinned": list(o.unpinned)},
            "installs": [{"src": i.file.path, "dest": f"/{o.vllm_root}/{i.dest}"} for i in o.installs],
            "steps": [{"name": s.name, "script": s.script.path, "args": list(s.args)} for s in self.steps],
            "extract": ["/" + p for p in needed_paths(o, self.steps)],
            "source_date_epoch": self.epoch, "link_base": self.link_base, "fingerprint": self.fingerprint,
            "up_to_date": self.up_to_date,
        }


def plan_build(base: Path, overlay_dir: Path, overlay_src: Path | None, out: Path, variant: str = "plain",
               platform: str = "linux/arm64", extra_steps: tuple[str, ...] = (), allow_unpinned: bool = False,
               wheel_dir: Path | None = None, link_base: str = "hardlink") -> BuildPlan:
    if link_base not in LINK_BASE:
        raise SparkstackError(f"--link-base {link_base!r}: expected one of {', '.join(LINK_BASE)}")
    overlay = load_overlay(overlay_dir)
    require_source(overlay, overlay_src)
    if variant != "plain" and variant not in overlay.variants:
        raise SparkstackError(f"{overlay.path}: no variant {variant!r} (have: plain, {', '.join(overlay.variants)})")
    if variant != "plain" and wheel_dir is None:
        raise SparkstackError(f"variant {variant} installs wheels: pass --wheels DIR")
    if overlay.unpinned and not allow_unpinned:
        raise SparkstackError(f"overlay {overlay.name} is unpinned ({', '.join(overlay.unpinned)}); "
                              "run `sparkstack pin overlay --overlay-src DIR` or pass --allow-unpinned")
    if out.resolve() == base.resolve() or out.resolve().is_relative_to(base.resolve()) \
            or base.resolve().is_relative_to(out.resolve()):
        raise SparkstackError(f"{out}: --out would overlap the base {base}; choose another --out")
    previous = claim_output(out)
    src, image = open_image(base, platform)
    src.close()
    steps = overlay.enabled_steps(extra_steps)
    epoch = source_date_epoch()
    with opened_source(overlay, overlay_src) as source_dir:
        check_pinned(overlay, source_dir, source_files(overlay, steps), overlay_src)
        inputs = _input_hashes(overlay, source_dir, steps, variant, wheel_dir)
    fingerprint = _fingerprint(image.manifest_digest, platform, overlay, steps, variant, inputs, epoch, link_base)
    existing = None
    if previous is not None and previous.fingerprint == fingerprint and previous.files_unchanged(out):
        existing = complete_output(out)
    return BuildPlan(base, platform, image.manifest_digest, image.config_digest, overlay, overlay_src, steps, variant,
                     wheel_dir, out, allow_unpinned, epoch, link_base, fingerprint, existing)


def _input_hashes(overlay: Overlay, source_dir: Path, steps: tuple[Step, ...], variant: str,
                  wheel_dir: Path | None) -> dict[str, str]:
    """sha256 of every file the build will read from the overlay source and the wheel dir, as they are now."""
    files = {f"src/{i.file.path}": source_dir / i.file.path for i in overlay.installs}
    files.update({f"src/{s.script.path}": source_dir / s.script.path for s in steps})
    if variant != "plain":
        files.update({f"wheels/{w.file}": wheel_dir / w.file for w in overlay.variants[variant].wheels})
    hashes = {}
    for label, path in sorted(files.items()):
        if not path.is_file():
            raise SparkstackError(f"{path}: overlay input is missing")
        hashes[label] = fsio.sha256_file(path)
    return hashes


def _fingerprint(base_manifest: str, platform: str, overlay: Overlay, steps: tuple[Step, ...], variant: str,
                 inputs: dict[str, str], epoch: int, link_base: str) -> str:
    # link_base counts: an output of symlinks and one of hardlinks are not interchangeable (the
    # first dies with its base), so switching it must rebuild, not say "up to date".
    doc = {
        "format": FORMAT_VERSION, "tool": __version__, "base_manifest": base_manifest, "platform": platform,
        "overlay_toml": fsio.sha256_file(overlay.path), "steps": [s.name for s in steps], "variant": variant,
        "inputs": inputs, "epoch": epoch, "link_base": link_base,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


# ---------------------------------------------------------------- the output at --out


def is_archive(out: Path) -> bool:
    return out.name.endswith(".tar")


def claim_output(out: Path) -> outputs.OutputMarker | None:
    """Refuse an --out sparkstack did not write; return the previous build's marker, if any."""
    if is_archive(out):
        return outputs.claim_file(out, COMMAND, archive_marker)
    return outputs.claim_dir(out, COMMAND)


def _output_index(out: Path) -> dict | None:
    try:
        if is_archive(out):
            with tarfile.open(out, "r:") as tar:
                member = tar.extractfile("index.json")
                raw = member.read() if member is not None else b""
        else:
            raw = (out / "index.json").read_bytes()
        doc = json.loads(raw)
    except (OSError, KeyError, tarfile.TarError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def archive_marker(out: Path) -> outputs.OutputMarker | None:
    """A .tar output's marker: the annotations of its index.json."""
    index = _output_index(out)
    return outputs.marker_from_annotations(index.get("annotations")) if index else None


def complete_output(out: Path) -> ExistingOutput | None:
    """The image at `out` when every blob its documents name is present at its declared size; else None."""
    index = _output_index(out)
    if index is None:
        return None
    try:
        src, image = open_image(out, None)
    except SparkstackError:
        return None
    try:
        for layer in image.layers:
            with src.open_blob(layer.digest) as f:
                if f.seek(0, 2) != layer.size:
                    return None
    except (SparkstackError, OSError):
        return None
    finally:
        src.close()
    try:
        name = index["manifests"][0]["annotations"][CONTAINERD_NAME]
    except (KeyError, IndexError, TypeError):
        name = None
    if not isinstance(name, str):
        name = None
    return ExistingOutput(name, image.config_digest, image.manifest_digest, image.layers[-1].digest)


def plan_lines(plan: BuildPlan) -> list[str]:
    """The human form of a build plan (`image build --dry-run`)."""
    doc = plan.to_json()
    lines = [f"base: {doc['base']} ({doc['platform']}), manifest {doc['base_manifest']}",
             f"out: {doc['out']}" + (" (up to date: nothing to do)" if plan.up_to_date else ""),
             f"overlay: {doc['overlay']['source']}"]
    lines += [f"  install {i['src']} -> {i['dest']}" for i in doc["installs"]]
    lines += [f"  step    {st['name']}: {st['script']} {' '.join(st['args'])}" for st in doc["steps"]]
    lines.append(f"extract from base: {len(doc['extract'])} files")
    return lines
