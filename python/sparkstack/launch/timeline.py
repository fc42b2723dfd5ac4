"""The boot timeline: one rank's `docker logs --timestamps` -> its phases in seconds since its container started,
its KV figures, a fatal line or warnings (bootlines.BOOT_LINES); then the KV pool across ranks. Pure: no I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from sparkstack.launch.bootlines import BOOT_LINES, PHASES, BootLine
from sparkstack.launch.kv import plan_launch_kv
from sparkstack.launch.plan import LaunchPlan
from sparkstack.units import GIB

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d) ")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# vLLM's prefix: an optional `(Worker_TP0 pid=312) `, then `INFO 05-01 10:00:12 [file.py:N] ` (older builds
# `INFO 05-01 10:00:12 file.py:N] `) or uvicorn's `INFO:     `. Traceback lines carry at most the first part.
_PREFIX = re.compile(r"^(?:\([^)]*\)\s+)?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)"
                     r"(?::\s+|\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[?[\w./-]+:\d+\]\s+))?")
_COMPILED = tuple((line, re.compile(line.pattern)) for line in BOOT_LINES)


def docker_time(stamp: str) -> float:
    """Seconds since the epoch of a docker timestamp (`2026-05-01T10:00:12.123456789Z`; nanoseconds cut to micro)."""
    m = _STAMP.match(stamp + " ")
    if not m:
        raise ValueError(f"not a docker timestamp: {stamp!r}")
    whole, frac, zone = m.groups()
    base = datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone)).timestamp()
    return base + (float("0." + frac[:6]) if frac else 0.0)


def split_stamp(line: str) -> tuple[float | None, str]:
    """(epoch seconds, the line as the container printed it) of one `docker logs --timestamps` line."""
    m = _STAMP.match(line)
    return (docker_time(line[:m.end() - 1]), line[m.end():]) if m else (None, line)


def message(text: str) -> str:
    """The text after vLLM's prefix: what BOOT_LINES' patterns are matched against."""
    text = _ANSI.sub("", text).strip()
    return text[_PREFIX.match(text).end():]


def last_lines(logs: str, n: int) -> str:
    """The last n lines of a timestamped log in time order (docker hands stdout and stderr over apart), unstamped."""
    lines = [split_stamp(line) for line in logs.splitlines() if line.strip()]
    lines.sort(key=lambda pair: -1.0 if pair[0] is None else pair[0])
    return "\n".join(text for _, text in lines[-n:])


@dataclass(frozen=True)
class Seen:
    key: str
    text: str  # the message, without vLLM's prefix
    at_s: float | None  # seconds since the container started
    diagnosis: str = ""

    def to_json(self) -> dict:
        return {"key": self.key, "line": self.text, "at_s": self.at_s, "diagnosis": self.diagnosis}


@dataclass(frozen=True)
class RankTimeline:
    rank: int
    phases: tuple[tuple[str, float | None], ...]  # (phase, seconds since container start), first sighting, PHASES order
    kv_gib: float | None  # `Available KV cache memory` (the smallest, should the container hold several workers)
    kv_tokens: int | None  # `<device> KV cache size` (the engine core prints it: the head)
    concurrency: float | None
    fatal: Seen | None
    warnings: tuple[Seen, ...]
    graph_s: float | None = None  # `Graph capturing finished in X secs, took Y GiB`: X (absent under --enforce-eager)
    graph_gib: float | None = None  # and Y

    def to_json(self) -> dict:
        return {"rank": self.rank, "phases": dict(self.phases), "kv_available_gib": self.kv_gib,
                "kv_cache_tokens": self.kv_tokens, "max_concurrency": self.concurrency,
                "graph_capture_s": self.graph_s, "graph_capture_gib": self.graph_gib,
                "fatal": self.fatal.to_json() if self.fatal else None, "warnings": [w.to_json() for w in self.warnings]}


def _repeated_too_long(line: BootLine, times: list[float]) -> float | None:
    """How long a warning has repeated without a break, once that reaches its fatal_after_s; else None."""
    if line.fatal_after_s is None or line.repeats_every_s is None or not times:
        return None
    start = prev = times[0]
    for t in times[1:]:
        if t - prev > 2 * line.repeats_every_s:  # a break: it recovered in between
            start = t
        prev = t
    return prev - start if prev - start >= line.fatal_after_s else None


def parse_rank(rank: int, logs: str, started: float) -> RankTimeline:
    """One rank's timeline from its `docker logs --timestamps` output; `started` is its container's start (epoch s)."""
    phases: dict[str, float | None] = {}
    figures: dict[str, list[str]] = {}
    fatal: Seen | None = None
    warnings: list[Seen] = []
    for raw in logs.splitlines():
        stamp, text = split_stamp(raw)
        msg = message(text)
        at = None if stamp is None else round(stamp - started, 3)
        for line, rx in _COMPILED:
            m = rx.search(msg)
            if not m:
                continue
            if line.kind == "phase":
                phases.setdefault(line.phase, at)
                for name, value in m.groupdict().items():
                    figures.setdefault(name, []).append(value)
            elif line.kind == "fatal" and fatal is None:
                fatal = Seen(line.key, msg, at, line.diagnosis)
            elif line.kind == "warning":
                warnings.append(Seen(line.key, msg, at, line.diagnosis))
    for line, _ in _COMPILED:
        seen = [w for w in warnings if w.key == line.key and w.at_s is not None]
        lasted = _repeated_too_long(line, sorted(w.at_s for w in seen))
        if fatal is None and lasted is not None:
            fatal = Seen(line.key, seen[-1].text, seen[-1].at_s, f"repeated for {lasted:.0f} s without a break: "
                                                                 f"{line.diagnosis}")
    gib = [float(v) for v in figures.get("kv_gib", [])]
    tokens = figures.get("kv_tokens", [])
    conc = figures.get("concurrency", [])
    graph_s = [v for v in figures.get("graph_s", []) if v is not None]
    graph_gib = [v for v in figures.get("graph_gib", []) if v is not None]
    return RankTimeline(rank, tuple((p, phases[p]) for p in PHASES if p in phases), min(gib) if gib else None,
                        int(tokens[0].replace(",", "")) if tokens else None, float(conc[0]) if conc else None,
                        fatal, tuple(warnings), float(graph_s[0]) if graph_s else None,
                        float(graph_gib[0]) if graph_gib else None)


@dataclass(frozen=True)
class KvPool:
    """The KV pool is the minimum across ranks (each profiles its own; the worker usually 3.0-4.8 GiB less than the
    head); in tokens through the recipe's measured bytes per token."""

    kv_bytes: int
    smallest_rank: int
    ranks: tuple[int, ...]  # the ranks that reported
    tokens: int | None
    per_token_bytes: float | None

    def to_json(self) -> dict:
        return {"bytes": self.kv_bytes, "smallest_rank": self.smallest_rank, "ranks": list(self.ranks),
                "tokens": self.tokens, "per_token_bytes": self.per_token_bytes}


def kv_pool(plan: LaunchPlan, timelines: list[RankTimeline]) -> KvPool | None:
    reported = [t for t in timelines if t.kv_gib is not None]
    if not reported:
        return None
    smallest = min(reported, key=lambda t: t.kv_gib)
    # vLLM prints GiB to two decimals: the bytes are that figure's, good to about 5 MiB.
    pool_bytes = round(smallest.kv_gib * GIB)
    kv = plan_launch_kv(plan, pool_bytes)
    return KvPool(pool_bytes, smallest.rank, tuple(t.rank for t in reported), kv.tokens, kv.per_token_bytes)


def secs(at: float | None) -> str:
    return "? s" if at is None else f"{at:.1f} s"


def timeline_lines(timeline: list[dict], pool: dict | None) -> list[str]:
    """The human form of a boot's timeline and pool, from their JSON (a live boot's or a run record's)."""
    lines = ["boot timeline (seconds since each rank's container started):"]
    for rank in timeline:
        done = ", ".join(f"{p} {secs(s)}" for p, s in rank["phases"].items())
        kv = "?" if rank["kv_available_gib"] is None else f"{rank['kv_available_gib']:.2f} GiB"
        lines.append(f"  rank {rank['rank']}: {done or 'no phase seen'}; Available KV cache memory {kv}")
        lines += [f"  rank {rank['rank']}: warning (not fatal) at {secs(w['at_s'])}: {w['line']}" for w in rank["warnings"]]
    if pool is None:
        lines.append("KV pool: unknown (no rank printed `Available KV cache memory` or the pin it reserved)")
    else:
        tokens = "? tokens (no measured bytes per token)" if pool["tokens"] is None else \
            f"{pool['tokens']:,} tokens at {pool['per_token_bytes']:,.2f} B/token"
        lines.append(f"KV pool (minimum across ranks {', '.join(map(str, pool['ranks']))}: rank {pool['smallest_rank']}): "
                     f"{pool['bytes']:,} B = {tokens}")
    return lines
