"""Window records and the soak summary, computed from what was measured. Pure: no I/O, no clock."""

from __future__ import annotations

import itertools
from collections import Counter

from sparkstack.endpoint import timing
from sparkstack.endpoint.metrics import ServerTiming, SpecDelta, add_timings
from sparkstack.endpoint.stats import implausible_logprob, mean, percentile, spread
from sparkstack.soak.plan import human_duration
from sparkstack.text import printable
from sparkstack.units import ms
from sparkstack.units import rounded as _r

QUANTILES = (50, 90, 99)
HOUR_S = 3600.0
ENDINGS = {"duration": "ran its duration", "cap": "reached its request cap", "interrupted": "interrupted",
           "dead": "ended: the server is down", "streams": "ended: every request stream failed"}


def quantiles(values: list[float]) -> dict[str, float | None]:
    return {f"p{q}": _r(percentile(values, q)) for q in QUANTILES}


def request_fields(result, temperature: float = 1.0) -> dict:
    """The timings and tokens of one finished stream (an endpoint StreamResult). `low_logprobs`: its sampled
    tokens' logprobs below the implausible line for its own length; the window recounts them against the line
    for all of its tokens (a lower line: these are a superset)."""
    tokens = result.output_tokens
    decode = result.decode_s if len(result.token_times_s) >= 2 else None
    cut = implausible_logprob(len(result.logprobs), temperature)
    return {"error": None, "ttft_s": _r(result.first_token_s), "first_chunk_s": _r(result.first_chunk_s),
            "e2e_s": _r(result.end_s), "tpot_s": _r(result.tpot_s) if decode else None, "output_tokens": tokens,
            "tok_s": _r((tokens - 1) / decode, 3) if decode and tokens > 1 else None,
            "finish_reason": result.finish_reason, "sampled_tokens": len(result.logprobs),
            "low_logprobs": [v for v in result.logprobs if v < cut]}


def add_deltas(deltas: list[SpecDelta]) -> SpecDelta | None:
    """Spec-decode activity of consecutive scrape intervals, added up (intervals across a restart are left out)."""
    if not deltas:
        return None

    def add_pos(rows):
        if any(r is None for r in rows):
            return None
        return tuple(sum(col) for col in itertools.zip_longest(*rows, fillvalue=0.0))

    return SpecDelta(sum(d.drafts for d in deltas), sum(d.draft_tokens for d in deltas),
                     sum(d.accepted for d in deltas), add_pos([d.accepted_per_pos for d in deltas]) or (),
                     add_pos([d.draft_tokens_per_pos for d in deltas]))


def _stream_rate(ok: list[dict], server: ServerTiming | None) -> tuple[dict, str | None]:
    """The window's per-stream decode rate: the chunks' mean, or the server's where the chunks cannot measure it
    (a stream of one chunk) or disagree with the server's clock beyond endpoint.timing.AGREE."""
    rates = [r["tok_s"] for r in ok if r["tok_s"] is not None]
    single = sum(1 for r in ok if r["tok_s"] is None and r["output_tokens"] > 1)
    client = mean(rates)
    theirs = server.stream_tok_s if server else None
    doubt = None
    if single:
        doubt = f"{single} of {len(ok)} streams came in one chunk"
    elif client is not None and theirs is not None and (client > timing.AGREE * theirs or theirs > timing.AGREE * client):
        doubt = f"chunk-timed {client:.1f} tok/s against the server's {theirs:.1f}"
    if doubt:
        return {"mean": _r(theirs, 3), "spread": None, "source": "server" if theirs is not None else None}, doubt
    return {"mean": _r(client, 3), "spread": _r(spread(rates)), "source": "chunks"}, None


def window_record(index: int, t_start: float, t_end: float, requests: list[dict], deltas: list[SpecDelta],
                  kv_usage: list[float], polls: int, healthy_polls: int, flaps: int, restarts: int,
                  timings: list[ServerTiming] = (), temperature: float = 1.0) -> dict:
    """One window: its requests' latency percentiles and tokens, spec decode from /metrics, KV usage, health, the
    server's own timing, and the sampled tokens honest sampling would not give (a fault, never a result)."""
    ok = [r for r in requests if r["error"] is None]
    tokens = sum(r["output_tokens"] for r in ok)
    seconds = t_end - t_start
    server = add_timings(list(timings))
    stream_tok_s, doubt = _stream_rate(ok, server)
    sampled = sum(r.get("sampled_tokens", 0) for r in ok)
    cut = implausible_logprob(sampled, temperature)
    implausible = sum(1 for r in ok for v in r.get("low_logprobs", ()) if v < cut)
    spec = add_deltas(deltas)
    lengths = [d.acceptance_length for d in deltas if d.acceptance_length is not None]
    return {
        "type": "window", "index": index, "t_start": _r(t_start, 3), "t_end": _r(t_end, 3),
        "requests": len(requests), "ok": len(ok),
        "errors": dict(sorted(Counter(r["error"] for r in requests if r["error"]).items())),
        "ttft_s": quantiles([r["ttft_s"] for r in ok]),
        "tpot_s": quantiles([] if doubt else [r["tpot_s"] for r in ok]),
        "e2e_s": quantiles([r["e2e_s"] for r in ok]),
        "output_tokens": tokens, "tok_s": _r(tokens / seconds, 3) if seconds > 0 else None,
        "stream_tok_s": stream_tok_s,
        "server_timing": server.to_json() if server else None,
        "timing_note": f"{doubt}: per-stream tok/s is the server's, TPOT withheld" if doubt else None,
        "sampled_tokens": sampled, "implausible_tokens": implausible,
        "faults": ["implausible_samples"] if implausible else [],
        "acceptance_length": _r(spec.acceptance_length) if spec else None,
        "acceptance_spread": _r(spread(lengths)),
        "per_position": [_r(v) for v in spec.per_position] if spec else None,
        "spec": {"drafts": spec.drafts, "accepted": spec.accepted} if spec else None,
        "kv_usage": {"last": _r(kv_usage[-1]), "max": _r(max(kv_usage))} if kv_usage else None,
        "health": {"polls": polls, "healthy": healthy_polls, "flaps": flaps},
        "restarts": restarts,
    }


def _side(windows: list[dict], label: str) -> dict:
    """A stretch of windows as one: acceptance length and tok/s over all of it, with the mean of its windows'
    within-window spreads (of per-interval acceptance lengths, and of per-stream decode rates)."""
    drafts = sum(w["spec"]["drafts"] for w in windows if w["spec"])
    accepted = sum(w["spec"]["accepted"] for w in windows if w["spec"])
    seconds = sum(w["t_end"] - w["t_start"] for w in windows)
    return {
        "label": label, "windows": [w["index"] for w in windows],
        "acceptance_length": _r(1 + accepted / drafts) if drafts else None,
        "acceptance_spread": _r(mean([w["acceptance_spread"] for w in windows])),
        "tok_s": _r(sum(w["output_tokens"] for w in windows) / seconds, 3) if seconds > 0 else None,
        "stream_tok_s_spread": _r(mean([w["stream_tok_s"]["spread"] for w in windows])),
        "implausible_tokens": sum(w.get("implausible_tokens", 0) for w in windows),
    }


def trend(windows: list[dict]) -> dict | None:
    """First versus last hour when the soak ran two hours or more; else first versus last window."""
    if not windows:
        return None
    end = windows[-1]["t_end"]
    if end >= 2 * HOUR_S:
        first = [w for w in windows if w["t_start"] < HOUR_S]
        last = [w for w in windows if w["t_end"] > end - HOUR_S]
        return {"by": "hour", "first": _side(first, "first hour"), "last": _side(last, "last hour")}
    return {"by": "window", "first": _side(windows[:1], "first window"), "last": _side(windows[-1:], "last window")}


def summarize(*, plan_doc: dict, model: str, ended: str, end_detail: str, elapsed_s: float, windows: list[dict],
              requests: int, errors: Counter, tokens: int, issued: int, abandoned: int, flaps: int,
              down_s: float, restarts: list[dict], drained: list[dict] = (), drain_s: float = 0.0) -> dict:
    """The whole soak. `drained`: requests that finished after the last window closed (in flight at the end);
    they count in the totals but in no window."""
    drained_ok = [r for r in drained if r["error"] is None]
    return {
        "url": plan_doc["url"], "model": model, "ended": ended, "end_detail": end_detail,
        "elapsed_s": _r(elapsed_s, 3), "log": plan_doc["log"], "max_requests": plan_doc["max_requests"],
        "requests": {"issued": issued, "finished": requests, "ok": requests - sum(errors.values()),
                     "abandoned_in_flight": abandoned},
        "errors": dict(sorted(errors.items())),
        "tokens_served": tokens,
        "drained": {"requests": len(drained), "ok": len(drained_ok),
                    "output_tokens": sum(r["output_tokens"] for r in drained_ok), "seconds": _r(drain_s, 3)},
        "health": {"flaps": flaps, "down_s": _r(down_s, 3)},
        "restarts": {"count": len(restarts), "signals": restarts},
        "trend": trend(windows),
        "windows": [{k: w[k] for k in ("index", "t_start", "t_end", "requests", "errors", "ttft_s", "tpot_s",
                                       "e2e_s", "tok_s", "acceptance_length", "implausible_tokens")}
                    for w in windows],
    }


def _f(value, fmt: str = ".3f", unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{fmt}}{unit}"


def _ms(q: dict) -> str:
    return "/".join(ms(q[f"p{p}"]) for p in QUANTILES)


def window_line(w: dict) -> str:
    """One closed window, as progress."""
    kv = w["kv_usage"]
    fault = (f", FAULT {w['implausible_tokens']} of {w['sampled_tokens']} sampled tokens implausible (corrupt samples)"
             if w.get("implausible_tokens") else "")
    return (f"window {w['index']} (to {human_duration(w['t_end'])}): {w['requests']} requests, "
            f"{sum(w['errors'].values())} errors, {_f(w['tok_s'], '.1f')} tok/s, acceptance length "
            f"{_f(w['acceptance_length'])}, KV {'n/a' if kv is None else format(kv['last'] * 100, '.1f') + '%'}, "
            f"/health {w['health']['healthy']}/{w['health']['polls']}"
            + (f", {w['restarts']} restarts" if w["restarts"] else "") + fault)


def error_counts(errors: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in errors.items()) or "none"


def summary_lines(s: dict) -> list[str]:
    req = s["requests"]
    errors = error_counts(s["errors"])
    lines = [
        f"soak of {s['url']} ({printable(s['model'])}): {ENDINGS[s['ended']]} after {human_duration(s['elapsed_s'])}"
        + (f" ({printable(s['end_detail'])})" if s["end_detail"] else ""),
        f"requests: {req['finished']:,} finished of {req['issued']:,} sent (cap {s['max_requests']:,}), "
        f"{req['ok']:,} ok" + (f", {req['abandoned_in_flight']} in flight abandoned" if req["abandoned_in_flight"] else ""),
        f"errors by kind: {errors}",
        f"tokens served: {s['tokens_served']:,}",
        *([(f"drained after the end: {s['drained']['requests']} requests in flight finished in "
            f"{s['drained']['seconds']:.1f} s ({s['drained']['ok']} ok; in the totals, in no window)")]
          if s["drained"]["requests"] else []),
        f"health: {s['health']['flaps']} flaps ({s['health']['down_s']:.1f} s unhealthy); "
        f"restarts: {s['restarts']['count']}"
        + "".join(f"; at {r['t']:.1f} s: {r['signal']}" for r in s["restarts"]["signals"]),
    ]
    t = s["trend"]
    if t:
        for side in (t["first"], t["last"]):
            lines.append(f"{side['label']:>12}: acceptance length {_f(side['acceptance_length'])} "
                         f"(spread {_f(side['acceptance_spread'])}), {_f(side['tok_s'], '.1f')} tok/s "
                         f"(per-stream spread {_f(side['stream_tok_s_spread'])})")
    lines.append("window     t_end  reqs  err  TTFT p50/p90/p99 ms  TPOT p50/p90/p99 ms   tok/s  acc.len")
    for w in s["windows"]:
        lines.append(f"{w['index']:>6} {w['t_end']:>8.1f}s {w['requests']:>5} {sum(w['errors'].values()):>4}  "
                     f"{_ms(w['ttft_s']):>19}  {_ms(w['tpot_s']):>19}  {_f(w['tok_s'], '7.1f')}  "
                     f"{_f(w['acceptance_length'])}")
    lines.append(f"log: {s['log']}")
    return lines
