"""`sparkstack strip`: the command object (request, plan, apply, forms)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sparkstack.command import UP_TO_DATE, WILL_RUN, Command, Summary, View, argument, option
from sparkstack.units import human_bytes

if TYPE_CHECKING:
    from sparkstack.strip.apply import StripResult
    from sparkstack.strip.plan import StripPlan

# The plan's and apply's modules (the cache, the shard reader, fsio) are imported where they are used, so that
# `sparkstack strip --help` loads only this declaration (issue 39's start-up budget).

PATH = ("strip",)


@dataclass(frozen=True, kw_only=True)
class Request:
    src: Path = argument(kind="path")
    out: Path | None = option(None, "--out", kind="path",
                              help="Output cache entry or dir (default: sibling ...-no-MTP).")
    index_only: bool = option(False, "--index-only", kind="flag",
                              help="Edit only config.json and the index; leave shards as they are.")
    dry_run: bool = option(False, "--dry-run", kind="flag", help="Print the plan and write nothing.")
    as_json: bool = option(False, "--json", kind="flag", help="Print the plan (and result) as JSON.")


@dataclass(frozen=True)
class Plan:
    request: Request
    strip: StripPlan


def plan(request: Request, environ: Mapping[str, str]) -> Plan:
    from sparkstack.hfcache import no_mtp_destination, resolve_source
    from sparkstack.strip.plan import plan_strip

    source = resolve_source(request.src)
    dest = request.out.absolute() if request.out else no_mtp_destination(source)
    return Plan(request, plan_strip(source, dest, index_only=request.index_only))


def apply(p: Plan, view: View) -> StripResult:
    from sparkstack.strip.apply import apply_strip

    total = p.strip.bytes_to_copy
    with view.progress("rewriting shards", total, enabled=not p.strip.up_to_date and total > 0) as advance:
        return apply_strip(p.strip, on_progress=advance, on_wait=lambda dest, pid: view.note(
            f"sparkstack: waiting for another strip of {dest}" + (f" (pid {pid})" if pid else "")))


def plan_json(p: Plan) -> dict:
    return p.strip.to_json()


def result_json(p: Plan, result: StripResult) -> dict:
    return {"plan": p.strip.to_json(), "result": result.to_json()}


def summary(p: Plan) -> Summary:
    s = p.strip
    served = s.dest.root.name
    outputs = {"entry": served, "revision": s.dest.revision, "fingerprint": s.fingerprint}
    if s.up_to_date:
        return Summary(UP_TO_DATE, f"{served} @ {(s.dest.revision or '')[:12]}: stripped from these shards already",
                       0, outputs)
    rewrite = sum(1 for sh in s.shards if sh.action == "rewrite")
    out_of = "the index (shards linked as they are)" if s.index_only else f"{rewrite} shards"
    return Summary(WILL_RUN, f"{len(s.mtp_keys)} MTP tensors out of {out_of} into {served} "
                   f"(writes {human_bytes(s.bytes_to_write)}, frees {human_bytes(s.bytes_freed)})",
                   s.bytes_to_write, outputs)


def plan_lines(p: Plan) -> list[str]:
    from sparkstack.strip.plan import plan_lines as strip_plan_lines

    return strip_plan_lines(p.strip)


COMMAND = Command(PATH, Request, plan, apply, plan_lines=plan_lines, plan_json=plan_json,
                  result_lines=lambda p, r: r.lines(p.strip), result_json=result_json,
                  warnings=lambda p: p.strip.warnings, summary=summary, outputs=lambda p, r: dict(summary(p).outputs))
