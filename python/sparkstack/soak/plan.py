"""The soak plan: what will be sent, how fast, for how long, and where the log goes. Pure data, no I/O."""

from __future__ import annotations

import math
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from sparkstack.deploy import Deployment
from sparkstack.errors import UsageError

UNITS = {"s": 1, "m": 60, "h": 3600}
MAX_DURATION_S = 7 * 24 * 3600
CAP_PER_STREAM_S = 2  # default hard cap: 2 requests per second per stream, far above any real decode rate
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def parse_duration(text: str) -> float:
    """Seconds in `90s`, `30m`, `2h`, `1h30m`, `0.5h` (ASCII digits, lower-case units); anything else (a bare
    number, `1M`, full-width digits) is a usage error."""
    raw = text.strip()
    parts = re.findall(r"([0-9]+(?:\.[0-9]+)?)([smh])", raw)
    if not raw or not parts or "".join(n + u for n, u in parts) != raw or len({u for _, u in parts}) != len(parts):
        raise UsageError(f"{text!r} is not a duration: say e.g. 90s, 30m, 2h or 1h30m")
    seconds = sum(float(n) * UNITS[u] for n, u in parts)
    if not math.isfinite(seconds) or seconds <= 0 or seconds > MAX_DURATION_S:
        raise UsageError(f"{text!r}: a duration must be more than 0 and at most 7 days")
    return seconds


def human_duration(seconds: float) -> str:
    s = round(seconds)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (s, "s")) if v) or f"{seconds:g}s"


@dataclass(frozen=True)
class ContainerWatch:
    """The head rank of the deployment when the URL is its API port on this host: its container start time is
    a second restart signal. `deployment` is deploy's frozen plan, cut to the head rank."""
    name: str
    deployment: Deployment


@dataclass(frozen=True)
class SoakPlan:
    url: str
    duration_s: float
    concurrency: int
    categories: tuple[str, ...]
    window_s: float
    max_requests: int
    max_requests_given: bool
    log: Path
    health_interval_s: float
    dead_after_s: float
    max_tokens: int
    temperature: float
    top_p: float
    model: str | None  # None: the first of /v1/models, asked at start
    request_timeout_s: float
    container: ContainerWatch | None
    container_note: str

    def to_json(self) -> dict:
        return {
            "url": self.url, "duration_s": self.duration_s, "concurrency": self.concurrency,
            "categories": list(self.categories), "window_s": self.window_s, "max_requests": self.max_requests,
            "log": str(self.log), "health_interval_s": self.health_interval_s, "dead_after_s": self.dead_after_s,
            "max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
            "model": self.model, "request_timeout_s": self.request_timeout_s,
            "container": self.container.name if self.container else None, "container_note": self.container_note,
        }

    def lines(self) -> list[str]:
        cap_why = "--max-requests" if self.max_requests_given else \
            f"default: {CAP_PER_STREAM_S}/s per stream over the duration; --max-requests"
        return [
            f"soak {self.url} for {human_duration(self.duration_s)} with {self.concurrency} concurrent streams",
            (f"prompts: suite categories {', '.join(self.categories)}, max_tokens {self.max_tokens}, "
             f"temperature {self.temperature:g}, top_p {self.top_p:g}, model {self.model or '(first of /v1/models)'}"),
            f"hard cap: {self.max_requests:,} requests ({cap_why})",
            (f"windows of {human_duration(self.window_s)}; /health and /metrics every {self.health_interval_s:g} s; "
             f"dead after {self.dead_after_s:g} s without /health"),
            f"log (JSONL, append-only, one line per request and per window): {self.log}",
            f"container start time: {self.container_note}",
        ]


def is_this_host(hostname: str) -> bool:
    return hostname in LOOPBACK or hostname.startswith("127.") or hostname == socket.gethostname()


def container_watch(url: str, deployment: Deployment) -> tuple[ContainerWatch | None, str]:
    """Watch the head's container when the URL is the plan's API port on this host and the head runs here."""
    parts = urlsplit(url)
    head = deployment.ranks[0]
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if head.ssh is not None:
        return None, f"not watched: the recipe's head ({head.host}) is not this host"
    if not is_this_host(parts.hostname or "") or port != deployment.api_port:
        return None, f"not watched: {url} is not the recipe's API port {deployment.api_port} on this host"
    import dataclasses  # the plan cut to the head: status() asks only its docker, never a worker over ssh

    return (ContainerWatch(head.name, dataclasses.replace(deployment, ranks=(head,))),
            f"container {head.name} watched once per window (launch status)")


def plan_soak(url: str, *, duration_s: float, concurrency: int, categories: tuple[str, ...], window_s: float,
               max_requests: int | None, log: Path, health_interval_s: float, dead_after_s: float, max_tokens: int,
               temperature: float, top_p: float, model: str | None, request_timeout_s: float,
               deployment: Deployment | None = None) -> SoakPlan:
    if not 0 < top_p <= 1:  # as bench: top_p 0 keeps no token
        raise UsageError(f"--top-p {top_p:g}: must be in (0, 1]")
    window_s = min(window_s, duration_s)
    if health_interval_s > window_s:
        raise UsageError("--health-interval must not be longer than --window")
    cap = max_requests if max_requests is not None else max(1, math.ceil(duration_s * concurrency * CAP_PER_STREAM_S))
    watch, note = (None, "not watched: no --recipe") if deployment is None else container_watch(url, deployment)
    return SoakPlan(url, duration_s, concurrency, categories, window_s, cap, max_requests is not None, log,
                    health_interval_s, dead_after_s, max_tokens, temperature, top_p, model, request_timeout_s,
                    watch, note)
