"""`sparkstack top`: the command object."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from sparkstack.command import Command, View, argument, option
from sparkstack.options import recipe_option
from sparkstack.verify.command import api_key, api_key_env_option


@dataclass(frozen=True, kw_only=True)
class Request:
    url: str = argument()
    interval: float = option(2.0, "--interval", kind=("float", 0.1, 3600), show_default=True,
                             help="Seconds between /metrics reads.")
    once: bool = option(False, "--once", kind="flag",
                        help="Read twice, --interval apart (rates need two reads), show one sample, exit.")
    recipe: str | None = recipe_option(help="Also show the KV pool in tokens that the recipe's KV pin buys.")
    api_key_env: str = api_key_env_option()
    dry_run: bool = option(False, "--dry-run", kind="flag", help="Say what would be read; read nothing.")
    as_json: bool = option(False, "--json", kind="flag", help="One JSON sample (--once), else one JSON line per read.")


@dataclass(frozen=True)
class Plan:
    request: Request
    url: str
    pool: int | None
    pool_note: str
    api_key: str | None = field(default=None, repr=False, compare=False)

    @property
    def reads(self) -> str:
        return ("two reads of /metrics, --interval apart" if self.request.once
                else "a read of /metrics every --interval")


def plan(request: Request, environ: Mapping[str, str]) -> Plan:
    from sparkstack.endpoint.client import base_url
    from sparkstack.top import watch

    r = request
    url = base_url(r.url)
    key = api_key(r.api_key_env, environ)
    deployment = None
    if r.recipe is not None:
        from sparkstack.deploy import load_deployment

        deployment = load_deployment(r.recipe, environ)
    pool, pool_note = watch.kv_pool(deployment)
    return Plan(r, url, pool, pool_note, key)


def _document(p: Plan, history, state: str) -> dict:
    # a failed read has no figures: null, not the last read's
    return {"url": p.url, "state": state, "kv_pool_tokens": p.pool, **history.sample(fresh=state == "ok").to_json()}


@dataclass(frozen=True)
class Sample:
    history: object
    state: str


def apply(p: Plan, view: View) -> Sample | None:
    """--once: one sample. Else reads until Ctrl-C: JSON lines, or the live screen."""
    from sparkstack.endpoint.client import Endpoint
    from sparkstack.top import view as top_view
    from sparkstack.top import watch

    r = p.request
    view.hide(p.api_key)
    ep = Endpoint(p.url, p.api_key, timeout=max(5.0, r.interval))
    if r.once:
        return Sample(*watch.once(ep, r.interval))
    if r.as_json:
        for history, state in watch.follow(ep, r.interval):
            view.out(json.dumps(_document(p, history, state)))
    else:
        top_view.live(p.url, r.interval, watch.follow(ep, r.interval), p.pool, p.pool_note)
    return None


def _once_lines(p: Plan, sample: Sample | None) -> list:
    from sparkstack.top import view as top_view

    if sample is None:
        return []
    return [top_view.screen(p.url, p.request.interval, sample.history, sample.state, p.pool, p.pool_note)]


def _once_json(p: Plan, sample: Sample | None):
    if sample is None:
        return None
    return {**_document(p, sample.history, sample.state),
            "note": f"rates from two reads of /metrics {p.request.interval:g} s apart"}


COMMAND = Command(
    ("top",), Request, plan, apply,
    plan_lines=lambda p: [f"would watch {p.url}/metrics: {p.reads} ({p.request.interval:g} s); sends no request; "
                          "dry run: read nothing"],
    plan_json=lambda p: {"url": p.url, "interval_s": p.request.interval, "once": p.request.once, "reads": p.reads,
                         "kv_pool_tokens": p.pool, "sent": 0},
    result_lines=_once_lines, result_json=_once_json, quiet_interrupt=True)
