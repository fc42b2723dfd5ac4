"""`sparkstack ship`: the command object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sparkstack.command import UP_TO_DATE, WILL_RUN, Blocked, Command, Summary, View, argument, option
from sparkstack.options import image_option, recipe_option
from sparkstack.errors import UsageError
from sparkstack.units import human_bytes

VIAS = ("fabric", "mgmt")


def streams_option(help: str):
    return option(None, "--streams", kind=("int", 1, 64), help=help)


def via_option(help: str):
    return option(None, "--via", kind=("choice", VIAS), help=help)


@dataclass(frozen=True, kw_only=True)
class Request:
    hosts: tuple[str, ...] = argument((), kind="hosts")
    recipe: str | None = recipe_option(help="Recipe name or path (its worker nodes, model, drafter, image, HF_HOME).")
    ssh_config: Path | None = option(None, "--ssh-config", kind="file", help="ssh client config.")
    image: str | None = image_option(help="A built OCI layout, or a config digest in the head's sparkstack store. "
                                           "Default: the image launch would run.")
    no_image: bool = option(False, "--no-image", kind="flag", help="Ship no image.")
    model: tuple[str, ...] = option((), "--model", kind="many", metavar="CACHE_NAME",
                                    help="A cache entry to ship (repeatable). Default: the recipe's model and drafter.")
    no_weights: bool = option(False, "--no-weights", kind="flag", help="Ship no cache entries.")
    streams: int | None = streams_option("ssh streams per host, one blob each at a time (default: the core count, "
                                         "at most 8).")
    via: str | None = via_option("Connect on the fabric address (same host key) or the management one. Default: "
                                 "fabric where known.")
    platform: str | None = option(None, "--platform", help="Platform to ship when the image holds several.")
    dry_run: bool = option(False, "--dry-run", kind="flag",
                           help="Ask each host (read-only) what it holds and print what would go.")
    as_json: bool = option(False, "--json", kind="flag")


@dataclass(frozen=True)
class Plan:
    request: Request
    ship: object  # ship.plan.ShipPlan


def plan(request: Request, environ: Mapping[str, str], deployment=None) -> Plan:
    from sparkstack.ship import plan_deployment_ship

    r = request
    if r.no_image and r.image:
        raise UsageError("--image and --no-image contradict each other")
    if r.no_weights and r.model:
        raise UsageError("--model and --no-weights contradict each other")
    if deployment is None:
        from sparkstack.deploy import load_deployment

        deployment = load_deployment(r.recipe, environ)
    return Plan(r, plan_deployment_ship(deployment, r.hosts, r.via, r.ssh_config, r.image, r.no_image, r.model,
                                        r.no_weights, r.streams, r.platform, readonly=r.dry_run))


@dataclass(frozen=True)
class Result:
    ship: object  # ship.apply.ShipResult
    note: str | None  # what the head's image store did


def apply(p: Plan, view: View) -> Result:
    from sparkstack.ship import apply_ship_recorded

    totals = {h.target.host: h.bytes_to_send for h in p.ship.hosts if not h.error}
    with view.hosts_progress(totals) as advance:
        result, note = apply_ship_recorded(p.ship, on_progress=advance)
    return Result(result, note)


def _errors(p: Plan) -> str | None:
    failed = [h for h in p.ship.hosts if h.error]
    return "; ".join(f"{h.target.host}: {h.error}" for h in failed) if failed else None


def _result_lines(p: Plan, r: Result) -> list[str]:
    from sparkstack.ship.report import result_lines

    lines = result_lines(p.ship, r.ship)
    if r.note:
        lines.append(f"head: image {p.ship.image.config_digest[:19]} {r.note}")
    return lines


def _failure(p: Plan, r: Result | None) -> str | None:
    if r is None:
        return _errors(p)
    failed = r.ship.failed
    return "; ".join(f"{h.host}: {h.error}" for h in failed) if failed else None


def summary(p: Plan) -> Summary:
    s = p.ship
    errors = _errors(p)
    if errors:
        raise Blocked(errors, None)
    outputs = {"image": s.image.config_digest if s.image else None, "hosts": [h.target.host for h in s.hosts]}
    if all(h.up_to_date for h in s.hosts):
        return Summary(UP_TO_DATE, f"{', '.join(h.target.host for h in s.hosts)}: hold the image and "
                       f"{len(s.entries)} entries, verified", 0, outputs)
    sends = [f"{h.target.host} {human_bytes(h.bytes_to_send, 'GiB')} in {len(h.send)} blobs" for h in s.hosts
             if not h.up_to_date]
    return Summary(WILL_RUN, "send " + ", ".join(sends) + " (then load and link there)",
                   sum(h.bytes_to_send for h in s.hosts), outputs)


def _outputs(p: Plan, r: Result) -> dict:
    def total(h, name: str) -> int:
        return (getattr(h.image, name) if h.image else 0) + sum(getattr(w, name) for w in h.weights)

    return {**summary(p).outputs, "bytes_sent": {h.host: total(h, "bytes_sent") for h in r.ship.hosts},
            "bytes_resumed": {h.host: total(h, "bytes_resumed") for h in r.ship.hosts}}


def _plan_lines(p: Plan) -> list[str]:
    from sparkstack.ship.report import plan_lines

    return plan_lines(p.ship)


COMMAND = Command(("ship",), Request, plan, apply, plan_lines=_plan_lines, plan_json=lambda p: p.ship.to_json(),
                  result_lines=_result_lines, result_json=lambda p, r: r.ship.to_json(), failure=_failure,
                  summary=summary, outputs=_outputs)
