"""`sparkstack soak`: the command object."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sparkstack.command import Command, View, argument, embed, option, request
from sparkstack.options import SamplingOptions, recipe_option
from sparkstack.verify.command import api_key, api_key_env_option


@request
class Request:
    url: str = argument()
    duration: float = option(None, "--duration", kind="duration", required=True,
                             help="How long to soak: 90s, 30m, 2h, 1h30m (at most 7 days).")
    concurrency: int = option(4, "--concurrency", kind=("int", 1, 256), show_default=True, help="Concurrent streams.")
    category: tuple[str, ...] = option((), "--category", kind="names",
                                       help="Suite category (repeatable or comma-separated; default: all of them, in "
                                            "turn).")
    window: float = option(60.0, "--window", kind="duration", show_default="60s", help="Length of one logged window.")
    log: Path | None = option(None, "--log", kind="path", help="The JSONL log, created new (default: "
                                                                "./soak-<UTC time>.jsonl).")
    max_requests: int | None = option(None, "--max-requests", kind=("int", 1, None),
                                      help="Hard cap on requests sent (default: 2 per second per stream over the "
                                           "duration).")
    health_interval: float = option(5.0, "--health-interval", kind=("float", 0.05, 600), show_default=True,
                                    help="Seconds between /health and /metrics reads.")
    dead_after: float = option(300.0, "--dead-after", kind="duration", show_default="5m",
                               help="End the soak when /health stays down this long.")
    max_tokens: int = option(256, "--max-tokens", kind=("int", 1, 1 << 20), show_default=True)
    _sampling: object = embed(SamplingOptions)
    model: str | None = option(None, "--model", help="Model name to request (default: the first of /v1/models).")
    timeout: float = option(300.0, "--timeout", kind=("float", 1, 86400), show_default=True,
                            help="Seconds one request may go without data.")
    recipe: str | None = recipe_option(help="With the URL on this host at the recipe's API port: also "
                                                       "watch the head container's start time (launch status, once "
                                                       "per window).")
    api_key_env: str = api_key_env_option()
    dry_run: bool = option(False, "--dry-run", kind="flag", help="Print the plan; send nothing, create no log.")
    as_json: bool = option(False, "--json", kind="flag", help="Print the plan or the summary as JSON.")


@dataclass(frozen=True)
class Plan:
    request: Request
    soak: object  # soak.plan.SoakPlan
    suite: object = field(repr=False, compare=False)
    api_key: str | None = field(default=None, repr=False, compare=False)


def plan(request: Request, environ: Mapping[str, str]) -> Plan:
    from sparkstack.bench import suite as bench_suite
    from sparkstack.endpoint.client import base_url
    from sparkstack.soak.plan import plan_soak

    r = request
    key = api_key(r.api_key_env, environ)
    suite = bench_suite.load()
    deployment = None
    if r.recipe is not None:
        from sparkstack.deploy import load_deployment

        deployment = load_deployment(r.recipe, environ)
    log = r.log or Path(time.strftime("soak-%Y%m%dT%H%M%SZ.jsonl", time.gmtime()))
    sp = plan_soak(base_url(r.url), duration_s=r.duration, concurrency=r.concurrency,
                    categories=suite.check_categories(r.category), window_s=r.window, max_requests=r.max_requests,
                    log=log, health_interval_s=r.health_interval, dead_after_s=r.dead_after, max_tokens=r.max_tokens,
                    temperature=r.temperature, top_p=r.top_p, model=r.model, request_timeout_s=r.timeout,
                    deployment=deployment)
    return Plan(r, sp, suite, key)


def apply(p: Plan, view: View):
    from sparkstack.soak import report as soak_report
    from sparkstack.soak import run as soak_run

    view.hide(p.api_key)
    if not p.request.as_json:
        for line in p.soak.lines():
            view.say(line)
    return soak_run.run(p.soak, p.suite, p.api_key, on_window=lambda w: view.note(soak_report.window_line(w)))


def _summary_lines(p: Plan, outcome) -> list[str]:
    from sparkstack.soak import report as soak_report

    return soak_report.summary_lines(outcome.summary)


COMMAND = Command(
    ("soak",), Request, plan, apply,
    plan_lines=lambda p: [*p.soak.lines(), "dry run: nothing sent, no log created"],
    plan_json=lambda p: {"plan": p.soak.to_json(), "sent": 0},
    result_lines=_summary_lines, result_json=lambda p, outcome: outcome.summary,
    cut=lambda p, outcome: (f": the summary so far is above; the log is kept at {p.soak.log}"
                            if outcome.ended == "interrupted" else None),
    failure=lambda p, outcome: None if outcome is None else outcome.message or None)
