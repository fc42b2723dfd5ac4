"""`sparkstack fetch` (and `fetch --resolve`): the command object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sparkstack.command import UP_TO_DATE, WILL_RUN, Blocked, Command, Summary, View, option
from sparkstack.options import recipe_option
from sparkstack.errors import SparkstackError
from sparkstack.units import human_bytes


@dataclass(frozen=True, kw_only=True)
class Request:
    recipe: str | None = recipe_option(help="Recipe name or path: its model and [drafter] repos, and their revisions.")
    resolve: bool = option(False, "--resolve", kind="flag",
                           help="Ask the hub for the current commit of each unpinned repo and pin it in the recipe "
                                "(through tomlkit); download nothing.")
    dry_run: bool = option(False, "--dry-run", kind="flag", help="Say what would be pinned or downloaded; write nothing.")
    as_json: bool = option(False, "--json", kind="flag")


@dataclass(frozen=True)
class Plan:
    request: Request
    fetch: object = None  # fetch.plan.FetchPlan
    resolve: object = None  # fetch.plan.ResolvePlan (--resolve)


def plan(request: Request, environ: Mapping[str, str], deployment=None) -> Plan:
    """`deployment`: the one `up` loaded already (else the request's recipe is loaded here)."""
    from sparkstack.fetch import plan_fetch, plan_resolve
    from sparkstack.fetch.plan import pin_steps, wanted
    from sparkstack.recipe import load_recipe

    if request.resolve:
        return Plan(request, resolve=plan_resolve(load_recipe(request.recipe)))
    if deployment is None:
        from sparkstack.deploy import load_deployment

        deployment = load_deployment(request.recipe, environ)
    try:
        return Plan(request, fetch=plan_fetch(deployment, environ))
    except SparkstackError as exc:
        if any(w.revision is None for w in wanted(deployment.recipe)):
            raise Blocked(str(exc), pin_steps(deployment.recipe)) from None
        raise


def apply(p: Plan, view: View):
    from sparkstack.fetch import apply_fetch, apply_resolve
    from sparkstack.fetch.plan import licence_lines

    if p.resolve is not None:
        return apply_resolve(p.resolve)
    if p.fetch.bytes_to_download:  # read before a byte is downloaded (--json: in the document too)
        for line in licence_lines(p.fetch.recipe):
            view.say(line)
    with view.progress("downloading", p.fetch.bytes_to_download, enabled=p.fetch.bytes_to_download > 0) as advance:
        return apply_fetch(p.fetch, on_progress=advance, on_wait=lambda entry, pid: view.note(
            f"sparkstack: waiting for another fetch of {entry}" + (f" (pid {pid})" if pid else "")))


def _plan_lines(p: Plan) -> list[str]:
    from sparkstack.fetch.plan import plan_lines, resolve_lines

    return resolve_lines(p.resolve, True, False) if p.resolve is not None else plan_lines(p.fetch)


def _plan_json(p: Plan) -> dict:
    if p.resolve is not None:
        return {**p.resolve.to_json(), "dry_run": True, "written": False}
    return {**p.fetch.to_json(), "dry_run": True}


def _result_lines(p: Plan, result) -> list[str]:
    from sparkstack.fetch.apply import result_lines
    from sparkstack.fetch.plan import resolve_lines

    return resolve_lines(p.resolve, False, result) if p.resolve is not None else result_lines(p.fetch, result)


def _result_json(p: Plan, result) -> dict:
    if p.resolve is not None:
        return {**p.resolve.to_json(), "dry_run": False, "written": result}
    return {**p.fetch.to_json(), "dry_run": False, "results": [r.to_json() for r in result]}


def summary(p: Plan) -> Summary:
    f = p.fetch
    revisions = {e.wanted.repo: e.revision for e in f.entries}
    if all(e.up_to_date for e in f.entries):
        return Summary(UP_TO_DATE, "; ".join(f"{e.wanted.repo} @ {e.revision[:12]}" for e in f.entries), 0,
                       {"revisions": revisions})
    todo = [e for e in f.entries if not e.up_to_date]
    return Summary(WILL_RUN, f"download {sum(len(e.to_download) for e in todo)} files "
                   f"({human_bytes(f.bytes_to_download)}) of "
                   f"{', '.join(f'{e.wanted.repo} @ {e.revision[:12]}' for e in todo)}",
                   f.bytes_to_download, {"revisions": revisions})


COMMAND = Command(("fetch",), Request, plan, apply, plan_lines=_plan_lines, plan_json=_plan_json,
                  result_lines=_result_lines, result_json=_result_json,
                  warnings=lambda p: () if p.fetch is None else p.fetch.warnings, summary=summary,
                  outputs=lambda p, r: dict(summary(p).outputs))
