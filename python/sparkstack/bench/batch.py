"""A batch: concurrent streamed requests between two /metrics scrapes. Every bench round is one, and soak
reuses it: `run_concurrent(endpoint, bodies)` gives each request's stream (or its failure) and the metrics around.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

from ..endpoint import metrics
from ..endpoint.client import Endpoint, EndpointError, StreamResult


@dataclass(frozen=True)
class Outcome:
    """One request: its stream as received, or why it failed (`error_kind` as EndpointError.kind)."""
    result: StreamResult | None
    error_kind: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class Batch:
    """Concurrent streams sent at once; `wall_s` runs from the first send to the last stream's end. The scrapes are
    None when not taken (a server without /metrics)."""
    outcomes: tuple[Outcome, ...]
    wall_s: float
    before: metrics.Scrape | None
    after: metrics.Scrape | None

    @property
    def results(self) -> tuple[StreamResult, ...]:
        return tuple(o.result for o in self.outcomes if o.result is not None)

    @property
    def failures(self) -> tuple[Outcome, ...]:
        return tuple(o for o in self.outcomes if o.result is None)

    @property
    def spec(self) -> metrics.SpecDelta | None:
        """Spec-decode activity during the batch; None without both scrapes or without spec counters."""
        if self.before is None or self.after is None:
            return None
        return metrics.spec_delta(self.before, self.after)

    @property
    def restarted(self) -> list[str]:
        """Counters that went back during the batch (the engine restarted)."""
        return metrics.went_back(self.before, self.after) if self.before and self.after else []


def _one(endpoint: Endpoint, body: dict) -> Outcome:
    try:
        return Outcome(endpoint.stream_chat(body))
    except EndpointError as exc:
        return Outcome(None, exc.kind, str(exc))


def run_concurrent(endpoint: Endpoint, bodies: Sequence[dict], *, scrape: bool = True,
                   before: metrics.Scrape | None = None,
                   on_done: Callable[[Outcome], None] | None = None) -> Batch:
    """Stream every body at once (one thread each) and wait for all. With `scrape`, /metrics is read right before
    (unless `before` is that read already, e.g. the previous batch's `after`) and right after."""
    if scrape and before is None:
        before = endpoint.scrape()
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, len(bodies))) as pool:
        futures = [pool.submit(_one, endpoint, body) for body in bodies]
        for f in as_completed(futures):
            if on_done is not None:
                on_done(f.result())
    wall = time.monotonic() - t0
    outcomes = [f.result() for f in futures]
    after = endpoint.scrape() if scrape else None
    return Batch(tuple(outcomes), wall, before, after)
