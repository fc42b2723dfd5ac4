"""A bench's figures: one cell per block, computed from its batches, with its faults; the JSON contract other
tools read; the table.

A flagged cell's result figures are withheld (null in JSON, a dash in the table): a fault is never reported as a
result. Its counters (drafts, draft and accepted tokens, errors) and its rounds stay, as the evidence.

A stream without a usage chunk gives no token count (chunks are not tokens: a chunk may carry several), so a cell
with such a stream withholds its token rates (tok/s, per stream, TPOT, each round's tok/s) and says why in a
`no_usage` note. That is not a fault flag (the contract has four): its other figures stand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sparkstack.bench.batch import Batch
from sparkstack.bench.plan import Block, Settings
from sparkstack.endpoint import metrics, stats, timing
from sparkstack.endpoint.client import StreamResult
from sparkstack.text import printable

SPEC_DECODE_COLLAPSE = "spec_decode_collapse"
NO_SPEC_METRICS = "no_spec_metrics"
SERVER_BUSY = "server_busy"
NOISY = "noisy"
IMPLAUSIBLE_SAMPLES = "implausible_samples"  # sampled tokens honest sampling does not draw (endpoint.stats)
FLAG_ORDER = (SPEC_DECODE_COLLAPSE, NO_SPEC_METRICS, SERVER_BUSY, NOISY, IMPLAUSIBLE_SAMPLES)
NOISY_SPREAD = 0.10  # rounds further apart than this, as a fraction of their mean, are noise, not a figure

# The result figures of a cell, in contract order; withheld when the cell is flagged.
RESULTS = ("output_tok_s", "per_stream_tok_s", "ttft_first_chunk_p50_s", "ttft_content_p50_s", "ttft_content_p95_s",
           "itl_p50_s", "itl_p95_s", "itl_p99_s", "tpot_p50_s")
SPEC_RESULTS = ("acceptance_length", "per_position", "steps_per_s")
COUNTERS = ("drafts", "draft_tokens", "accepted_tokens")
ROUND_FIGURES = ("output_tok_s", "acceptance_length", "steps_per_s")
TOKEN_RATES = ("output_tok_s", "per_stream_tok_s", "tpot_p50_s")  # need the server's token counts
NO_USAGE = "no_usage"


@dataclass(frozen=True)
class Round:
    output_tok_s: float | None
    acceptance_length: float | None
    steps_per_s: float | None

    def to_json(self, no_usage: bool = False) -> dict:
        return {name: None if no_usage and name in TOKEN_RATES else getattr(self, name) for name in ROUND_FIGURES}


@dataclass(frozen=True)
class Cell:
    """One block's figures as measured (flags withhold them only on output)."""
    concurrency: int
    category: str
    figures: dict[str, float | None]  # RESULTS
    errors: int
    spec: metrics.SpecDelta | None
    steps_per_s: float | None
    rounds: tuple[Round, ...]
    flags: tuple[str, ...]
    requests: int = 0  # sent, failed ones included
    first_error: str | None = None
    rerun: bool = False
    no_usage: int = 0  # streams that sent no usage chunk: the token rates are withheld
    server: metrics.ServerTiming | None = None  # the server's own timing of the cell's requests
    timing_notes: tuple[str, ...] = ()  # where chunk timing was not a measurement, and what stands instead
    sampled_tokens: int = 0  # tokens whose logprob came back
    implausible_tokens: int = 0  # of them, below endpoint.stats.implausible_logprob

    @property
    def name(self) -> str:
        return f"c={self.concurrency} {self.category}"

    def to_json(self) -> dict:
        flagged = bool(self.flags)
        spec = self.spec
        doc: dict = {"concurrency": self.concurrency, "category": self.category}
        withheld = set(RESULTS) if flagged else set(TOKEN_RATES) if self.no_usage else set()
        doc |= {k: None if k in withheld else self.figures[k] for k in RESULTS}
        doc["errors"] = self.errors
        doc |= dict(zip(COUNTERS, (_count(spec.drafts), _count(spec.draft_tokens), _count(spec.accepted))
                        if spec else (None, None, None)))
        doc["acceptance_length"] = None if flagged or spec is None else spec.acceptance_length
        doc["per_position"] = None if flagged or spec is None else list(spec.per_position)
        doc["steps_per_s"] = None if flagged else self.steps_per_s
        doc["rounds"] = [r.to_json(bool(self.no_usage)) for r in self.rounds]
        doc["server_timing"] = self.server.to_json() if self.server else None
        doc["timing_notes"] = list(self.timing_notes)
        doc["sampled_tokens"] = self.sampled_tokens
        doc["implausible_tokens"] = self.implausible_tokens
        doc["flags"] = list(self.flags)
        return doc

    def notes(self) -> list[str]:
        """Why each flag is there, with its evidence; and a rerun that cleared the noise."""
        out = []
        if self.rerun and NOISY not in self.flags:
            out.append(f"{self.name}: rerun: its first rounds spread over {NOISY_SPREAD:.0%}; the rerun's figures "
                       "are reported")
        if self.no_usage:
            out.append(f"{self.name}: {NO_USAGE}: {self.no_usage} of {self.requests - self.errors} streams sent no "
                       "usage chunk (stream_options.include_usage): tok/s and TPOT withheld, chunks are not tokens")
        for flag in self.flags:
            if flag == SPEC_DECODE_COLLAPSE and self.spec:
                out.append(f"{self.name}: {flag}: acceptance length {self.spec.acceptance_length:.3f} over "
                           f"{self.spec.drafts:g} drafts: drafts are (almost) all rejected (vLLM #53030)")
            elif flag == NO_SPEC_METRICS:
                out.append(f"{self.name}: {flag}: the server exposes no spec-decode counters on /metrics")
            elif flag == SERVER_BUSY:
                out.append(f"{self.name}: {flag}: requests were running when the bench started")
            elif flag == IMPLAUSIBLE_SAMPLES:
                out.append(f"{self.name}: {flag}: {self.implausible_tokens} of {self.sampled_tokens} sampled tokens "
                           "have a logprob honest sampling does not give: the server corrupts samples")
            elif flag == NOISY:
                tok = [r.output_tok_s for r in self.rounds]
                out.append(f"{self.name}: {flag}: rounds spread {stats.spread(tok):.0%} in tok/s ("
                           + ", ".join(f"{t:.1f}" for t in tok) + ") after one rerun")
        out.extend(f"{self.name}: timing: {n}" for n in self.timing_notes)
        return out


def _finite(v):
    """`v` with every NaN or infinity (a server's counter, or a rate over a huge one) as null: JSON has neither."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def _count(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _counted(r: StreamResult) -> bool:
    """Whether the server counted the stream's tokens (a usage chunk with a whole completion_tokens)."""
    tokens = (r.usage or {}).get("completion_tokens")
    return isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0


def _tpot(r: StreamResult) -> float | None:
    """TPOT needs a decode time: two text chunks at least (one chunk's 0 s would read as infinitely fast)."""
    return r.tpot_s if len(r.token_times_s) >= 2 else None


def _decode_s(results: list[StreamResult], server: metrics.ServerTiming | None) -> tuple[float, str | None]:
    """The streams' summed decode time, and why it is the server's (or None: withheld) rather than the chunks'."""
    doubt = timing.decode_doubt(results, server)
    if doubt is None:
        return sum(r.decode_s or 0.0 for r in results), None
    return (server.decode_s if server else 0.0), doubt


def _server(before, after) -> metrics.ServerTiming | None:
    return metrics.server_timing(before, after) if before is not None and after is not None else None


def _round(batch: Batch) -> Round:
    results = batch.results
    decode, _ = _decode_s(list(results), _server(batch.before, batch.after))
    spec = batch.spec
    tokens = sum(r.output_tokens for r in results)
    return Round(tokens / batch.wall_s if batch.wall_s > 0 else None,
                 spec.acceptance_length if spec else None,
                 spec.drafts / decode if spec and decode > 0 else None)


def noisy(batches: list[Batch]) -> bool:
    spread = stats.spread([_round(b).output_tok_s for b in batches])
    return spread is not None and spread > NOISY_SPREAD


def make_cell(block: Block, batches: list[Batch], flags: list[str], rerun: bool = False,
              temperature: float = 1.0) -> Cell:
    """The cell of one block from its rounds' batches (chained scrapes: the first's before, the last's after).

    Per-stream figures stand on chunk timing only where it measures (endpoint.timing): otherwise tok/s and steps/s
    per stream are the server's (its decode-time histogram), and TPOT or ITL percentiles are withheld, with a note."""
    results = [r for b in batches for r in b.results]
    failures = [o for b in batches for o in b.failures]
    first, last = batches[0], batches[-1]
    spec = metrics.spec_delta(first.before, last.after) if first.before and last.after else None
    server = _server(first.before, last.after)
    decode, decode_doubt = _decode_s(results, server)
    # chunks that do not time the decode do not time its steps either, even where their mean gap happens to land
    # near the server's (a burst under load read 1.5 ms against 2.2 ms with --stream-interval 8)
    itl_doubt = timing.itl_doubt(results, server) or (decode_doubt and "the chunks do not time the decode")
    notes = []
    if decode_doubt:
        notes.append(f"{decode_doubt}: per-stream tok/s and steps/s are the server's (its decode-time histogram)"
                     if server else f"{decode_doubt}: per-stream tok/s, steps/s and TPOT withheld")
        if server and server.tpot_mean_s is not None:
            notes.append(f"TPOT p50 withheld; the server's mean TPOT is {server.tpot_mean_s * 1000:.2f} ms")
    if itl_doubt:
        notes.append(f"{itl_doubt}: ITL percentiles withheld" + (
            f"; the server's mean ITL is {server.itl_mean_s * 1000:.2f} ms" if server and server.itl_mean_s else ""))
    decoded = sum(r.output_tokens - 1 for r in results if r.output_tokens > 1 and (decode_doubt or r.decode_s))
    wall = sum(b.wall_s for b in batches)
    ttft_content = [r.first_token_s for r in results]
    itls = [x for r in results for x in r.itls_s]
    figures = {
        "output_tok_s": sum(r.output_tokens for r in results) / wall if wall > 0 else None,
        "per_stream_tok_s": decoded / decode if decode > 0 else None,
        "ttft_first_chunk_p50_s": stats.percentile([r.first_chunk_s for r in results], 50),
        "ttft_content_p50_s": stats.percentile(ttft_content, 50),
        "ttft_content_p95_s": stats.percentile(ttft_content, 95),
        "itl_p50_s": None if itl_doubt else stats.percentile(itls, 50),
        "itl_p95_s": None if itl_doubt else stats.percentile(itls, 95),
        "itl_p99_s": None if itl_doubt else stats.percentile(itls, 99),
        "tpot_p50_s": None if decode_doubt else stats.percentile([_tpot(r) for r in results], 50),
    }
    logprobs = [v for r in results for v in r.logprobs]
    implausible = stats.implausible_tokens(logprobs, temperature)
    found = set(flags) | ({IMPLAUSIBLE_SAMPLES} if implausible else set())
    if spec is None:
        found.add(NO_SPEC_METRICS)
    elif spec.collapsed:
        found.add(SPEC_DECODE_COLLAPSE)
    return Cell(block.concurrency, block.category, figures, len(failures), spec,
                spec.drafts / decode if spec and decode > 0 else None, tuple(_round(b) for b in batches),
                tuple(f for f in FLAG_ORDER if f in found), len(results) + len(failures),
                failures[0].error if failures else None, rerun, sum(not _counted(r) for r in results), server,
                tuple(notes), len(logprobs), implausible)


@dataclass(frozen=True)
class Report:
    suite_version: str
    settings: Settings
    cells: tuple[Cell, ...]
    warnings: tuple[str, ...] = ()
    stopped: str | None = None  # why the bench stopped before its last block; the finished cells stand
    salt: str | None = None  # the run's part of every prompt's salt: the exact prompts can be sent again

    def to_json(self) -> dict:
        return {"suite_version": self.suite_version, "settings": self.settings.to_json(), "salt": self.salt,
                "cells": [_finite(c.to_json()) for c in self.cells]}

    @property
    def errors(self) -> int:
        return sum(c.errors for c in self.cells)

    def verdict(self) -> str:
        """'' when every cell is a result; otherwise one line saying why the run failed."""
        parts = [f"stopped after {len(self.cells)} cells: {self.stopped}"] if self.stopped else []
        flagged = [c for c in self.cells if c.flags]
        if flagged:
            names = sorted({f for c in flagged for f in c.flags}, key=FLAG_ORDER.index)
            parts.append(f"{len(flagged)} of {len(self.cells)} cells flagged ({', '.join(names)}): not results")
        if self.errors:
            first = next(c for c in self.cells if c.errors)
            parts.append(f"{self.errors} of {sum(c.requests for c in self.cells)} requests failed "
                         f"(first, in {first.name}: {first.first_error})")
        return "; ".join(parts)


def settings_line(s: dict) -> str:
    """Every value a run used, on one line (from Settings.to_json or a document read back)."""
    model = s["model"] or "(the server's first model)"
    return (f"url {s['url']} · model {model} · concurrency "
            f"{','.join(map(str, s['concurrency']))} · rounds {s['rounds']} · max_tokens {s['max_tokens']} · "
            f"temperature {s['temperature']} · top_p {s['top_p']} · categories {','.join(s['categories'])}")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def _num(v: float | None, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def table(doc: dict):
    """A rich table of a bench JSON document (ours or one read back), settings in its caption."""
    from rich.markup import escape
    from rich.table import Table

    # the model name is the server's, a document read back anyone's: text, not markup or terminal controls
    t = Table(title=escape(printable(f"sparkstack bench · suite v{doc['suite_version']}")),
              caption=escape(printable(settings_line(doc["settings"]))))
    for head in ("conc", "category", "tok/s", "tok/s /stream", "TTFT chunk p50 ms", "TTFT content p50/p95 ms",
                 "ITL p50/p95/p99 ms", "TPOT p50 ms", "accept len", "per position", "steps/s /stream", "errors",
                 "flags"):
        t.add_column(head, justify="left" if head in ("category", "per position", "flags") else "right")
    for c in doc["cells"]:
        pos = c["per_position"]
        t.add_row(str(c["concurrency"]), escape(printable(c["category"])), _num(c["output_tok_s"]), _num(c["per_stream_tok_s"]),
                  _ms(c["ttft_first_chunk_p50_s"]), f"{_ms(c['ttft_content_p50_s'])}/{_ms(c['ttft_content_p95_s'])}",
                  "/".join(_ms(c[k]) for k in ("itl_p50_s", "itl_p95_s", "itl_p99_s")), _ms(c["tpot_p50_s"]),
                  _num(c["acceptance_length"], ".2f"), "-" if pos is None else "/".join(f"{p:.2f}" for p in pos),
                  _num(c["steps_per_s"]), str(c["errors"]),
                  "[red]" + escape(printable(" ".join(c["flags"]))) + "[/red]" if c["flags"] else "")
    return t


def plan_lines(plan) -> list[str]:
    """The human form of a bench plan (`bench --dry-run`): its blocks and settings; nothing is sent."""
    lines = [f"would bench {plan.settings.url}: {len(plan.blocks)} blocks, {plan.requests} requests "
             "(a noisy block runs once more); sends nothing (--dry-run)",
             f"suite v{plan.suite.version}; {settings_line(plan.settings.to_json())}"]
    lines += [f"  {b.name}: {b.rounds} rounds x {b.concurrency} streams = {b.requests} requests" for b in plan.blocks]
    return lines
