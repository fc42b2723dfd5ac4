"""What `top` shows, computed from a minute of /metrics scrapes. Pure: scrapes in, figures out.

Rates need two scrapes: generation tokens/s and the prefix-cache hit rate (delta hits / delta queries, both counted
in tokens) come from the last two; acceptance length and per-position rates from the oldest scrape of the last
minute and the newest. Any metric the engine does not export, or exports as NaN or Inf, is None ("n/a" on screen,
null in JSON), never an error.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque
from dataclasses import dataclass

from sparkstack.endpoint import metrics
from sparkstack.units import finite, rounded

MINUTE_S = 60.0


def _delta(a: metrics.Scrape, b: metrics.Scrape, name: str) -> float | None:
    x, y = a.get(name), b.get(name)
    return None if x is None or y is None else y - x


def _rate(a: metrics.Scrape, b: metrics.Scrape, name: str) -> float | None:
    d = _delta(a, b, name)
    return None if d is None or b.at <= a.at else d / (b.at - a.at)


def _hit_rate(a: metrics.Scrape, b: metrics.Scrape) -> float | None:
    queries, hits = _delta(a, b, metrics.PREFIX_QUERIES), _delta(a, b, metrics.PREFIX_HITS)
    return hits / queries if queries and hits is not None else None


@dataclass(frozen=True)
class Sample:
    running: float | None
    waiting: float | None
    generation_tok_s: float | None
    generation_tokens_delta: float | None
    interval_s: float | None        # between the last two scrapes: what the rates cover
    acceptance_length: float | None
    per_position: tuple[float, ...] | None
    drafts_delta: float | None
    minute_s: float | None          # what the acceptance figures cover (up to the last minute)
    kv_usage: float | None
    prefix_hit_rate: float | None
    prefix_queries_delta: float | None
    preemptions: float | None
    preemptions_delta: float | None  # over minute_s
    restarts_seen: int
    stream_tok_s: float | None = None  # per-stream decode rate by the server's clock, requests finished in minute_s
    itl_mean_s: float | None = None    # the server's mean inter-token (engine-step) latency over minute_s

    def to_json(self) -> dict:
        r = rounded
        return {
            "running": self.running, "waiting": self.waiting,
            "generation_tokens": {"per_s": r(self.generation_tok_s, 3), "delta": self.generation_tokens_delta,
                                  "over_s": r(self.interval_s, 3)},
            "acceptance_length": r(self.acceptance_length),
            "per_position": None if self.per_position is None else [r(v) for v in self.per_position],
            "drafts_delta": self.drafts_delta, "acceptance_over_s": r(self.minute_s, 3),
            "kv_cache_usage": r(self.kv_usage),
            "prefix_cache": {"hit_rate": r(self.prefix_hit_rate), "queries_delta": self.prefix_queries_delta,
                             "over_s": r(self.interval_s, 3)},
            "preemptions": {"total": self.preemptions, "delta": self.preemptions_delta,
                            "over_s": r(self.minute_s, 3)},
            "restarts_seen": self.restarts_seen,
            "stream_tok_s": r(self.stream_tok_s, 3), "itl_mean_s": r(self.itl_mean_s, 6),
        }


class History:
    """The scrapes of the last minute (plus the one just before it). Counters that went back mean the engine
    restarted: the history starts over from that scrape."""

    def __init__(self, minute_s: float = MINUTE_S) -> None:
        self.minute_s = minute_s
        self.scrapes: deque[metrics.Scrape] = deque()
        self.restarts_seen = 0

    def add(self, scrape: metrics.Scrape) -> None:
        if self.scrapes and metrics.went_back(self.scrapes[-1], scrape):
            self.scrapes.clear()
            self.restarts_seen += 1
        self.scrapes.append(scrape)
        while len(self.scrapes) > 2 and self.scrapes[1].at <= scrape.at - self.minute_s:
            self.scrapes.popleft()

    def sample(self, fresh: bool = True) -> Sample:
        """The figures now; all None before the first scrape, or when the last read failed (not `fresh`: the
        figures before it are not the figures now), and the rates None before the second."""
        if not self.scrapes or not fresh:
            return Sample(*([None] * (len(dataclasses.fields(Sample)) - 3)), restarts_seen=self.restarts_seen)
        return _finite(self._sample())

    def _sample(self) -> Sample:
        first, last = self.scrapes[0], self.scrapes[-1]
        prev = self.scrapes[-2] if len(self.scrapes) > 1 else None
        spec = metrics.spec_delta(first, last) if prev else None
        server = metrics.server_timing(first, last) if prev else None
        return Sample(
            running=last.get(metrics.RUNNING), waiting=last.get(metrics.WAITING),
            generation_tok_s=_rate(prev, last, metrics.GENERATION_TOKENS) if prev else None,
            generation_tokens_delta=_delta(prev, last, metrics.GENERATION_TOKENS) if prev else None,
            interval_s=last.at - prev.at if prev else None,
            acceptance_length=spec.acceptance_length if spec else None,
            per_position=spec.per_position if spec and spec.drafts > 0 else None,
            drafts_delta=spec.drafts if spec else None,
            minute_s=last.at - first.at if prev else None,
            kv_usage=last.get(*metrics.KV_USAGE),
            prefix_hit_rate=_hit_rate(prev, last) if prev else None,
            prefix_queries_delta=_delta(prev, last, metrics.PREFIX_QUERIES) if prev else None,
            preemptions=last.get(metrics.PREEMPTIONS),
            preemptions_delta=_delta(first, last, metrics.PREEMPTIONS) if prev else None,
            restarts_seen=self.restarts_seen,
            stream_tok_s=server.stream_tok_s if server else None,
            itl_mean_s=server.itl_mean_s if server else None,
        )

    def series(self) -> dict[str, list[float | None]]:
        """Per scrape interval of the last minute, for the sparklines."""
        pairs = list(itertools.pairwise(self.scrapes))
        spec = [metrics.spec_delta(a, b) for a, b in pairs]
        width = max((len(s.per_position) for s in spec if s), default=0)
        out: dict[str, list[float | None]] = {
            "running": [b.get(metrics.RUNNING) for _, b in pairs],
            "waiting": [b.get(metrics.WAITING) for _, b in pairs],
            "generation_tok_s": [_rate(a, b, metrics.GENERATION_TOKENS) for a, b in pairs],
            "acceptance_length": [s.acceptance_length if s else None for s in spec],
            "kv_usage": [b.get(*metrics.KV_USAGE) for _, b in pairs],
            "prefix_hit_rate": [_hit_rate(a, b) for a, b in pairs],
            "preemptions": [_delta(a, b, metrics.PREEMPTIONS) for a, b in pairs],
        }
        for i in range(width):
            out[f"position_{i}"] = [s.per_position[i] if s and i < len(s.per_position) else None for s in spec]
        return {name: [finite(v) for v in values] for name, values in out.items()}


def _finite(s: Sample) -> Sample:
    """The sample with every NaN or Inf figure as None: no figure on screen, in JSON or in the KV pool maths."""
    def clean(value):
        return tuple(map(finite, value)) if isinstance(value, tuple) else finite(value)

    return dataclasses.replace(s, **{f.name: clean(getattr(s, f.name)) for f in dataclasses.fields(s)
                                     if f.name != "restarts_seen"})
