"""Probing hosts and carrying out a ship plan: every host at once, up to N ssh streams per host.

Per host: the missing blobs go, largest first, over at most `streams` connections (one blob on a
stream at a time); then one last connection checks every blob again, rebuilds snapshot links and
refs/main, and loads the image from the host's own store into its docker. A blob docker's load finds
corrupt is dropped there and sent once more. A host's failure is its own: the others carry on.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sparkstack.deploy import Deployment
from sparkstack.errors import SparkstackError
from sparkstack.remote import Runner
from sparkstack.ship import wire
from sparkstack.ship.local import entries_to_ship, remember_image, resolve_image, targets_from
from sparkstack.ship.plan import (
    Blob, EntryToShip, HostPlan, ImageToShip, Inventory, ShipPlan, Target, default_streams, plan_ship,
)

Progress = Callable[[str, int], None]


# ---------------------------------------------------------------- probing (read-only with readonly=True)


def inventory_request(target: Target, image: ImageToShip | None, entries: tuple[EntryToShip, ...],
                      readonly: bool) -> dict:
    blobs = [b.wire() for b in (image.blobs if image else ())] + [b.wire() for e in entries for b in e.blobs]
    req = {"readonly": readonly, "hub": target.hub, "blobs": blobs,
           "entries": [e.layout.to_json() for e in entries]}
    if image is not None:
        req["image"] = {"config_digest": image.config_digest, "name": image.name, "docker_host": target.docker_host,
                        "diff_ids": list(image.diff_ids)}
    return req


def _in_parallel(items, work: Callable) -> list:
    """work(item) for every item in its own daemon thread (a Ctrl-C is never stuck behind one); results in order."""
    results: list = [None] * len(items)

    def run(i, item):
        results[i] = work(item)

    threads = [threading.Thread(target=run, args=(i, item), daemon=True) for i, item in enumerate(items)]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.2)
    return results


def probe(targets: tuple[Target, ...], image: ImageToShip | None, entries: tuple[EntryToShip, ...],
          readonly: bool) -> dict[str, Inventory | str]:
    """One round trip per host, all hosts at once. A host that cannot answer gets its one-line reason."""
    def one(target: Target) -> Inventory | str:
        try:
            return wire.inventory(target.runner, inventory_request(target, image, entries, readonly))
        except SparkstackError as exc:
            return str(exc)
        except OSError as exc:
            return f"{exc.strerror or exc}"

    return dict(zip((t.host for t in targets), _in_parallel(list(targets), one)))


def plan_with_probe(image: ImageToShip | None, entries: tuple[EntryToShip, ...], targets: tuple[Target, ...],
                    streams: int, readonly: bool) -> ShipPlan:
    return plan_ship(image, entries, targets, probe(targets, image, entries, readonly), streams)


def plan_deployment_ship(deployment: Deployment, hosts: tuple[str, ...], via: str | None, ssh_config: Path | None,
                         image_arg: str | None, no_image: bool, models: tuple[str, ...], no_weights: bool,
                         streams: int | None, platform: str | None, readonly: bool) -> ShipPlan:
    """`sparkstack ship`'s plan: the targets (recipe nodes by name, else plain ssh targets; default: every worker),
    the image (--image, else the one launch would run), the cache entries (--model, else the recipe's model and
    drafter) and what each host lacks of them (asked read-only with `readonly`)."""
    targets = targets_from(deployment, hosts, via, ssh_config)
    head = Runner(docker_host=deployment.ranks[0].docker_host)
    image = None if no_image else resolve_image(image_arg or deployment.image, image_arg is not None, head, platform)
    entries = () if no_weights else entries_to_ship(deployment.local_hub, models or deployment.cache_names)
    return plan_with_probe(image, entries, targets, streams or default_streams(os.cpu_count()), readonly=readonly)


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class ImageResult:
    config_digest: str
    blobs_sent: int
    blobs_present: int
    bytes_sent: int
    bytes_resumed: int
    partials_restarted: int
    loaded: bool
    already_loaded: bool
    tagged: bool
    blobs_in_docker: int  # layers its docker already held (counted in blobs_present): neither sent nor loaded

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class EntryResult:
    entry: str
    revision: str
    blobs_sent: int
    blobs_present: int
    bytes_sent: int
    bytes_resumed: int
    partials_restarted: int
    snapshot: str  # "rebuilt" or "up to date"
    ref: str  # "written" or "up to date"

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class HostResult:
    host: str
    via: str
    error: str | None
    seconds: float
    started_s: float  # after the ship began: hosts run at once
    image: ImageResult | None
    weights: tuple[EntryResult, ...]

    def to_json(self) -> dict:
        return {"host": self.host, "via": self.via, "error": self.error, "seconds": self.seconds,
                "started_s": self.started_s, "image": self.image.to_json() if self.image else None,
                "weights": [w.to_json() for w in self.weights]}


@dataclass(frozen=True)
class ShipResult:
    hosts: tuple[HostResult, ...]

    @property
    def failed(self) -> tuple[HostResult, ...]:
        return tuple(h for h in self.hosts if h.error)

    def to_json(self) -> dict:
        return {"hosts": [h.to_json() for h in self.hosts]}


# ---------------------------------------------------------------- moving bytes


def send_blobs(target: Target, blobs: tuple[Blob, ...], streams: int, on_bytes: Callable[[int], None],
               done: dict[str, tuple[int, int, int]]) -> None:
    """Send `blobs` over up to `streams` connections, largest first, filling key -> (bytes sent, bytes resumed,
    partials restarted) in `done` as each one lands (so a host that fails half way still reports what crossed).
    Bytes sent count every attempt, the ones the host refused included."""
    todo: queue.Queue[Blob] = queue.Queue()
    for b in sorted(blobs, key=lambda b: -b.size):
        todo.put(b)
    errors: list[Exception] = []

    def worker() -> None:
        stream = None
        try:
            while not errors:
                try:
                    blob = todo.get_nowait()
                except queue.Empty:
                    return
                if stream is None:
                    stream = wire.Stream(target.runner, target.hub)
                s, r, restarted = _send_checked(stream, blob, on_bytes)
                old = done.get(blob.key, (0, 0, 0))
                done[blob.key] = (old[0] + s, r or old[1], old[2] + restarted)
        except (SparkstackError, OSError) as exc:
            errors.append(exc)
        finally:
            if stream is not None:
                stream.session.close(kill=bool(errors))

    _in_parallel(list(range(min(streams, len(blobs)))), lambda _: worker())
    if errors:
        exc = errors[0]
        raise exc if isinstance(exc, SparkstackError) else SparkstackError(f"{exc.strerror or exc}")


def _send_checked(stream: wire.Stream, blob: Blob, on_bytes: Callable[[int], None]) -> tuple[int, int, int]:
    """(bytes sent over both tries, bytes resumed, partials restarted) for one blob the host ends up holding."""
    first = stream.send_blob(blob, on_bytes)
    if first.refused is None:
        return first.sent, first.resumed, int(first.restarted)
    # The host refused the bytes it got. If ours do not match the name either, say so: never resend bad bytes.
    if wire.local_digest(blob) != blob.digest:
        raise SparkstackError(f"the head's copy of {blob.key} ({blob.source}) does not match its name; not shipped")
    again = stream.send_blob(blob, on_bytes)  # once more: a transport fault, not our data
    if again.refused is not None:
        raise wire.ShipError(again.refused)
    return first.sent + again.sent, again.resumed, int(first.restarted) + int(again.restarted)


def _finish_request(target: Target, plan: ShipPlan, host: HostPlan) -> dict:
    req: dict = {"hub": target.hub, "entries": [], "image": None}
    for part in host.weights:
        if part.needs_finish:
            req["entries"].append({**part.entry.layout.to_json(), "blobs": [b.wire() for b in part.entry.blobs]})
    if host.image is not None and host.image.needs_finish:
        img = plan.image
        req["image"] = {"config_digest": img.config_digest, "name": img.name, "docker_host": target.docker_host,
                        "layers": list(img.layers), "diff_ids": list(img.diff_ids), "blobs": [b.wire() for b in img.blobs],
                        "index_entry": img.index_entry}
    return req


def ship_host(plan: ShipPlan, host: HostPlan, t0: float, on_progress: Progress | None) -> HostResult:
    target = host.target
    started = time.monotonic()
    sent: dict[str, tuple[int, int, int]] = {}

    def on_bytes(n: int) -> None:
        if on_progress:
            on_progress(target.host, n)

    def counts(send: tuple[Blob, ...], present: tuple[Blob, ...]) -> tuple[int, int, int, int, int]:
        """(blobs sent, blobs present, payload bytes written, bytes of verified prefixes not resent,
        partials on the host that failed their prefix check and were sent again from byte 0)."""
        crossed = [b for b in send if sent.get(b.key, (0, 0, 0))[:2] != (0, 0)]
        return (len(crossed), len(present) + sum(1 for b in send if b.key in sent and sent[b.key][:2] == (0, 0)),
                sum(sent[b.key][0] for b in crossed), sum(sent[b.key][1] for b in crossed),
                sum(sent[b.key][2] for b in crossed))

    def result(error: str | None, finished: dict | None) -> HostResult:
        finished = finished or {}
        image = None
        if host.image is not None:
            fin = finished.get("image") or {}
            extra = tuple(b for b in plan.image.blobs if b.key in sent and b not in host.image.send)
            present = tuple(b for b in host.image.present if b not in extra)
            image = ImageResult(host.image.config_digest, *counts(host.image.send + extra, present),
                                bool(fin.get("loaded")), host.image.already_loaded, bool(fin.get("tagged")),
                                len(tuple(b for b in host.image.in_docker if b not in extra)))
        weights = []
        for part in host.weights:
            fin = (finished.get("entries") or {}).get(part.entry.name) or {}
            weights.append(EntryResult(
                part.entry.name, part.entry.layout.revision, *counts(part.send, part.present),
                fin.get("snapshot", "up to date" if part.snapshot_current else "not rebuilt"),
                fin.get("ref", "up to date" if part.ref_current else "not written")))
        return HostResult(target.host, target.via, error, round(time.monotonic() - started, 3),
                          round(started - t0, 3), image, tuple(weights))

    if host.error is not None:
        return result(host.error, None)
    try:
        if host.send:
            send_blobs(target, host.send, plan.streams, on_bytes, sent)
        finished = None
        req = _finish_request(target, plan, host)
        if req["entries"] or req["image"]:
            finished = wire.finish(target.runner, req)
            resend = set(((finished.get("image") or {}).get("resend")) or [])
            if resend:  # bad bytes under a good name (dropped there now), or a layer docker no longer holds
                again = tuple(b for b in plan.image.blobs if b.key in resend)
                if len(again) != len(resend):
                    raise SparkstackError(f"the host asked for unknown blobs: {sorted(resend)[:3]}")
                send_blobs(target, again, plan.streams, on_bytes, sent)
                again_done = wire.finish(target.runner, {**req, "entries": []})  # the entries are done already
                finished["image"] = again_done.get("image")
                if (finished.get("image") or {}).get("resend"):
                    raise SparkstackError("the image's blobs failed their check on the host twice")
        return result(None, finished)
    except SparkstackError as exc:
        return result(str(exc), None)
    except OSError as exc:
        return result(f"{exc.strerror or exc}", None)


def apply_ship(plan: ShipPlan, on_progress: Progress | None = None) -> ShipResult:
    t0 = time.monotonic()
    return ShipResult(tuple(_in_parallel(list(plan.hosts), lambda h: ship_host(plan, h, t0, on_progress))))


def apply_ship_recorded(plan: ShipPlan, on_progress: Progress | None = None) -> tuple[ShipResult, str | None]:
    """Record the image in the head's store first (so `--image DIGEST` finds it later), then ship. Returns the
    result and the store's line (None when the store had the image already, or no image is shipped)."""
    note = remember_image(plan.image) if plan.image is not None else None
    return apply_ship(plan, on_progress), note
