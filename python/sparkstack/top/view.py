"""The `top` screen: one rich table of the sample, with a sparkline of the last minute per row."""

from __future__ import annotations

import functools
import time

from rich.table import Table
from rich.text import Text

from sparkstack.top.sample import History

BLOCKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 30


def sparkline(values: list[float | None], lo: float | None = None, hi: float | None = None,
              width: int = SPARK_WIDTH) -> str:
    """The last `width` values as block characters; a missing value is a blank."""
    values = values[-width:]
    known = [v for v in values if v is not None]
    if not known:
        return ""
    lo = min(known) if lo is None else lo
    hi = max(known) if hi is None else hi
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        elif hi <= lo:
            out.append(BLOCKS[0] if v <= 0 else BLOCKS[3])
        else:
            frac = min(1.0, max(0.0, (v - lo) / (hi - lo)))
            out.append(BLOCKS[round(frac * (len(BLOCKS) - 1))])
    return "".join(out)


def _n(value, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def screen(url: str, interval_s: float, history: History, state: str, kv_pool_tokens: int | None,
           pool_note: str, live: bool = False) -> Table:
    s = history.sample(fresh=state == "ok")
    series = history.series()
    table = Table(title=f"sparkstack top  {url}  every {interval_s:g} s  {time.strftime('%H:%M:%S')}",
                  title_justify="left", caption=_caption(state, history, s, live), caption_justify="left")
    table.add_column("metric")
    table.add_column("now", justify="right")
    table.add_column("detail")
    table.add_column("last minute")
    get = functools.partial(getattr, s)

    table.add_row("requests running", _n(get("running"), ".0f"), "", sparkline(series["running"], lo=0))
    table.add_row("requests waiting", _n(get("waiting"), ".0f"), "", sparkline(series["waiting"], lo=0))
    table.add_row("generation tok/s", _n(get("generation_tok_s"), ".1f"),
                  f"over {_n(get('interval_s'), '.1f')} s", sparkline(series["generation_tok_s"], lo=0))
    itl = get("itl_mean_s")
    table.add_row("per-stream tok/s", _n(get("stream_tok_s"), ".1f"),
                  "server's decode clock" + ("" if itl is None else f", ITL {itl * 1000:.2f} ms"), "")
    positions = get("per_position") or ()
    width = max(len(positions), sum(1 for k in series if k.startswith("position_")))
    table.add_row("acceptance length", _n(get("acceptance_length"), ".3f"),
                  f"{_n(get('drafts_delta'), ',.0f')} drafts in {_n(get('minute_s'), '.1f')} s",
                  sparkline(series["acceptance_length"], lo=1, hi=1 + width if width else None))  # 1..the ceiling
    if not width:
        table.add_row("  per position", "n/a", "", "")
    for i in range(width):
        rate = positions[i] if i < len(positions) else None
        table.add_row(f"  position {i + 1}", _n(rate, ".2f"), "accepted / drafts",
                      sparkline(series.get(f"position_{i}", []), lo=0, hi=1))
    usage = get("kv_usage")
    if kv_pool_tokens is None:
        pool = pool_note
    elif usage is None:
        pool = f"pool {kv_pool_tokens:,} tokens"
    else:
        pool = f"~{round(usage * kv_pool_tokens):,} of {kv_pool_tokens:,} tokens"
    table.add_row("KV cache usage", "n/a" if usage is None else f"{usage * 100:.1f}%", pool,
                  sparkline(series["kv_usage"], lo=0, hi=1))
    hit = get("prefix_hit_rate")
    table.add_row("prefix-cache hit rate", "n/a" if hit is None else f"{hit * 100:.1f}%",
                  f"{_n(get('prefix_queries_delta'), ',.0f')} tokens queried",
                  sparkline(series["prefix_hit_rate"], lo=0, hi=1))
    table.add_row("preemptions", _n(get("preemptions"), ",.0f"),
                  f"+{_n(get('preemptions_delta'), '.0f')} in {_n(get('minute_s'), '.1f')} s",
                  sparkline(series["preemptions"], lo=0))
    return table


def _caption(state: str, history: History, s, live: bool) -> Text:
    parts = []
    if state != "ok":
        parts.append(state)
    if s.interval_s is None:
        parts.append("rates need a second scrape")
    if history.restarts_seen:
        parts.append(f"engine restarts seen: {history.restarts_seen} (counters went back)")
    if live:
        parts.append("Ctrl-C quits")
    return Text("; ".join(parts), style="yellow" if state != "ok" else "dim")


def live(url: str, interval_s: float, reads, kv_pool_tokens: int | None, pool_note: str) -> None:
    """The screen, redrawn after each of `reads` ((history, state) pairs), until they end or Ctrl-C."""
    from rich.live import Live

    with Live(auto_refresh=False, screen=False) as shown:
        for history, state in reads:
            shown.update(screen(url, interval_s, history, state, kv_pool_tokens, pool_note, live=True), refresh=True)
