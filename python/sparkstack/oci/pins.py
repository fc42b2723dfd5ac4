"""nix/pins.json: the base image pinned by digest, per platform, down to every layer.

`pin base` resolves a reference through the registry and writes the file; `pin fetch`
downloads one blob or manifest the file names, verified, for the flake's fixed-output
derivations. The file's shape is read by other tools (the flake), so it is exactly:

    {"reference", "registry", "repository",
     "resolved": {"digest", "mediaType", "size"},
     "platforms": {"os/arch[/variant]": {"manifest": D, "config": D, "layers": [D, ...]}}}

where D is {"digest", "mediaType", "size"}. Until someone resolves it online, the committed
file holds the known digest with mediaType and size null and no platforms.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sparkstack import fsio
from sparkstack.errors import SparkstackError, UsageError
from sparkstack.oci.model import INDEX_V1, OCI_EQUIVALENT, digest_hex
from sparkstack.oci.registry import INDEX_TYPES, MANIFEST_TYPES, Manifest, Registry, Reference, parse_reference
from sparkstack.units import human_bytes

DEFAULT_PLATFORM = "linux/arm64"
PINS_RELPATH = Path("nix") / "pins.json"
_PLATFORM = re.compile(r"^[a-z0-9_]+/[a-z0-9_]+(/[a-z0-9_]+)?$")


# ---------------------------------------------------------------- the file's shape


@dataclass(frozen=True)
class Descriptor:
    digest: str
    media_type: str | None
    size: int | None

    def to_json(self) -> dict:
        return {"digest": self.digest, "mediaType": self.media_type, "size": self.size}


@dataclass(frozen=True)
class PlatformPin:
    manifest: Descriptor
    config: Descriptor
    layers: tuple[Descriptor, ...]

    def to_json(self) -> dict:
        return {"manifest": self.manifest.to_json(), "config": self.config.to_json(),
                "layers": [l.to_json() for l in self.layers]}


@dataclass(frozen=True)
class Pins:
    reference: str
    registry: str
    repository: str
    resolved: Descriptor
    platforms: tuple[tuple[str, PlatformPin], ...]  # in the order asked for

    def platform(self, name: str) -> PlatformPin | None:
        return dict(self.platforms).get(name)

    def to_json(self) -> dict:
        return {"reference": self.reference, "registry": self.registry, "repository": self.repository,
                "resolved": self.resolved.to_json(), "platforms": {n: p.to_json() for n, p in self.platforms}}

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_json(), indent=2) + "\n").encode()


def _descriptor(doc: object, where: str, complete: bool = True) -> Descriptor:
    if not isinstance(doc, dict) or set(doc) != {"digest", "mediaType", "size"}:
        raise ValueError(f"{where} must be an object with digest, mediaType and size")
    digest, media, size = doc["digest"], doc["mediaType"], doc["size"]
    if not isinstance(digest, str):
        raise ValueError(f"{where}.digest is not a string")
    try:
        digest_hex(digest)
    except ValueError as exc:
        raise ValueError(f"{where}.digest: {exc}") from None
    if complete or media is not None or size is not None:
        if not isinstance(media, str) or not media:
            raise ValueError(f"{where}.mediaType is not a string")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"{where}.size is not a whole number of bytes")
    return Descriptor(digest, media, size)


def parse_pins(doc: object) -> Pins:
    """A pins document, checked key by key; ValueError names the first thing wrong."""
    keys = {"reference", "registry", "repository", "resolved", "platforms"}
    if not isinstance(doc, dict) or set(doc) != keys:
        raise ValueError(f"expected exactly the keys {', '.join(sorted(keys))}")
    for k in ("reference", "registry", "repository"):
        if not isinstance(doc[k], str) or not doc[k]:
            raise ValueError(f"{k} is not a string")
    resolved = _descriptor(doc["resolved"], "resolved", complete=False)
    if not isinstance(doc["platforms"], dict):
        raise ValueError("platforms is not an object")
    platforms = []
    for name, p in doc["platforms"].items():
        where = f"platforms[{name!r}]"
        if not _PLATFORM.fullmatch(name):
            raise ValueError(f"{where}: not an os/arch[/variant] name")
        if not isinstance(p, dict) or set(p) != {"manifest", "config", "layers"} or not isinstance(p["layers"], list):
            raise ValueError(f"{where} must hold manifest, config and a list of layers")
        layers = tuple(_descriptor(l, f"{where}.layers[{i}]") for i, l in enumerate(p["layers"]))
        platforms.append((name, PlatformPin(_descriptor(p["manifest"], f"{where}.manifest"),
                                            _descriptor(p["config"], f"{where}.config"), layers)))
    return Pins(doc["reference"], doc["registry"], doc["repository"], resolved, tuple(platforms))


def read_pins(path: Path) -> Pins:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SparkstackError(f"{path}: no such pins file") from None
    except IsADirectoryError:
        raise SparkstackError(f"{path}: is a directory, not a pins file") from None
    try:
        return parse_pins(json.loads(raw))
    except (ValueError, RecursionError) as exc:
        raise SparkstackError(f"{path}: not a sparkstack pins file ({exc})") from None


def default_pins_path(given: Path | None) -> Path:
    """--pins, or the checkout's nix/pins.json found from the working directory upward."""
    if given is not None:
        return given
    from sparkstack.shipped import checkout_root

    root = checkout_root()
    if root is None:
        raise SparkstackError("not inside a sparkstack checkout (no nix/pins.json found upward); pass --pins FILE")
    return root / PINS_RELPATH


def check_platform(name: str) -> str:
    if not _PLATFORM.fullmatch(name):
        raise UsageError(f"--platform {name!r}: expected os/arch[/variant], e.g. linux/arm64")
    return name


# ---------------------------------------------------------------- resolving


def _platform_name(doc: object) -> str | None:
    if not isinstance(doc, dict) or not isinstance(doc.get("os"), str) or not isinstance(doc.get("architecture"), str):
        return None
    return "/".join([doc["os"], doc["architecture"]] + ([doc["variant"]] if isinstance(doc.get("variant"), str)
                                                       and doc["variant"] else []))


def _matches(have: str, want: str) -> bool:
    """linux/arm64 matches linux/arm64/v8; linux/arm64/v8 needs that variant."""
    h, w = have.split("/"), want.split("/")
    return h[:2] == w[:2] and (len(w) < 3 or h[2:3] == w[2:3])


def _json(manifest: Manifest) -> dict:
    return json.loads(manifest.body)  # registry.manifest checked it is a JSON object


def _desc_from(doc: object, where: str) -> Descriptor:
    if not isinstance(doc, dict):
        raise ValueError(f"{where} is not a descriptor")
    d = {"digest": doc.get("digest"), "mediaType": doc.get("mediaType"), "size": doc.get("size")}
    return _descriptor(d, where)


def _platform_pin(reg: Registry, manifest: Manifest, label: str) -> tuple[PlatformPin, str]:
    """Pin one image manifest: its config (fetched, to read the platform) and its layers."""
    doc = _json(manifest)
    try:
        config = _desc_from(doc.get("config"), "config")
        layers_doc = doc.get("layers")
        if not isinstance(layers_doc, list):
            raise ValueError("layers is not a list")
        layers = tuple(_desc_from(l, f"layers[{i}]") for i, l in enumerate(layers_doc))
    except ValueError as exc:
        raise SparkstackError(f"{label}: manifest {manifest.digest}: {exc}") from None
    raw = reg.small_blob(config.digest, config.size)
    try:
        config_doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise SparkstackError(f"{label}: config {config.digest} is not JSON") from None
    have = _platform_name(config_doc)
    if have is None:
        raise SparkstackError(f"{label}: config {config.digest} names no os/architecture")
    desc = Descriptor(manifest.digest, manifest.media_type, manifest.size)
    return PlatformPin(desc, config, layers), have


def resolve(ref: Reference, platforms: tuple[str, ...], reg: Registry) -> Pins:
    """What `ref` names now: its index (or single manifest), and each platform's manifest, config and layers."""
    label = str(ref)
    top = reg.manifest(ref.ref)
    pinned: list[tuple[str, PlatformPin]] = []
    if top.media_type in INDEX_TYPES:
        entries = _json(top).get("manifests")
        if not isinstance(entries, list):
            raise SparkstackError(f"{label}: index {top.digest} has no manifests list")
        offered = []
        for want in platforms:
            for entry in entries:
                have = _platform_name(entry.get("platform") if isinstance(entry, dict) else None)
                if have is None or have == "unknown/unknown":  # attestations ride along in indexes
                    continue
                offered.append(have)
                if _matches(have, want):
                    try:
                        desc = _desc_from(entry, f"index entry for {have}")
                    except ValueError as exc:
                        raise SparkstackError(f"{label}: {exc}") from None
                    child = reg.manifest(desc.digest, accept=(desc.media_type,) if desc.media_type in MANIFEST_TYPES
                                         else MANIFEST_TYPES, size=desc.size)
                    if child.media_type in INDEX_TYPES:
                        raise SparkstackError(f"{label}: {have} points at a nested index; not supported")
                    pin, config_platform = _platform_pin(reg, child, label)
                    if not _matches(config_platform, want):
                        raise SparkstackError(f"{label}: index says {have} but manifest {child.digest}'s config "
                                              f"says {config_platform}")
                    pinned.append((want, pin))
                    break
            else:
                raise SparkstackError(f"{label}: no {want} image in index {top.digest} "
                                      f"(has: {', '.join(sorted(set(offered))) or 'none'})")
    else:
        pin, have = _platform_pin(reg, top, label)
        missing = [p for p in platforms if not _matches(have, p)]
        if missing:
            raise SparkstackError(f"{label}: names a single {have} image, not {', '.join(missing)}")
        pinned = [(p, pin) for p in platforms]
    resolved = Descriptor(top.digest, top.media_type, top.size)
    return Pins(str(ref), ref.registry, ref.repository, resolved, tuple(pinned))


def moved(old: Pins, new: Pins) -> list[str]:
    """What differs between two pins of the same reference, one phrase each."""
    out = []
    if old.reference != new.reference:
        out.append(f"reference {old.reference} -> {new.reference}")
    if old.resolved.digest != new.resolved.digest:
        out.append(f"resolved {old.resolved.digest} -> {new.resolved.digest}")
    elif old.resolved != new.resolved:
        out.append(f"resolved {old.resolved.digest} gained its mediaType/size")
    olds, news = dict(old.platforms), dict(new.platforms)
    for name in news:
        if name not in olds:
            out.append(f"{name} not pinned yet")
            continue
        a, b = olds[name], news[name]
        if a.manifest != b.manifest:
            out.append(f"{name} manifest {a.manifest.digest} -> {b.manifest.digest}")
        if a.config != b.config:
            out.append(f"{name} config {a.config.digest} -> {b.config.digest}")
        if a.layers != b.layers:
            changed = sum(1 for x, y in zip(a.layers, b.layers) if x != y) + abs(len(a.layers) - len(b.layers))
            out.append(f"{name} layers: {changed} of {max(len(a.layers), len(b.layers))} changed")
    for name in olds:
        if name not in news:
            out.append(f"{name} no longer pinned")
    return out


# ---------------------------------------------------------------- pin base: plan, apply


# Where a pinned base comes from, for the bases the blog names: its Dockerfile builds `FROM` a tag
# that is only the upstream's local build-stage name; the public copy of that build is what sparkstack pins.
BLOG_BASE = "ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8"  # what a new pins file pins, when nothing else says
PROVENANCE = {
    BLOG_BASE: (
        "radixark/vllm-glm53-flash:sm121-v8",
        "the blog builds FROM radixark/vllm-glm53-flash:sm121-v8, the upstream's local build-stage name (no registry "
        "serves it); ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8 is its public copy"),
}


def provenance(pins: Pins) -> dict | None:
    """The blog's tag for this base, the public reference pinned, and the digest; None for a base the blog does
    not name."""
    known = PROVENANCE.get(pins.reference)
    if known is None:
        return None
    return {"blog_tag": known[0], "pinned": pins.reference, "digest": pins.resolved.digest, "why": known[1]}


def provenance_lines(pins: Pins) -> list[str]:
    p = provenance(pins)
    if p is None:
        return []
    return [f"provenance: {p['why']}", f"  the blog's tag: {p['blog_tag']}",
            f"  pinned:        {p['pinned']}", f"  digest:        {p['digest']}"]


@dataclass(frozen=True)
class PinBasePlan:
    pins_path: Path
    pins: Pins  # what the registry says now
    previous: Pins | None  # what the file holds (None: no file yet)
    changes: tuple[str, ...]

    @property
    def up_to_date(self) -> bool:
        return self.previous is not None and not self.changes

    def to_json(self) -> dict:
        return {"pins_file": str(self.pins_path), "up_to_date": self.up_to_date, "changes": list(self.changes),
                "pins": self.pins.to_json(), "provenance": provenance(self.pins)}

    def lines(self, dry_run: bool) -> list[str]:
        """The human form of `pin base`: what is (or would be) written, what changed, each platform's pin."""
        path, pins = self.pins_path, self.pins
        if self.up_to_date:
            return [f"up to date: {path} ({pins.reference} = {pins.resolved.digest})", *provenance_lines(pins)]
        if dry_run:
            lines = [f"would write {path}:", *pins.to_bytes().decode().splitlines()]
        else:
            lines = [f"wrote {path}: {pins.reference} = {pins.resolved.digest}"]
        lines += [f"  {change}" for change in self.changes]
        lines += [f"  {name}: manifest {p.manifest.digest}, config {p.config.digest}, {len(p.layers)} layers, "
                  f"{human_bytes(sum(l.size for l in p.layers))}" for name, p in pins.platforms]
        return lines + provenance_lines(pins)


def claim_pins_file(path: Path) -> Pins | None:
    """The pins already at `path`, or None when there is no file. Refuses anything that is not a pins file."""
    if path.is_symlink():
        raise SparkstackError(f"{path}: is a symlink; refusing to replace it (pass --pins with a real file)")
    if not path.exists():
        if not path.parent.is_dir():
            raise SparkstackError(f"{path.parent}: no such directory for the pins file")
        return None
    if not path.is_file():
        raise SparkstackError(f"{path}: exists and is not a file; refusing to replace it")
    try:
        return parse_pins(json.loads(path.read_bytes()))
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise SparkstackError(f"{path}: exists and is not a sparkstack pins file ({exc}); refusing to replace it") from None


def platforms_for(given: tuple[str, ...], previous: Pins | None) -> tuple[str, ...]:
    """--platform as given; else the platforms the file already pins; else linux/arm64."""
    if given:
        return tuple(dict.fromkeys(check_platform(p) for p in given))
    if previous is not None and previous.platforms:
        return tuple(n for n, _ in previous.platforms)
    return (DEFAULT_PLATFORM,)


def plan_pin_base(reference: str | None, platforms: tuple[str, ...], pins_path: Path) -> PinBasePlan:
    """Resolve the reference (network reads only) and compare with the pins file; write nothing."""
    previous = claim_pins_file(pins_path)
    if reference is None:
        if previous is None:
            raise UsageError(f"no REF given and {pins_path} does not exist to take one from")
        reference = previous.reference
    ref = parse_reference(reference)
    wanted = platforms_for(platforms, previous)
    reg = Registry(ref.registry, ref.repository)
    try:
        pins = resolve(ref, wanted, reg)
    finally:
        reg.close()
    changes = tuple(moved(previous, pins)) if previous is not None else ()
    return PinBasePlan(pins_path, pins, previous, changes)


def apply_pin_base(plan: PinBasePlan) -> bool:
    """Write the pins file atomically. Returns False when it already says exactly this."""
    if plan.up_to_date:
        return False
    if claim_pins_file(plan.pins_path) != plan.previous:
        raise SparkstackError(f"{plan.pins_path}: changed while resolving; run again")
    fsio.write_atomic(plan.pins_path, plan.pins.to_bytes())
    return True


# ---------------------------------------------------------------- pin fetch: plan, apply


@dataclass(frozen=True)
class BlobFetchPlan:
    pins_path: Path
    reference: str
    registry: str
    repository: str
    digest: str
    kind: str  # "manifests" or "blobs": the registry endpoint
    media_type: str | None
    size: int | None
    what: str  # e.g. "linux/arm64 layer 2 of 5"
    out: Path
    up_to_date: bool

    def to_json(self) -> dict:
        return {"pins_file": str(self.pins_path), "reference": self.reference, "digest": self.digest,
                "kind": "manifest" if self.kind == "manifests" else "blob", "mediaType": self.media_type,
                "size": self.size, "what": self.what, "out": str(self.out), "up_to_date": self.up_to_date,
                "path": f"/v2/{self.repository}/{self.kind}/{self.digest}"}


def find_pinned(pins: Pins, digest: str) -> tuple[str, Descriptor, str] | None:
    """(endpoint kind, descriptor, label) for a digest the pins name, else None."""
    if pins.resolved.digest == digest:
        return "manifests", pins.resolved, "resolved " + ("index" if OCI_EQUIVALENT.get(
            pins.resolved.media_type, pins.resolved.media_type) == INDEX_V1 else "manifest")
    for name, p in pins.platforms:
        if p.manifest.digest == digest:
            return "manifests", p.manifest, f"{name} manifest"
        if p.config.digest == digest:
            return "blobs", p.config, f"{name} config"
        for i, layer in enumerate(p.layers):
            if layer.digest == digest:
                return "blobs", layer, f"{name} layer {i + 1} of {len(p.layers)}"
    return None


def _existing_matches(out: Path, digest: str, size: int | None) -> bool:
    """Is `out` already exactly this blob? Refuses anything at `out` that is not."""
    if out.is_symlink():
        raise SparkstackError(f"{out}: is a symlink; refusing to replace it")
    if not out.exists():
        if not out.parent.is_dir():
            raise SparkstackError(f"{out.parent}: no such directory for --out")
        return False
    if not out.is_file():
        raise SparkstackError(f"{out}: exists and is not a file; refusing to replace it")
    if (size is None or out.stat().st_size == size) and "sha256:" + fsio.sha256_file(out) == digest:
        return True
    raise SparkstackError(f"{out}: exists and is not {digest}; refusing to replace it (remove it yourself)")


def plan_blob_fetch(digest: str, pins_path: Path, out: Path) -> BlobFetchPlan:
    """Which pinned object DIGEST is and where it comes from; reads only the pins file (and --out)."""
    try:
        digest_hex(digest)
    except ValueError:
        raise UsageError(f"{digest!r} is not a sha256 digest (sha256:<64 hex>)") from None
    pins = read_pins(pins_path)
    found = find_pinned(pins, digest)
    if found is None:
        raise SparkstackError(f"{digest} is not named in {pins_path}; refusing to fetch an unpinned object")
    kind, desc, what = found
    return BlobFetchPlan(pins_path, pins.reference, pins.registry, pins.repository, digest, kind, desc.media_type,
                     desc.size, what, out, _existing_matches(out, digest, desc.size))


def apply_blob_fetch(plan: BlobFetchPlan, on_progress: Callable[[int], None] | None = None, check_digest: bool = True) -> bool:
    """Download, verify and publish atomically. Returns False when --out already held the object.

    The bytes go to a temp file beside --out, are checked (size and sha256, and for a manifest
    Docker-Content-Digest) as they stream, fsynced, and only then renamed to --out: on any
    failure nothing is left at --out. `check_digest=False` (`--no-digest-check`) skips the sha256
    comparisons, for a Nix fixed-output derivation: Nix checks the output's hash itself and names
    a wrong blob with its own hash-mismatch line."""
    if plan.up_to_date:
        return False
    accept = (plan.media_type,) if plan.media_type in MANIFEST_TYPES else MANIFEST_TYPES
    reg = Registry(plan.registry, plan.repository)
    try:
        # Staged in a dir beside --out named by our pid: a killed fetch's partial blob is removed by the next run.
        with fsio.staging_dir(plan.out.parent, plan.out.name) as stage:
            tmp = stage / "blob"
            with open(tmp, "wb") as f:
                for chunk in reg.stream((plan.kind, plan.digest), plan.size, accept=accept, on_progress=on_progress,
                                        check_digest=check_digest):
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            if plan.out.exists() or plan.out.is_symlink():
                raise SparkstackError(f"{plan.out}: appeared while fetching; refusing to replace it")
            os.replace(tmp, plan.out)
    finally:
        reg.close()
    fsio.fsync_dir(plan.out.parent)
    return True
