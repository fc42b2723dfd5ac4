"""`sparkstack verify`: the command object, and the API-key option every command that asks the engine shares."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sparkstack.command import Command, View, argument, option
from sparkstack.options import temperature_option


def api_key_env_option():
    return option("VLLM_API_KEY", "--api-key-env", show_default=True, metavar="VAR",
                  help="Environment variable holding the API key; a key never goes on the command line.")


def api_key(name: str, environ: Mapping[str, str]) -> str | None:
    from sparkstack.endpoint.client import api_key_from

    return api_key_from(name, environ)


@dataclass(frozen=True, kw_only=True)
class Request:
    url: str = argument()
    model: str | None = option(None, "--model", help="Model to ask (default: the first one /v1/models lists).")
    api_key_env: str = api_key_env_option()
    timeout: float = option(300.0, "--timeout", kind=("float", 0.1, 86400), show_default=True,
                            help="Seconds for the whole run; each request waits at most what is left of it.")
    temperature: float = temperature_option(help="The serving temperature, for the sampling check (the model's own default: 1.0).")
    dry_run: bool = option(False, "--dry-run", kind="flag", help="Print the checks it would run; send no request.")
    as_json: bool = option(False, "--json", kind="flag",
                           help='Print {"checks": [{"check", "status", "detail"}]}.')


@dataclass(frozen=True)
class Plan:
    request: Request
    verify: object  # verify.run.VerifyPlan
    api_key: str | None = field(default=None, repr=False, compare=False)  # never in a plan's text


def plan(request: Request, environ: Mapping[str, str]) -> Plan:
    from sparkstack.verify.run import plan_verify

    r = request
    vp = plan_verify(r.url, r.model, r.api_key_env, environ, r.timeout, r.temperature)
    return Plan(r, vp, api_key(r.api_key_env, environ))


def apply(p: Plan, view: View) -> tuple:
    from sparkstack.launch.apply import latest_record
    from sparkstack.verify.run import run_verify

    view.hide(p.api_key)
    say = None if p.request.as_json else (lambda result: view.say(result.line()))
    return tuple(run_verify(p.verify, p.api_key, on_result=say, record=latest_record()))


def _failure(p: Plan, results) -> str | None:
    from sparkstack.verify.run import verdict

    return None if results is None else verdict(list(results))


COMMAND = Command(("verify",), Request, plan, apply, plan_lines=lambda p: p.verify.lines(),
                  plan_json=lambda p: p.verify.to_json(), result_lines=lambda p, results: [],  # said one by one
                  result_json=lambda p, results: {"checks": [r.to_json() for r in results]}, failure=_failure,
                  outputs=lambda p, results: {"checks": len(results), "temperature": p.verify.temperature,
                                              "warned": [r.check for r in results if r.status == "warn"]})
