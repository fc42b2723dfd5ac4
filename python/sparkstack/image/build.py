"""`image build`: pinned base + overlay + patch steps -> one new deterministic layer on the base's own layers.

Pipeline: extract only the files the steps touch (layer stack, whiteouts, links
resolved as the container sees them), install the overlay, run the steps,
check the static gates, write one layer, then a config, manifest, index and
docker manifest.json that reuse every base layer by digest.
"""

from __future__ import annotations

import json
import posixpath
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sparkstack import fsio
from sparkstack.errors import SparkstackError
from sparkstack.oci.layers import LayerCache
from sparkstack.oci.rootfs import RootFS, open_rootfs
from sparkstack.oci.write import LayerItem, build_layer, image_docs, write_output
from sparkstack.image.plan import BuildPlan
from sparkstack.patch.engine import GateResult, StepOutcome, apply_overlay, needed_paths
from sparkstack.patch.source import opened_source
from sparkstack.patch.overlay import SourceFile, Variant, read_checked

LABEL = "org.sparkstack"


@dataclass(frozen=True)
class BuildResult:
    out: Path
    name: str
    config_digest: str
    manifest_digest: str
    layer_digest: str
    base_config_digest: str
    changed: tuple[str, ...]
    steps: tuple[StepOutcome, ...]
    gates: tuple[GateResult, ...]
    up_to_date: bool
    cache_stats: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "out": str(self.out), "name": self.name, "config_digest": self.config_digest,
            "manifest_digest": self.manifest_digest, "layer_digest": self.layer_digest,
            "base_config_digest": self.base_config_digest, "up_to_date": self.up_to_date,
            "changed": list(self.changed), "steps": [{"name": s.name, "changed": list(s.changed)} for s in self.steps],
            "gates": [{"gate": g.name, "ok": g.ok} for g in self.gates], "cache": self.cache_stats,
        }

    def lines(self) -> list[str]:
        """The human form of what a build made."""
        lines = [("up to date: " if self.up_to_date else "built ") + f"{self.out}", f"  image   {self.name}",
                 f"  config  {self.config_digest}  (image ID)", f"  manifest {self.manifest_digest}",
                 f"  layer   {self.layer_digest}" + ("" if self.up_to_date else f"  ({len(self.changed)} files)")]
        lines += [f"  step {st.name}: changed {', '.join(st.changed) or 'nothing'}" for st in self.steps]
        return lines


def _labels(plan: BuildPlan, base_config: str) -> dict[str, str]:
    """Labels record the base by its identity (config digest), so every container format of it gives one image."""
    o = plan.overlay
    labels = {
        f"{LABEL}.base.config": base_config,
        f"{LABEL}.overlay.source": o.source_label,
        f"{LABEL}.overlay.pinned": "unpinned" if o.unpinned else "true",
        f"{LABEL}.overlay.steps": json.dumps([
            {"name": s.name, "script": s.script.path, "sha256": s.script.sha256, "args": list(s.args)}
            for s in plan.steps], separators=(",", ":")),
        f"{LABEL}.variant": plan.variant,
    }
    gates = list(o.runtime_gates) + (list(o.variants[plan.variant].runtime_gates) if plan.variant != "plain" else [])
    if gates:
        labels[f"{LABEL}.gates.runtime"] = json.dumps([list(g) for g in gates], separators=(",", ":"))
    if plan.variant != "plain" and o.variants[plan.variant].load_format:
        labels[f"{LABEL}.load_format"] = o.variants[plan.variant].load_format
    return labels


def build_image(plan: BuildPlan, cache: LayerCache | None = None,
                on_progress: Callable[[int], None] | None = None) -> BuildResult:
    if plan.existing is not None:  # decided by the plan: same fingerprint, and the output is complete
        e = plan.existing
        return BuildResult(plan.out, e.name, e.config_digest, e.manifest_digest, e.layer_digest,
                           plan.base_config_digest, (), (), (), True)
    o = plan.overlay
    paths = needed_paths(o, plan.steps)
    src, image, rootfs = open_rootfs(plan.base, plan.platform, paths, cache, on_progress)
    try:
        if image.manifest_digest != plan.base_manifest_digest:
            raise SparkstackError(f"{plan.base}: the base changed since it was planned; run again")
        base_files = rootfs.read_files(paths)
        # Scratch in $TMPDIR, named by our pid: what a killed run leaves is removed by the next one.
        with fsio.staging_dir(Path(tempfile.gettempdir()), "build") as work:
            with opened_source(o, plan.overlay_src) as source_dir:  # a bundle is hashed and unpacked again
                patched = apply_overlay(base_files, o, plan.steps, source_dir, work / "patch", plan.allow_unpinned)
            # Write each file where the container would find it: through the base's symlinks.
            items = [LayerItem(rootfs.resolve(p), "file", data=d) for p, d in patched.files.items()]
            if plan.variant != "plain":
                items += _wheel_items(plan, o.variants[plan.variant], rootfs, work / "wheels")
            built = build_layer(items, work, plan.epoch)
            docs = image_docs(image, built.layer, _labels(plan, image.config_digest),
                              f"sparkstack image build: overlay {o.name} ({o.source_label}), variant {plan.variant}",
                              o.image_name, plan.variant, plan.epoch, plan.marker.annotations())
            write_output(plan.out, docs, src, built, plan.epoch, plan.marker, plan.link_base)
    finally:
        src.close()
    return BuildResult(plan.out, docs.name, docs.config_digest, docs.manifest_digest, built.layer.digest,
                       image.config_digest, tuple(sorted(i.path for i in items)), patched.steps, patched.gates,
                       False, dict(rootfs.cache.stats))


_WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _wheel_items(plan: BuildPlan, variant: Variant, rootfs: RootFS, work: Path) -> list[LayerItem]:
    """Install the variant's wheels with `installer` into a scratch dist-packages, and white out what they supersede."""
    from installer import install
    from installer.destinations import SchemeDictionaryDestination
    from installer.sources import WheelFile

    site_rel = posixpath.dirname(plan.overlay.vllm_root)  # .../dist-packages
    prefix_rel = "usr/local"
    scratch = work / "root"
    dest = SchemeDictionaryDestination(
        {"purelib": str(scratch / site_rel), "platlib": str(scratch / site_rel),
         "scripts": str(scratch / prefix_rel / "bin"), "headers": str(scratch / prefix_rel / "include"),
         "data": str(scratch / prefix_rel)},
        interpreter="/usr/bin/python3", script_kind="posix")
    new_dists = {}
    for wheel in variant.wheels:
        path = plan.wheel_dir / wheel.file
        read_checked(plan.wheel_dir, SourceFile(wheel.file, wheel.sha256), plan.allow_unpinned)
        m = _WHEEL_NAME.match(path.name)
        if not m:
            raise SparkstackError(f"{path.name}: not a wheel file name")
        new_dists[_normalise(m["name"])] = m["version"]
        try:
            with WheelFile.open(path) as source:
                install(source, dest, {"INSTALLER": b"sparkstack\n"})
        except Exception as exc:  # installer raises plain exceptions for malformed wheels
            raise SparkstackError(f"{path.name}: cannot install: {exc}") from None

    items = []
    installed = set()
    for p in sorted(scratch.rglob("*")):
        if p.is_file():
            rel = p.relative_to(scratch).as_posix()
            installed.add(rel)
            items.append(LayerItem(rel, "file", source=p, executable=bool(p.stat().st_mode & 0o111)))
    items += _superseded(rootfs, site_rel, new_dists, installed)
    return items


def _superseded(rootfs: RootFS, site_rel: str, new_dists: dict[str, str], installed: set[str]) -> list[LayerItem]:
    """Whiteouts for base dist-info dirs of the same projects at other versions, and their files we do not replace."""
    whiteouts = []
    try:
        names = rootfs.list_dir(site_rel)
    except SparkstackError:
        return whiteouts
    for name in names:
        if not name.endswith(".dist-info"):
            continue
        project, _, version = name[: -len(".dist-info")].rpartition("-")
        norm = _normalise(project)
        if norm not in new_dists or version == new_dists[norm]:
            continue
        record_path = f"{site_rel}/{name}/RECORD"
        record = rootfs.read_files([record_path])[record_path] or b""
        for line in record.decode("utf-8", errors="replace").splitlines():
            rel = line.split(",", 1)[0]
            full = posixpath.normpath(posixpath.join(site_rel, rel))
            if not rel or full.startswith("..") or full.startswith(f"{site_rel}/{name}/") or full in installed:
                continue
            whiteouts.append(LayerItem(full, "whiteout"))
        whiteouts.append(LayerItem(f"{site_rel}/{name}", "whiteout"))
    return whiteouts
