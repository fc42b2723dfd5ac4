"""vLLM's /metrics as frozen data, parsed with prometheus_client's own parser.

Only the names in FACTS.md §5 and §7 are read. Counters are exposed with a `_total` suffix; samples of one name
under several label sets (engines, models) are summed, except spec decode's `position` label, which is kept apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from ..errors import SparkstackError

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
        """1 + accepted / drafts (FACTS §5); None without drafts."""
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
