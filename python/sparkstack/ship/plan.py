"""The ship plan: what each host lacks, from what it said it holds. Pure: no I/O.

Inputs are what the head has (an image's blobs, cache entries' blobs and links: local.py) and
what each host answered to one inventory round trip (wire.py). Output: per host, which blobs
go and which are already there, whether docker must load or only tag the image, whether
snapshot links and refs need rebuilding, and whether the bytes that must go fit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sparkstack.hfcache import EntryLayout
from sparkstack.remote import Runner
from sparkstack.units import human_bytes


def default_streams(cpus: int | None) -> int:
    """One ssh stream per core, at most 8 (measured between two Sparks: one ssh copy 0.30-0.44 GB/s, four verified
    streams 0.55-0.80 GB/s, already near what the link gives)."""
    return max(1, min(cpus or 1, 8))


@dataclass(frozen=True)
class Blob:
    """One content-addressed file a host must hold, and where its bytes are on the head."""

    key: str  # unique in one ship: the image digest, or "<entry>/<blob name>"
    area: str  # "store" (the host's blob store) or "hub" (its HF hub)
    dir: str  # relative to that root
    name: str  # the file name: a digest's hex, or a hub blob name
    algo: str  # how the name proves the bytes: "sha256" or "git-sha1"
    digest: str  # hex
    size: int
    source: Path | None = None  # a file here holding the bytes (at `offset`)
    offset: int = 0
    data: bytes | None = field(default=None, repr=False)  # a small document held in memory instead

    def wire(self) -> dict:
        return {"key": self.key, "area": self.area, "dir": self.dir, "name": self.name, "algo": self.algo,
                "digest": self.digest, "size": self.size}

    def to_json(self) -> dict:
        return {"key": self.key, "size": self.size}


@dataclass(frozen=True)
class ImageToShip:
    path: Path  # the layout (or archive) it was read from
    config_digest: str
    manifest_digest: str
    name: str | None  # the tag docker gets (io.containerd.image.name)
    layers: tuple[str, ...]  # layer digests in manifest order: docker-archive's Layers
    diff_ids: tuple[str, ...]  # the config's, in the same order: how docker knows the layers it holds
    blobs: tuple[Blob, ...]  # manifest, config, layers (each once)
    index_entry: dict = field(hash=False, compare=False)  # the descriptor for the host store's index.json

    def to_json(self) -> dict:
        return {"path": str(self.path), "config_digest": self.config_digest, "manifest_digest": self.manifest_digest,
                "name": self.name, "blobs": len(self.blobs), "bytes": sum(b.size for b in self.blobs)}


@dataclass(frozen=True)
class EntryToShip:
    layout: EntryLayout
    blobs: tuple[Blob, ...]

    @property
    def name(self) -> str:
        return self.layout.name


@dataclass(frozen=True)
class Target:
    host: str  # the recipe node's host name, or the plain ssh target
    runner: Runner  # ssh there (bulk options; the fabric address where chosen)
    via: str  # "fabric" or "mgmt"
    hub: str  # the HF hub there, `~` expanded by the host
    docker_host: str | None

    def to_json(self) -> dict:
        return {"host": self.host, "ssh": self.runner.ssh, "via": self.via, "address": self.runner.hostname,
                "hub": self.hub, "docker_host": self.docker_host}


@dataclass(frozen=True)
class BlobState:
    state: str  # present, partial, missing or corrupt
    have: int = 0  # bytes of a partial (not yet trusted: its prefix is compared before resuming)


@dataclass(frozen=True)
class Room:
    free: int
    device: int
    at: str


@dataclass(frozen=True)
class Inventory:
    """One host's answer, checked for shape (it comes from another machine)."""

    blobs: Mapping[str, BlobState]
    docker_error: str | None
    holds_image: bool
    image_named: bool
    layers_held: int  # the image's first layers docker already holds as one chain (from any image)
    entries: Mapping[str, tuple[bool, bool]]  # name -> (snapshot current, refs/main current)
    room: Mapping[str, Room]  # area -> free space there
    roots: Mapping[str, str]
    python: str


@dataclass(frozen=True)
class ImagePart:
    config_digest: str
    name: str | None
    already_loaded: bool
    tag_only: bool
    send: tuple[Blob, ...]
    present: tuple[Blob, ...]  # in the host's store, or layers its docker holds (`in_docker` of them)
    in_docker: tuple[Blob, ...] = ()

    @property
    def bytes_to_send(self) -> int:
        return sum(b.size for b in self.send)

    @property
    def needs_finish(self) -> bool:
        return not self.already_loaded or self.tag_only

    def to_json(self) -> dict:
        return {"config_digest": self.config_digest, "name": self.name, "already_loaded": self.already_loaded,
                "tag_only": self.tag_only, "send": [b.to_json() for b in self.send],
                "present": [b.to_json() for b in self.present], "blobs_to_send": len(self.send),
                "blobs_present": len(self.present), "blobs_in_docker": len(self.in_docker),
                "bytes_to_send": self.bytes_to_send}


@dataclass(frozen=True)
class EntryPart:
    entry: EntryToShip
    send: tuple[Blob, ...]
    present: tuple[Blob, ...]
    snapshot_current: bool
    ref_current: bool

    @property
    def bytes_to_send(self) -> int:
        return sum(b.size for b in self.send)

    @property
    def needs_finish(self) -> bool:
        return bool(self.send) or not (self.snapshot_current and self.ref_current)

    def to_json(self) -> dict:
        return {"entry": self.entry.name, "revision": self.entry.layout.revision,
                "send": [b.to_json() for b in self.send], "present": [b.to_json() for b in self.present],
                "blobs_to_send": len(self.send), "blobs_present": len(self.present),
                "bytes_to_send": self.bytes_to_send, "snapshot_current": self.snapshot_current,
                "ref_current": self.ref_current}


@dataclass(frozen=True)
class HostPlan:
    target: Target
    error: str | None
    image: ImagePart | None = None
    weights: tuple[EntryPart, ...] = ()
    room: tuple[tuple[str, int, int], ...] = ()  # (where, bytes needed, bytes free) per filesystem written

    @property
    def send(self) -> tuple[Blob, ...]:
        return (self.image.send if self.image else ()) + tuple(b for e in self.weights for b in e.send)

    @property
    def bytes_to_send(self) -> int:
        return sum(b.size for b in self.send)

    @property
    def up_to_date(self) -> bool:
        return self.error is None and not (self.image and self.image.needs_finish) and not any(
            e.needs_finish for e in self.weights)

    def to_json(self) -> dict:
        return {**self.target.to_json(), "error": self.error, "up_to_date": self.up_to_date,
                "bytes_to_send": self.bytes_to_send,
                "image": self.image.to_json() if self.image else None,
                "weights": [e.to_json() for e in self.weights],
                "room": [{"at": at, "needed": need, "free": free} for at, need, free in self.room]}


@dataclass(frozen=True)
class ShipPlan:
    image: ImageToShip | None
    entries: tuple[EntryToShip, ...]
    hosts: tuple[HostPlan, ...]
    streams: int

    def to_json(self) -> dict:
        return {"image": self.image.to_json() if self.image else None,
                "entries": [{"entry": e.name, "revision": e.layout.revision, "blobs": len(e.blobs),
                             "bytes": sum(b.size for b in e.blobs)} for e in self.entries],
                "streams": self.streams, "hosts": [h.to_json() for h in self.hosts]}


def _split(blobs: tuple[Blob, ...], inv: Inventory) -> tuple[tuple[Blob, ...], tuple[Blob, ...]]:
    send = tuple(b for b in blobs if inv.blobs.get(b.key, BlobState("missing")).state != "present")
    present = tuple(b for b in blobs if b not in send)
    return send, present


def plan_host(target: Target, image: ImageToShip | None, entries: tuple[EntryToShip, ...],
              inv: Inventory | str) -> HostPlan:
    if isinstance(inv, str):
        return HostPlan(target, inv)
    part = None
    if image is not None:
        if inv.docker_error:
            return HostPlan(target, f"{inv.docker_error}; the image cannot be loaded there")
        if inv.holds_image:
            part = ImagePart(image.config_digest, image.name, True, not inv.image_named, (), image.blobs)
        else:
            # Layers docker holds as a chain are skipped by its load: they need not be on the host's store.
            needed = set(image.layers[inv.layers_held:])
            in_docker = tuple(b for b in image.blobs if b.key in image.layers and b.key not in needed)
            send, present = _split(tuple(b for b in image.blobs if b not in in_docker), inv)
            part = ImagePart(image.config_digest, image.name, False, False, send, present + in_docker, in_docker)
    weights = []
    for entry in entries:
        send, present = _split(entry.blobs, inv)
        snap, ref = inv.entries.get(entry.name, (False, False))
        weights.append(EntryPart(entry, send, present, snap, ref))
    plan = HostPlan(target, None, part, tuple(weights))
    return _check_room(plan, inv)


def _check_room(plan: HostPlan, inv: Inventory) -> HostPlan:
    """Bytes still to write per filesystem (what the host has, partials included, is not counted) vs free space."""
    need: dict[int, int] = {}
    where: dict[int, Room] = {}
    for b in plan.send:
        room = inv.room.get(b.area)
        if room is None:
            continue
        need[room.device] = need.get(room.device, 0) + b.size - inv.blobs.get(b.key, BlobState("missing")).have
        where[room.device] = room
    have = sum(b.size for b in ((plan.image.present if plan.image and not plan.image.already_loaded else ()) +
                                tuple(x for e in plan.weights for x in e.present)))
    rows = tuple((where[d].at, n, where[d].free) for d, n in sorted(need.items()))
    short = [(at, n, free) for at, n, free in rows if n > free]
    if short:
        at, n, free = short[0]
        error = (f"not enough room on {at}: {human_bytes(n, 'GiB')} must be written but {human_bytes(free, 'GiB')} is free "
                 f"({human_bytes(have, 'GiB')} already there was not counted)")
        return HostPlan(plan.target, error, plan.image, plan.weights, rows)
    return HostPlan(plan.target, None, plan.image, plan.weights, rows)


def plan_ship(image: ImageToShip | None, entries: tuple[EntryToShip, ...], targets: tuple[Target, ...],
              inventories: Mapping[str, Inventory | str], streams: int) -> ShipPlan:
    hosts = tuple(plan_host(t, image, entries, inventories[t.host]) for t in targets)
    return ShipPlan(image, entries, hosts, streams)
