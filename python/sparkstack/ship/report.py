"""What `ship` shows: its plan before, and what it did after, as lines of text."""

from __future__ import annotations

from sparkstack.ship.apply import ShipResult
from sparkstack.ship.plan import ShipPlan
from sparkstack.units import human_bytes


def plan_lines(plan: ShipPlan) -> list[str]:
    """The human form of a ship plan (`ship --dry-run`)."""
    lines = []
    if plan.image:
        lines.append(f"image {plan.image.config_digest} ({plan.image.name or 'untagged'}) from {plan.image.path}")
    for e in plan.entries:
        lines.append(f"entry {e.name} @ {e.layout.revision}: {len(e.blobs)} blobs, "
                     f"{human_bytes(sum(b.size for b in e.blobs))}")
    for h in plan.hosts:
        t = h.target
        where = f"{t.host} (via {t.via}{' ' + t.runner.hostname if t.runner.hostname else ''})"
        if h.error:
            lines.append(f"{where}: error: {h.error}")
            continue
        if h.up_to_date:
            lines.append(f"{where}: up to date")
            continue
        lines.append(f"{where}: {human_bytes(h.bytes_to_send)} to send")
        if h.image:
            if h.image.already_loaded:
                lines.append("  image: already loaded" + (", would tag" if h.image.tag_only else ""))
            else:
                held = f" ({len(h.image.in_docker)} layers held by its docker)" if h.image.in_docker else ""
                lines.append(f"  image: send {len(h.image.send)} blobs ({human_bytes(h.image.bytes_to_send)}), "
                           f"{len(h.image.present)} there{held}; then load from the host's store")
        for w in h.weights:
            if not w.needs_finish:
                lines.append(f"  {w.entry.name}: up to date ({len(w.present)} blobs there)")
                continue
            todo = [] if w.snapshot_current and w.ref_current else ["rebuild snapshot links and refs/main"]
            lines.append(f"  {w.entry.name}: send {len(w.send)} blobs ({human_bytes(w.bytes_to_send)}), "
                       f"{len(w.present)} there" + (f"; {todo[0]}" if todo else ""))
        for at, need, free in h.room:
            lines.append(f"  room on {at}: {human_bytes(need)} needed, {human_bytes(free)} free")
    return lines


def result_lines(plan: ShipPlan, result: ShipResult) -> list[str]:
    """The human form of what a ship did, one line per host and item."""
    lines = []
    for h in result.hosts:
        if h.error:
            lines.append(f"{h.host}: error: {h.error}")
            continue
        i = h.image
        quiet = (i is None or (i.already_loaded and not i.tagged)) and all(
            w.blobs_sent == 0 and w.snapshot == "up to date" and w.ref == "up to date" for w in h.weights)
        if quiet:
            lines.append(f"{h.host}: up to date")
            continue
        if i:
            what = ("already loaded" + (", tagged" if i.tagged else "")) if i.already_loaded else \
                ("loaded into docker" if i.loaded else "not loaded")
            lines.append(f"{h.host}: image {i.config_digest[:19]}: sent {i.blobs_sent} blobs "
                         f"({human_bytes(i.bytes_sent)}), {i.blobs_present} already there; {what}")
        for w in h.weights:
            lines.append(f"{h.host}: {w.entry} @ {w.revision[:12]}: sent {w.blobs_sent} blobs "
                         f"({human_bytes(w.bytes_sent)}), {w.blobs_present} already there; snapshot {w.snapshot}")
        lines.append(f"{h.host}: done in {h.seconds:.1f} s")
    return lines
