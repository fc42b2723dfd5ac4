"""A batch: concurrent streamed requests between two /metrics scrapes. Every bench round is one:
`run_concurrent(endpoint, bodies)` gives each request's stream (or its failure) and the metrics around.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sparkstack.endpoint import metrics
from sparkstack.endpoint.client import Endpoint, EndpointError, StreamResult


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
    except Exception as exc:  # noqa: BLE001 - a stream thread that died unheard would leave the batch waiting forever
        return Outcome(None, "internal", f"chat: {type(exc).__name__}: {exc}")


def run_concurrent(endpoint: Endpoint, bodies: Sequence[dict], *, scrape: bool = True,
                   before: metrics.Scrape | None = None,
                   on_done: Callable[[Outcome], None] | None = None) -> Batch:
    """Stream every body at once (one thread each) and wait for all. With `scrape`, /metrics is read right before
    (unless `before` is that read already, e.g. the previous batch's `after`) and right after."""
    if scrape and before is None:
        before = endpoint.scrape()
    t0 = time.monotonic()
    done: queue.SimpleQueue[tuple[int, Outcome]] = queue.SimpleQueue()
    # Daemon threads, not a pool: on Ctrl-C the main thread leaves at once and abandons the open streams (a
    # pool's shutdown, and the interpreter's exit, would wait each one out to its --timeout).
    for i, body in enumerate(bodies):
        threading.Thread(target=lambda i=i, body=body: done.put((i, _one(endpoint, body))), daemon=True,
                         name=f"bench-stream-{i}").start()
    outcomes: list[Outcome | None] = [None] * len(bodies)
    for _ in bodies:
        i, outcome = _wait(done)
        outcomes[i] = outcome
        if on_done is not None:
            on_done(outcome)
    wall = time.monotonic() - t0
    after = endpoint.scrape() if scrape else None
    return Batch(tuple(o for o in outcomes if o is not None), wall, before, after)


def _wait(done: queue.SimpleQueue):
    """The next finished stream; waits in short slices so that Ctrl-C is seen at once."""
    while True:
        try:
            return done.get(timeout=0.2)
        except queue.Empty:
            continue
