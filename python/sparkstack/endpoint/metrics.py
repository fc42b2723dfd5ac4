"""vLLM's /metrics as frozen data, parsed with prometheus_client's own parser.

Only the names below are read (vLLM v1's server, spec-decode and request metrics). Counters are exposed with a
`_total` suffix; samples of one name under several label sets (engines, models) are summed, except spec decode's
`position` label, which is kept apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from sparkstack.errors import SparkstackError

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
DRAFT_TOKENS_PER_POS = "vllm:spec_decode_num_draft_tokens_per_pos_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # newer name first
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREEMPTIONS = "vllm:num_preemptions_total"
MAX_POSITIONS = 64  # num_speculative_tokens is a handful; a label beyond this is hostile, not a draft position


@dataclass(frozen=True)
class Scrape:
    """One /metrics read: summed sample values by name, and the per-position spec-decode series."""
    at: float  # time.monotonic() when it was read
    values: dict[str, float]
    per_pos: dict[str, tuple[float, ...]]  # name -> values by position 0..n-1

    def get(self, *names: str) -> float | None:
        return next((self.values[n] for n in names if n in self.values), None)


def parse(text: str, at: float) -> Scrape:
    """A Scrape of exposition text; text that is not Prometheus exposition is one clear error."""
    values: dict[str, float] = {}
    positions: dict[str, dict[int, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if not math.isfinite(s.value):
                    continue  # NaN or Inf is no reading: the figure shows as missing, never as a result
                if "position" in s.labels:
                    raw = s.labels["position"]
                    if not (raw.isascii() and raw.isdigit() and int(raw) < MAX_POSITIONS):
                        raise SparkstackError(f"/metrics: {s.name} has position label {raw[:20]!r}, "
                                              f"not 0..{MAX_POSITIONS - 1}")
                    slot = positions.setdefault(s.name, {})
                    slot[int(raw)] = slot.get(int(raw), 0.0) + s.value
                elif s.name.endswith("_perc"):  # a fraction per engine: the fullest engine, not the sum
                    values[s.name] = max(values.get(s.name, 0.0), s.value)
                else:
                    values[s.name] = values.get(s.name, 0.0) + s.value
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise SparkstackError(f"/metrics is not Prometheus text exposition ({exc})") from None
    per_pos = {name: tuple(slot.get(i, 0.0) for i in range(max(slot) + 1)) for name, slot in positions.items() if slot}
    return Scrape(at, values, per_pos)


@dataclass(frozen=True)
class SpecDelta:
    """Spec-decode activity between two scrapes."""
    drafts: float
    draft_tokens: float
    accepted: float
    accepted_per_pos: tuple[float, ...]
    draft_tokens_per_pos: tuple[float, ...] | None

    @property
    def acceptance_length(self) -> float | None:
        """1 + accepted / drafts (the bonus token every step emits, plus the drafts it accepted); None
        without drafts."""
        return 1 + self.accepted / self.drafts if self.drafts > 0 else None

    @property
    def per_position(self) -> tuple[float, ...]:
        """Rate at position i: accepted_per_pos[i] / drafts, or / draft_tokens_per_pos[i] where that counter exists."""
        if self.drafts <= 0:
            return ()
        out = []
        for i, acc in enumerate(self.accepted_per_pos):
            dt = self.draft_tokens_per_pos
            denom = dt[i] if dt is not None and i < len(dt) else self.drafts
            out.append(acc / denom if denom > 0 else 0.0)
        return tuple(out)

    @property
    def collapsed(self) -> bool:
        """vLLM #53030: drafts happen but (almost) none is accepted."""
        return self.drafts > 0 and self.acceptance_length is not None and self.acceptance_length <= 1.05


def has_spec(scrape: Scrape) -> bool:
    return DRAFTS in scrape.values and ACCEPTED in scrape.values


def spec_delta(before: Scrape, after: Scrape) -> SpecDelta | None:
    """None when either scrape lacks the spec-decode counters."""
    if not (has_spec(before) and has_spec(after)):
        return None

    def d(name: str) -> float:
        return after.values.get(name, 0.0) - before.values.get(name, 0.0)

    def d_pos(name: str) -> tuple[float, ...] | None:
        if name not in after.per_pos:
            return None
        a, b = after.per_pos[name], before.per_pos.get(name, ())
        return tuple(v - (b[i] if i < len(b) else 0.0) for i, v in enumerate(a))

    return SpecDelta(d(DRAFTS), d(DRAFT_TOKENS), d(ACCEPTED), d_pos(ACCEPTED_PER_POS) or (),
                     d_pos(DRAFT_TOKENS_PER_POS))


def went_back(before: Scrape, after: Scrape) -> list[str]:
    """Counters that are lower in `after`: the engine restarted between the scrapes."""
    return sorted(n for n, v in after.values.items() if n.endswith("_total") and v < before.values.get(n, 0.0))


# ---------------------------------------------------------------- the server's own view of request timing
# Histograms vLLM 0.32 observes once per finished request (vllm/v1/metrics/loggers.py), exposed as _sum/_count.
DECODE_TIME = "vllm:request_decode_time_seconds"          # first token to last, engine-core clock
ITL = "vllm:inter_token_latency_seconds"                   # one observation per engine step that gave tokens
TPOT = "vllm:request_time_per_output_token_seconds"        # decode time / (tokens - 1), per request
REQUEST_TOKENS = "vllm:request_generation_tokens"          # generated tokens, per request


@dataclass(frozen=True)
class ServerTiming:
    """What the server measured of the requests that finished between two scrapes."""
    requests: float
    decode_s: float            # summed over those requests
    decoded_tokens: float | None  # their tokens after the first (None without the tokens histogram)
    itl_mean_s: float | None
    tpot_mean_s: float | None

    @property
    def stream_tok_s(self) -> float | None:
        """Per-stream decode rate by the server's clock: tokens after the first / decode time."""
        return self.decoded_tokens / self.decode_s if self.decoded_tokens is not None and self.decode_s > 0 else None

    def to_json(self) -> dict:
        return {"requests": self.requests, "decode_s": self.decode_s, "stream_tok_s": self.stream_tok_s,
                "itl_mean_s": self.itl_mean_s, "tpot_mean_s": self.tpot_mean_s}


def server_timing(before: Scrape, after: Scrape) -> ServerTiming | None:
    """None when the server exports no decode-time histogram or no request finished in between."""
    def d(name: str) -> float | None:
        a, b = before.get(name), after.get(name)
        return None if a is None or b is None else b - a

    def mean(name: str) -> float | None:
        s, n = d(name + "_sum"), d(name + "_count")
        return s / n if s is not None and n else None

    requests, decode = d(DECODE_TIME + "_count"), d(DECODE_TIME + "_sum")
    if not requests or decode is None:
        return None
    tokens = d(REQUEST_TOKENS + "_sum")
    return ServerTiming(requests, decode, tokens - requests if tokens is not None else None, mean(ITL), mean(TPOT))


def add_timings(timings: list[ServerTiming]) -> ServerTiming | None:
    """Consecutive intervals' timings as one (means weighted by requests)."""
    timings = [t for t in timings if t is not None]
    if not timings:
        return None
    n = sum(t.requests for t in timings)

    def wmean(field: str) -> float | None:
        vals = [(getattr(t, field), t.requests) for t in timings]
        return None if any(v is None for v, _ in vals) else sum(v * w for v, w in vals) / n

    tokens = [t.decoded_tokens for t in timings]
    return ServerTiming(n, sum(t.decode_s for t in timings), None if None in tokens else sum(tokens),
                        wmean("itl_mean_s"), wmean("tpot_mean_s"))
