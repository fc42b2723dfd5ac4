"""`sparkstack bench` and `sparkstack compare`: the command objects."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sparkstack.command import Command, View, argument, embed, option, request
from sparkstack.errors import SparkstackError
from sparkstack.options import SamplingOptions
from sparkstack.options import recipe_option
from sparkstack.verify.command import api_key, api_key_env_option


def reference_option():
    return option(None, "--reference", kind="path?", metavar="[FILE]",
                  help="Set the figures beside the published ones: FILE, or (no value) the reference.toml beside "
                       "--recipe's recipe. Exit 1 when the count category misses its ceiling.")


def reference_recipe_option():
    return recipe_option(help="With --reference: the recipe whose reference.toml is the default, and whose knobs say "
                               "what was served (NUM_SPEC_TOKENS, EAGER).")


@dataclass(frozen=True, kw_only=True)
class BenchOptions:
    """The shape of the load bench sends: `up` and `sweep` embed it as --bench-*, with these defaults and help."""

    concurrency: tuple[int, ...] | None = option(None, "--concurrency", kind="ints",
                                                 help="Concurrent streams per block  [default: 1,2,3,4,5,6]")
    rounds: int | None = option(None, "--rounds", kind=("int", 1, 100), help="Rounds per block  [default: 3]")
    max_tokens: int | None = option(None, "--max-tokens", kind=("int", 1, 1 << 20),
                                    help="max_tokens per request  [default: 512]")
    category: tuple[str, ...] = option((), "--category", kind="names", metavar="NAME",
                                       help="A suite category to run (repeatable; default: all of code, json, prose, "
                                            "tool-args, count).")


@dataclass(frozen=True)
class Against:
    """A reference and what our run served, from --reference and --recipe."""

    reference: object  # bench.reference.Reference
    served: object  # bench.reference.Served

    def beside(self, doc: Mapping[str, object]):
        from sparkstack.bench.reference import compare_reference

        return compare_reference(dict(doc), self.reference, self.served)


def against(reference: str | None, recipe: str | None, environ: Mapping[str, str]) -> Against | None:
    """The reference file (given, or beside the recipe) and the served conditions (the recipe's knobs, when one is
    named; else read from the report's per-position rates)."""
    from sparkstack.bench.reference import Served, find_reference, load_reference, served_from_knobs

    if reference is None:
        return None
    ref = load_reference(Path(reference)) if reference else find_reference(recipe)
    if recipe is None:
        return Against(ref, Served())
    from sparkstack.deploy import load_deployment

    return Against(ref, served_from_knobs(load_deployment(recipe, environ).knobs))


@request
class Request:
    url: str = argument()
    _load: object = embed(BenchOptions, only=("concurrency", "rounds", "max_tokens"))
    _sampling: object = embed(SamplingOptions)
    _categories: object = embed(BenchOptions, only=("category",))
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
    reference: str | None = reference_option()
    recipe: str | None = reference_recipe_option()
    dry_run: bool = option(False, "--dry-run", kind="flag", help="Print the plan (blocks, requests, settings); send "
                                                                 "nothing.")
    as_json: bool = option(False, "--json", kind="flag", help="Print the report as JSON (the contract compare reads).")


@dataclass(frozen=True)
class Plan:
    request: Request
    bench: object  # bench.plan.BenchPlan
    api_key: str | None = field(default=None, repr=False, compare=False)
    against: Against | None = None  # --reference


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
    return Plan(r, bp, api_key(r.api_key_env, environ), against(r.reference, r.recipe, environ))


@dataclass(frozen=True)
class Result:
    report: object  # bench.report.Report
    doc: Mapping[str, object]  # the report, and with --reference its "reference"
    plot_error: str | None = None
    reference: object = None  # bench.reference.ReferenceComparison


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
    beside = None if p.against is None else p.against.beside(doc)
    if beside is not None:
        doc = {**doc, "reference": beside.to_json()}
    if r.out is not None:  # before the verdict: a fault keeps its figures
        r.out.parent.mkdir(parents=True, exist_ok=True)
        fsio.write_atomic(r.out, (json.dumps(doc, indent=2) + "\n").encode())
    plot_error = None
    if r.plot is not None:  # its failure is said after the figures: a failed plot must not lose the run
        try:
            write_plot(doc, r.plot)
        except (SparkstackError, OSError) as exc:
            plot_error = str(exc) if isinstance(exc, SparkstackError) else f"{r.plot}: {exc.strerror or exc}"
    return Result(report, doc, plot_error, beside)


def _notes(result: Result) -> list[str]:
    return [n for c in result.report.cells for n in c.notes()]


def _result_lines(p: Plan, result: Result) -> list:
    from sparkstack.bench.report import table

    beside = [] if result.reference is None else ["", *result.reference.lines()]
    return [table(result.doc), *_notes(result), *beside]


def _failure(p: Plan, result: Result | None) -> str | None:
    if result is None:
        return None
    verdict = result.report.verdict()
    if verdict and p.request.out is not None:
        verdict = f"{verdict} (report: {p.request.out})"
    return verdict or (result.reference.verdict() if result.reference is not None else "") or result.plot_error


def _plan_lines(p: Plan) -> list[str]:
    from sparkstack.bench.report import plan_lines

    ref = [] if p.against is None else [f"then beside {p.against.reference.title} ({p.against.reference.path})"]
    return [*plan_lines(p.bench), *ref]


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
    reference: str | None = reference_option()
    recipe: str | None = reference_recipe_option()
    dry_run: bool = option(False, "--dry-run", kind="flag", help="Accepted for uniformity: compare only reads.")
    as_json: bool = option(False, "--json", kind="flag")


@dataclass(frozen=True)
class ComparePlan:
    cmp: object  # bench.compare.Comparison
    beside: tuple = ()  # --reference: report A's and report B's ReferenceComparison


def _plan_compare(request: CompareRequest, environ: Mapping[str, str]) -> ComparePlan:
    from sparkstack.bench.compare import compare, read_report

    cmp = compare(request.report_a, request.report_b)
    ref = against(request.reference, request.recipe, environ)
    if ref is None:
        return ComparePlan(cmp)
    return ComparePlan(cmp, tuple(ref.beside(read_report(path)) for path in (request.report_a, request.report_b)))


def _compare_lines(p: ComparePlan) -> list:
    from sparkstack.bench.compare import table
    from sparkstack.bench.report import settings_line

    cmp = p.cmp
    lines = [table(cmp), f"A: {settings_line(cmp.a[1])}", f"B: {settings_line(cmp.b[1])}"]
    for name, (path, _), beside in zip("AB", (cmp.a, cmp.b), p.beside):
        lines += ["", f"{name} ({path}) beside the reference:", *beside.lines()]
    return lines


def _compare_json(p: ComparePlan) -> dict:
    doc = p.cmp.to_json()
    if p.beside:
        doc["reference"] = {"a": p.beside[0].to_json(), "b": p.beside[1].to_json()}
    return doc


COMPARE = Command(("compare",), CompareRequest, _plan_compare, lambda p, view: p,
                  plan_lines=_compare_lines, plan_json=_compare_json,
                  warnings=lambda p: (f"settings differ: {'; '.join(p.cmp.settings_differ)}",)
                  if p.cmp.settings_differ else (), dry=lambda r: True)
