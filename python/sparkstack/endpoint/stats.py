"""Percentiles and spread, defined once for every report."""

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's default)."""
    xs = sorted(v for v in values if v is not None and math.isfinite(v))
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def spread(values: Sequence[float]) -> float | None:
    """(max - min) / mean: how far apart rounds are, as a fraction of their mean. None with under two values."""
    xs = [v for v in values if v is not None and math.isfinite(v)]
    if len(xs) < 2:
        return None
    mean = sum(xs) / len(xs)
    return (max(xs) - min(xs)) / mean if mean else None


def mean(values: Sequence[float]) -> float | None:
    xs = [v for v in values if v is not None and math.isfinite(v)]
    return sum(xs) / len(xs) if xs else None


# ---------------------------------------------------------------- sampling integrity
# vLLM's logprobs are the model's own (raw, temperature 1) log-probabilities p_i of the sampled tokens. Sampling
# at temperature T draws token i with q_i = p_i^(1/T) / sum_j p_j^(1/T). The largest p_j is at least 1/V (V tokens),
# so q_i <= (p_i / p_max)^(1/T) <= (V p_i)^(1/T). For T' = max(T, 1) and V p_i <= 1 that is at most (V p_i)^(1/T'),
# and the chance that one draw lands on any token with p_i <= eps is at most V (V eps)^(1/T'). Over n draws (a
# union bound) it is at most n V (V eps)^(1/T'). Setting that to ALPHA:
#     ln eps = T' ln(ALPHA / (n V)) - ln V.
# A false alarm in a run of n sampled tokens is then rarer than ALPHA, whatever the model. V is bounded above by
# VOCAB_BOUND (2^20; GLM's vocabulary is about 151k): a smaller real vocabulary only makes the check safer. Top-p
# and top-k only take low tokens away, and greedy decoding (T = 0) draws the argmax (p >= 1/V): both stay clear.
ALPHA = 1e-6
VOCAB_BOUND = 1 << 20


def implausible_logprob(n_sampled: int, temperature: float = 1.0) -> float:
    """The logprob below which a sampled token is not one honest sampling gives in a run of `n_sampled` tokens
    at `temperature`: about -44.3 for 16 tokens at T <= 1, -51.2 for 16,000."""
    t = max(1.0, temperature)
    return t * math.log(ALPHA / (max(1, n_sampled) * VOCAB_BOUND)) - math.log(VOCAB_BOUND)


def implausible_tokens(logprobs: Sequence[float], temperature: float = 1.0, n_sampled: int | None = None) -> int:
    """How many of the sampled tokens' logprobs lie below the threshold for the run's `n_sampled` tokens
    (default: these). -inf counts; NaN is no reading and does not."""
    cut = implausible_logprob(len(logprobs) if n_sampled is None else n_sampled, temperature)
    return sum(1 for v in logprobs if v is not None and not math.isnan(v) and v < cut)
