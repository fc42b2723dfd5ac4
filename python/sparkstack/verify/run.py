"""The verify plan (pure: the URL, the model, where the key comes from, the checks) and the runner (I/O)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from sparkstack.checkline import check_line
from sparkstack.endpoint.client import Endpoint, EndpointError, base_url, check_key_env
from sparkstack.errors import SparkstackError, UsageError
from sparkstack.text import printable
from sparkstack.verify.checks import CHECKS, CheckFailed, OutOfTime, Session, VerifyCheck

@dataclass(frozen=True)
class VerifyPlan:
    url: str
    model: str | None  # None: the first model /v1/models lists
    api_key_env: str
    api_key_set: bool
    timeout_s: float
    checks: tuple[VerifyCheck, ...]
    temperature: float = 1.0  # the serving temperature, for the sampling check

    def to_json(self) -> dict:
        return {"url": self.url, "model": self.model, "api_key_env": self.api_key_env,
                "api_key_set": self.api_key_set, "timeout_s": self.timeout_s, "temperature": self.temperature,
                "checks": [c.to_json() for c in self.checks]}

    def lines(self) -> list[str]:
        model = self.model or "the first of /v1/models"
        key = "set" if self.api_key_set else "not set: no key is sent"
        head = (f"would verify {self.url} asking {model}; API key from ${self.api_key_env} ({key}); "
                f"at most {self.timeout_s:g} s in all; sampling at temperature {self.temperature:g}")
        return [head] + [f"{'required' if c.required else 'warn-only':<9} {c.name}: {c.asks}" for c in self.checks]


@dataclass(frozen=True)
class Result:
    check: str
    status: str  # pass | warn | fail
    detail: str
    required: bool

    def line(self) -> str:
        return check_line(self.status, self.check, printable(self.detail))  # the detail quotes the server

    def to_json(self) -> dict:
        return {"check": self.check, "status": self.status, "detail": self.detail}


def plan_verify(url: str, model: str | None, api_key_env: str, env: Mapping[str, str], timeout_s: float,
                temperature: float = 1.0) -> VerifyPlan:
    """The plan; `env` is only asked whether the key's variable is set."""
    check_key_env(api_key_env)
    if model is not None and not model.strip():
        raise UsageError("--model must not be empty")
    if not 0 <= temperature <= 2:
        raise UsageError(f"--temperature {temperature:g}: must be in [0, 2]")
    return VerifyPlan(base_url(url), model, api_key_env, bool(env.get(api_key_env)), timeout_s, CHECKS, temperature)


def _port(url: str) -> int | None:
    parts = urlsplit(url)
    try:
        return parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return None


def record_results(record: Mapping | None, url: str) -> tuple[Result, ...]:
    """What launch's run record says of the pair serving `url` (the one on its API port): the drafter's licence
    beside the model, and the boot lines the recipe expects, each seen or not (a missing one fails or warns, as the
    recipe says). Nothing from a record of another port, or one written before launch recorded these."""
    if not record or record.get("api_port") is None or record.get("api_port") != _port(url):
        return ()
    out = []
    drafter = record.get("drafter") or {}
    if record.get("model") and drafter.get("repo"):
        licence = drafter.get("licence") or "no licence recorded in the recipe: read the model card before use"
        out.append(Result("licence", "pass", f"model {record['model']} (served as {record.get('served_name')}); "
                                             f"drafter {drafter['repo']}: {licence}", False))
    confirm = (record.get("boot") or {}).get("confirm") or []
    if confirm:
        absent = [c for c in confirm if c.get("status") != "seen"]
        run = f"run {record.get('id')}"
        if not absent:
            out.append(Result("boot-lines", "pass", f"{run}: all {len(confirm)} expected boot lines seen", False))
        else:
            failing = any((c.get("verdict") or c.get("missing")) == "fail" for c in absent)
            said = "; ".join(f"{c.get('status')}: {c.get('expect')}"
                             + (f" (the boot says {c.get('line')!r})" if c.get("status") == "differs" else "")
                             for c in absent)
            out.append(Result("boot-lines", "fail" if failing else "warn", f"{run}: {said}", failing))
    return tuple(out)


def run_verify(plan: VerifyPlan, api_key: str | None,
               on_result: Callable[[Result], None] | None = None, record: Mapping | None = None) -> tuple[Result, ...]:
    """Every check in order, each a Result as it finishes; the whole run ends within the plan's timeout. With
    `record` (launch's latest run record), also what it says of the pair on the plan's port (record_results)."""
    endpoint = Endpoint(plan.url, api_key, plan.timeout_s)
    session = Session(endpoint, plan.model, plan.timeout_s, plan.temperature)
    results = []
    try:
        for check in plan.checks:
            passed, detail = _run_one(check, session, plan.api_key_env)
            detail = mask_key(detail, api_key)
            result = Result(check.name, "pass" if passed else "fail" if check.required else "warn", detail,
                            check.required)
            if on_result:
                on_result(result)
            results.append(result)
    finally:
        endpoint.close()
    for result in record_results(record, plan.url):
        if on_result:
            on_result(result)
        results.append(result)
    return tuple(results)


def mask_key(text: str, api_key: str | None) -> str:
    """`text` with the API key replaced by ***: a server may echo what it was sent into an error message."""
    return text.replace(api_key, "***") if api_key else text


def _run_one(check: VerifyCheck, session: Session, api_key_env: str) -> tuple[bool, str]:
    if session.unreachable:
        return False, f"not run: {session.unreachable}"
    if check.needs_model and session.model is None:
        return False, "not run: no model to ask (see models)"
    try:
        return True, check.probe(session)
    except OutOfTime as exc:
        return False, f"not run: {exc}"
    except CheckFailed as exc:
        return False, str(exc)
    except EndpointError as exc:
        if exc.kind == "connect":
            session.unreachable = f"no connection to {session.url} (see {check.name})"
        if exc.kind in ("http_401", "http_403"):
            return False, f"{exc} (the key is read from ${api_key_env})"
        return False, str(exc)
    except SparkstackError as exc:  # e.g. /metrics that is not Prometheus text
        return False, str(exc)


def verdict(results: tuple[Result, ...]) -> str | None:
    """None when every required check passed; else the one line that says which did not."""
    failed = [r.check for r in results if r.required and r.status == "fail"]
    if not failed:
        return None
    return f"verify: {len(failed)} required check(s) failed: {', '.join(failed)}"
