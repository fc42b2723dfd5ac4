"""`image pull`: the pinned base as an OCI layout dir, fetched blob by blob from the registry, resumable.

The layout is the one the flake's `mkBase` (nix/base.nix) links: `oci-layout`, an `index.json` naming the
platform's manifest (its platform and the reference as `org.opencontainers.image.ref.name`), and the manifest,
config and layers under `blobs/sha256/`. Each object comes through `Registry.stream`, the fetch `pin fetch`
(and so every blob derivation of the flake) uses, checked against the pinned digest and size.

While a blob comes it lives at `blobs/sha256/<hex>.partial`, a name no reader takes for a blob; it is renamed to
`<hex>` only when every byte is verified. An interrupted pull keeps its finished blobs and its partial one, and
the next run asks only for the rest (a Range request; a registry that answers 200 sends the whole blob again). A
resumed blob that does not verify is fetched once more from byte 0: the partial, not the registry, may be wrong.
`oci-layout` and `index.json` are written last, each atomically: until every blob is in place, nothing here
looks like a complete layout. A blob whose bytes do not hash to its digest is refused and its partial removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sparkstack import fsio, outputs
from sparkstack.errors import SparkstackError
from sparkstack.oci.model import digest_hex
from sparkstack.oci.pins import Descriptor, check_platform, read_pins
from sparkstack.oci.registry import MANIFEST_TYPES, Registry, Resume, WrongBytes
from sparkstack.units import human_bytes

WRITTEN_BY = "sparkstack image pull"
PARTIAL = ".partial"
OCI_LAYOUT = b'{"imageLayoutVersion":"1.0.0"}'
_INDEX_MEDIA = "application/vnd.oci.image.index.v1+json"
_READ = 8 << 20


@dataclass(frozen=True)
class PulledBlob:
    what: str  # "manifest", "config", "layer 2 of 5"
    kind: str  # registry endpoint: "manifests" or "blobs"
    descriptor: Descriptor
    have: int  # bytes already here: the size when the blob is in place, a partial's length, or 0
    state: str  # "present", "partial" or "missing"

    @property
    def missing(self) -> int:
        return 0 if self.state == "present" else self.descriptor.size - self.have

    def to_json(self) -> dict:
        d = self.descriptor
        return {"what": self.what, "digest": d.digest, "mediaType": d.media_type, "size": d.size,
                "state": self.state, "have": self.have, "missing": self.missing}


@dataclass(frozen=True)
class PullPlan:
    pins_path: Path
    reference: str
    registry: str
    repository: str
    platform: str
    out: Path
    blobs: tuple[PulledBlob, ...]
    index: bytes  # index.json as it will be written
    layout_complete: bool  # index.json already says exactly this and oci-layout is there

    @property
    def missing_bytes(self) -> int:
        return sum(b.missing for b in self.blobs)

    @property
    def total_bytes(self) -> int:
        return sum(b.descriptor.size for b in self.blobs)

    @property
    def up_to_date(self) -> bool:
        return self.layout_complete and all(b.state == "present" for b in self.blobs)

    @property
    def manifest(self) -> Descriptor:
        return self.blobs[0].descriptor

    def to_json(self) -> dict:
        return {"pins_file": str(self.pins_path), "reference": self.reference, "platform": self.platform,
                "out": str(self.out), "manifest": self.manifest.digest, "up_to_date": self.up_to_date,
                "total_bytes": self.total_bytes, "missing_bytes": self.missing_bytes,
                "blobs": [b.to_json() for b in self.blobs]}

    def lines(self) -> list[str]:
        if self.up_to_date:
            return [f"up to date: {self.out} holds {self.reference} {self.platform} "
                    f"(manifest {self.manifest.digest}, {human_bytes(self.total_bytes)})"]
        todo = [b for b in self.blobs if b.state != "present"]
        head = (f"would pull {self.reference} {self.platform} into {self.out}: {human_bytes(self.missing_bytes)} "
                f"of {human_bytes(self.total_bytes)} missing ({len(todo)} of {len(self.blobs)} blobs), "
                f"from {self.registry}/{self.repository}")
        rows = [f"  {b.state:8} {b.what}: {b.descriptor.digest} ({human_bytes(b.missing)} of "
                f"{human_bytes(b.descriptor.size)} to fetch)" for b in todo]
        return [head, *rows]


@dataclass(frozen=True)
class PullResult:
    fetched: tuple[str, ...]  # digests fetched (whole or their rest)
    resumed: tuple[str, ...]  # digests whose partial the registry continued (206)
    bytes_fetched: int  # bytes that came over the network
    index_written: bool

    def to_json(self) -> dict:
        return {"fetched": list(self.fetched), "resumed": list(self.resumed), "bytes_fetched": self.bytes_fetched,
                "index_written": self.index_written}


def blob_path(out: Path, digest: str) -> Path:
    return out / "blobs" / "sha256" / digest_hex(digest)


def partial_path(out: Path, digest: str) -> Path:
    return out / "blobs" / "sha256" / (digest_hex(digest) + PARTIAL)


def platform_doc(platform: str) -> dict:
    """os/arch[/variant] as an OCI platform object."""
    parts = platform.split("/")
    return {"os": parts[0], "architecture": parts[1], **({"variant": parts[2]} if len(parts) > 2 else {})}


def index_bytes(reference: str, platform: str, manifest: Descriptor) -> bytes:
    """index.json as the flake's mkBase writes it: the one manifest, its platform, the reference as its name."""
    doc = {"schemaVersion": 2, "mediaType": _INDEX_MEDIA,
           "manifests": [{"mediaType": manifest.media_type, "digest": manifest.digest, "size": manifest.size,
                          "platform": platform_doc(platform),
                          "annotations": {"org.opencontainers.image.ref.name": reference}}]}
    return (json.dumps(doc, indent=2) + "\n").encode()


def _file_state(path: Path) -> int | None:
    """The size of a regular file at `path`, None when nothing is there; refuses anything else."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise SparkstackError(f"{path}: is not a regular file; refusing to touch the layout (remove it yourself)")
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return None


def _claim_out(out: Path) -> None:
    """--out may be absent, an empty dir, or a dir `image pull` wrote; nothing else."""
    if out.exists() and not out.is_dir() and not out.is_symlink():
        raise SparkstackError(f"{out}: exists and is not a directory; choose another --out")
    outputs.claim_dir(out, WRITTEN_BY)


def plan_pull(pins_path: Path, platform: str, out: Path) -> PullPlan:
    """What the layout at `out` lacks of the pinned platform; reads the pins file and `out` only."""
    platform = check_platform(platform)
    pins = read_pins(pins_path)
    pinned = pins.platform(platform)
    if pinned is None:
        names = [n for n, _ in pins.platforms]
        # pin base re-pins exactly the platforms it is given: the ones pinned now, and this one
        again = shlex.join(["sparkstack", "pin", "base", pins.reference, "--pins", str(pins_path),
                            *[a for n in [*names, platform] for a in ("--platform", n)]])
        raise SparkstackError(f"{pins_path} pins no {platform} image of {pins.reference} (pinned: "
                              f"{', '.join(names) or 'none'}); run `{again}` first")
    _claim_out(out)
    n = len(pinned.layers)
    wanted = [("manifest", "manifests", pinned.manifest), ("config", "blobs", pinned.config)]
    wanted += [(f"layer {i + 1} of {n}", "blobs", d) for i, d in enumerate(pinned.layers)]
    blobs, seen = [], set()
    for what, kind, desc in wanted:
        if desc.digest in seen:  # a layer listed twice is one blob
            continue
        seen.add(desc.digest)
        done = _file_state(blob_path(out, desc.digest)) if out.is_dir() else None
        part = _file_state(partial_path(out, desc.digest)) if out.is_dir() else None
        if done is not None and done != desc.size:
            raise SparkstackError(f"{blob_path(out, desc.digest)}: {done} bytes, not the pinned {desc.size}; "
                                  "it is not the pinned blob (remove it yourself)")
        if done is not None:
            blobs.append(PulledBlob(what, kind, desc, desc.size, "present"))
        elif part:
            blobs.append(PulledBlob(what, kind, desc, min(part, desc.size), "partial"))
        else:
            blobs.append(PulledBlob(what, kind, desc, 0, "missing"))
    index = index_bytes(pins.reference, platform, pinned.manifest)
    complete = False
    if out.is_dir():
        idx, lay = _file_state(out / "index.json"), _file_state(out / "oci-layout")
        complete = idx is not None and lay is not None and (out / "index.json").read_bytes() == index and \
            (out / "oci-layout").read_bytes() == OCI_LAYOUT
    return PullPlan(pins_path, pins.reference, pins.registry, pins.repository, platform, out, tuple(blobs), index,
                    complete)


def _hash_of(path: Path) -> tuple[object, int]:
    """A sha256 fed with the file's bytes, and their count."""
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_READ):
            h.update(chunk)
            n += len(chunk)
    return h, n


def _fetch_one(reg: Registry, plan: PullPlan, blob: PulledBlob, on_progress: Callable[[int], None] | None,
               counted: list[int]) -> bool:
    """Fetch one blob into its partial, verify it, rename it into place. True when the registry resumed it.

    A partial goes on from where it ends. When the blob it grew into is wrong, the held bytes are the first
    suspect (a partial a power cut left unsynced, or one another tool wrote): it is dropped and the blob fetched
    once more from byte 0, so an honest registry is never blamed for a bad partial."""
    desc, out = blob.descriptor, plan.out
    part, final = partial_path(out, desc.digest), blob_path(out, desc.digest)
    resume, resumed = None, []
    if blob.kind == "blobs" and part.exists():
        hasher, held = _hash_of(part)
        if 0 < held < desc.size:
            def restart(start: int) -> None:
                resumed.append(start)
                if start == 0:
                    os.truncate(part, 0)
            resume = Resume(held, hasher, restart)
        elif held == desc.size and "sha256:" + hasher.hexdigest() == desc.digest:
            os.replace(part, final)  # a run killed between its last byte and the rename
            fsio.fsync_dir(final.parent)
            return False
        else:  # as long as the blob, or longer, and not it: nothing to build on
            part.unlink()
    try:
        _stream_into(reg, blob, part, resume, on_progress, counted)
    except WrongBytes:
        part.unlink(missing_ok=True)
        if not (resumed and resumed[0] > 0):
            raise
        resumed.clear()  # the blob came whole: not resumed
        _stream_into(reg, blob, part, None, on_progress, counted, again=True)
    os.replace(part, final)
    fsio.fsync_dir(final.parent)
    return bool(resumed) and resumed[0] > 0


def _stream_into(reg: Registry, blob: PulledBlob, part: Path, resume: Resume | None,
                 on_progress: Callable[[int], None] | None, counted: list[int], again: bool = False) -> None:
    """The registry's answer for `blob`, appended to `part` (written anew without `resume`), verified, synced.
    Wrong bytes remove the partial; a cut transfer keeps what came, for the next run to go on from."""
    desc = blob.descriptor

    def advance(n: int) -> None:
        counted[0] += n
        if on_progress:
            on_progress(n)

    accept = (desc.media_type,) if blob.kind == "manifests" and desc.media_type in MANIFEST_TYPES else MANIFEST_TYPES
    try:
        with open(part, "ab" if resume is not None else "wb") as f:
            for chunk in reg.stream((blob.kind, desc.digest), desc.size, accept=accept, on_progress=advance,
                                    resume=resume):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
    except WrongBytes as exc:
        part.unlink(missing_ok=True)
        if again:
            raise WrongBytes(f"{exc} (fetched again from byte 0, after the partial it went on from failed)") from None
        raise
    except SparkstackError as exc:
        size = _file_state(part)
        if size is None:
            raise
        if size == 0 or size >= desc.size:
            part.unlink()
            raise
        raise SparkstackError(f"{exc} ({human_bytes(size)} of it kept in {part}: pull again to fetch the rest)") from None


def _check_manifest(plan: PullPlan) -> None:
    """The manifest fetched (by its digest) must list the config and layers the pins name."""
    m = plan.blobs[0]
    try:
        doc = json.loads(blob_path(plan.out, m.descriptor.digest).read_bytes())
        listed = [doc["config"]["digest"]] + [layer["digest"] for layer in doc["layers"]]
    except (ValueError, KeyError, TypeError):
        raise SparkstackError(f"manifest {m.descriptor.digest}: not an image manifest with a config and layers") from None
    pinned = [b.descriptor.digest for b in plan.blobs[1:]]
    if list(dict.fromkeys(listed)) != pinned:
        raise SparkstackError(f"{plan.pins_path}: the config and layers pinned for {plan.platform} are not the ones "
                              f"manifest {m.descriptor.digest} lists; run `sparkstack pin base` again")


def apply_pull(plan: PullPlan, on_progress: Callable[[int], None] | None = None,
               on_wait: Callable[[Path, int | None], None] = lambda dest, pid: None) -> PullResult:
    """Fetch what is missing, then write oci-layout and index.json. Rewrites nothing already in place.
    A second pull into the same --out waits for the first (`on_wait` says so), then fetches only what is left."""
    if plan.up_to_date:
        return PullResult((), (), 0, False)
    with fsio.dest_lock(plan.out, on_wait):
        return _pull_locked(plan, on_progress)


def _pull_locked(plan: PullPlan, on_progress: Callable[[int], None] | None) -> PullResult:
    _claim_out(plan.out)  # still ours (or still empty) now that we write
    blobs_dir = plan.out / "blobs" / "sha256"
    blobs_dir.mkdir(parents=True, exist_ok=True)
    marker = plan.out / outputs.MARKER
    if not marker.exists():
        marker.parent.mkdir(exist_ok=True)
        fsio.write_atomic(marker, outputs.OutputMarker(WRITTEN_BY).to_bytes())
    fetched, resumed, counted = [], [], [0]
    reg = Registry(plan.registry, plan.repository)
    try:
        for i, blob in enumerate(plan.blobs):
            if not blob_path(plan.out, blob.descriptor.digest).exists():
                if _fetch_one(reg, plan, blob, on_progress, counted):
                    resumed.append(blob.descriptor.digest)
                fetched.append(blob.descriptor.digest)
            if i == 0:  # the manifest comes first: a disagreement with the pins stops before any layer byte
                _check_manifest(plan)
    finally:
        reg.close()
    written = False
    if not (plan.out / "oci-layout").exists() or (plan.out / "oci-layout").read_bytes() != OCI_LAYOUT:
        fsio.write_atomic(plan.out / "oci-layout", OCI_LAYOUT)
        written = True
    index = plan.out / "index.json"
    if not index.exists() or index.read_bytes() != plan.index:
        fsio.write_atomic(index, plan.index)
        written = True
    return PullResult(tuple(fetched), tuple(resumed), counted[0], written)
