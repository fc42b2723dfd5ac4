"""`sparkstack bench` and `sparkstack compare`: the command objects."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sparkstack.command import Command, View, argument, option
from sparkstack.errors import SparkstackError
from sparkstack.verify.command import api_key, api_key_env_option


@dataclass(frozen=True, kw_only=True)
class Request:
    url: str = argument()
    concurrency: tuple[int, ...] | None = option(None, "--concurrency", kind="ints",
                                                 help="Concurrent streams per block  [default: 1,2,3,4,5,6]")
    rounds: int | None = option(None, "--rounds", kind=("int", 1, 100), help="Rounds per block  [default: 3]")
    max_tokens: int | None = option(None, "--max-tokens", kind=("int", 1, 1 << 20),
                                    help="max_tokens per request  [default: 512]")
    temperature: float | None = option(None, "--temperature", kind=("float", 0, 2),
                                       help="Sampling temperature  [default: 1.0]")
    top_p: float | None = option(None, "--top-p", kind=("float", 0, 1), help="Sampling top_p  [default: 0.95]")
    category: tuple[str, ...] = option((), "--category", kind="names", metavar="NAME",
                                       help="A suite category to run (repeatable; default: all of code, json, prose, "
                                            "tool-args, count).")
    model: str | None = option(None, "--model", help="Model to ask for (default: the first the server lists).")
    api_key_env: str = api_key_env_option()
    timeout: float = option(60.0, "--timeout", kind=("float", 0.1, 3600), show_default=True,
                            help="Seconds to wait for any answer or stream data.")
    out: Path | None = option(None, "--out", kind="path", metavar="JSON",
                              help="Also write the report (the --json document) to this file, before the verdict.")
    plot: Path | None = option(None, "--plot", kind="path", metavar="PNG",
                               help="Also draw tok/s and acceptance length against concurrency, and per-position "
                                    "acceptance.")
    force: bool = option(False, "--force", kind="flag",
                         help="Bench a server that is already running requests (cells flagged server_busy).")
    dry_run: bool = option(False, "--dry-run", kind="flag", help="Print the plan (blocks, requests, settings); send "
                                                                 "nothing.")
    as_json: bool = option(False, "--json", kind="flag", help="Print the report as JSON (the contract compare reads).")


@dataclass(frozen=True)
class Plan:
    request: Request
    bench: object  # bench.plan.BenchPlan
    api_key: str | None = field(default=None, repr=False, compare=False)


def plan(request: Request, environ: Mapping[str, str]) -> Plan:
    from sparkstack.bench.plan import plan_bench
    from sparkstack.bench.plot import check_destination
    from sparkstack.endpoint.client import check_key_env

    r = request
    given = {"concurrency": r.concurrency, "rounds": r.rounds, "max_tokens": r.max_tokens,
             "temperature": r.temperature, "top_p": r.top_p}
    bp = plan_bench(r.url, categories=r.category, model=r.model, **{k: v for k, v in given.items() if v is not None})
    check_key_env(r.api_key_env)
    if r.plot is not None:
        check_destination(r.plot)
    return Plan(r, bp, api_key(r.api_key_env, environ))


@dataclass(frozen=True)
class Result:
    report: object  # bench.report.Report
    doc: Mapping[str, object]
    plot_error: str | None = None


def apply(p: Plan, view: View) -> Result:
    from sparkstack import fsio
    from sparkstack.bench.plot import write_plot
    from sparkstack.bench.run import run_bench
    from sparkstack.endpoint.client import Endpoint

    view.hide(p.api_key)
    r, bp = p.request, p.bench
    endpoint = Endpoint(bp.settings.url, p.api_key, r.timeout, connections=max(bp.settings.concurrency))
    with view.requests_progress(bp.requests) as on_progress:
        report = run_bench(bp, endpoint, force=r.force, on_progress=on_progress)
    for w in report.warnings:
        view.warn(w)
    doc = report.to_json()
    if r.out is not None:  # before the verdict: a fault keeps its figures
        r.out.parent.mkdir(parents=True, exist_ok=True)
        fsio.write_atomic(r.out, (json.dumps(doc, indent=2) + "\n").encode())
    plot_error = None
    if r.plot is not None:  # its failure is said after the figures: a failed plot must not lose the run
        try:
            write_plot(doc, r.plot)
        except (SparkstackError, OSError) as exc:
            plot_error = str(exc) if isinstance(exc, SparkstackError) else f"{r.plot}: {exc.strerror or exc}"
    return Result(report, doc, plot_error)


def _notes(result: Result) -> list[str]:
    return [n for c in result.report.cells for n in c.notes()]


def _result_lines(p: Plan, result: Result) -> list:
    from sparkstack.bench.report import table

    return [table(result.doc), *_notes(result)]


def _failure(p: Plan, result: Result | None) -> str | None:
    if result is None:
        return None
    verdict = result.report.verdict()
    if verdict and p.request.out is not None:
        verdict = f"{verdict} (report: {p.request.out})"
    return verdict or result.plot_error


def _plan_lines(p: Plan) -> list[str]:
    from sparkstack.bench.report import plan_lines

    return plan_lines(p.bench)


def _json_notes(p: Plan, result: Result) -> list[str]:
    """Under --json the notes go to stderr, as warnings."""
    return _notes(result) if p.request.as_json else []


COMMAND = Command(("bench",), Request, plan, apply, plan_lines=_plan_lines, plan_json=lambda p: p.bench.to_json(),
                  result_lines=_result_lines, result_json=lambda p, r: r.doc, failure=_failure,
                  after_json=_json_notes,
                  outputs=lambda p, r: {"settings": p.bench.to_json()["settings"],
                                        "report": None if p.request.out is None else str(p.request.out)})


# ---------------------------------------------------------------- compare

@dataclass(frozen=True, kw_only=True)
class CompareRequest:
    report_a: Path = argument(kind="path")
    report_b: Path = argument(kind="path")
    dry_run: bool = option(False, "--dry-run", kind="flag", help="Accepted for uniformity: compare only reads.")
    as_json: bool = option(False, "--json", kind="flag")


def _plan_compare(request: CompareRequest, environ: Mapping[str, str]):
    from sparkstack.bench.compare import compare

    return compare(request.report_a, request.report_b)


def _compare_lines(cmp) -> list:
    from sparkstack.bench.compare import table
    from sparkstack.bench.report import settings_line

    return [table(cmp), f"A: {settings_line(cmp.a[1])}", f"B: {settings_line(cmp.b[1])}"]


COMPARE = Command(("compare",), CompareRequest, _plan_compare, lambda cmp, view: cmp,
                  plan_lines=_compare_lines, plan_json=lambda cmp: cmp.to_json(),
                  warnings=lambda cmp: (f"settings differ: {'; '.join(cmp.settings_differ)}",)
                  if cmp.settings_differ else (), dry=lambda r: True)
