"""`sparkstack tune`: the command object."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sparkstack.command import UP_TO_DATE, WILL_RUN, Blocked, Command, Summary, View, argument, option
from sparkstack.options import recipe_option

PLACEHOLDER_SSH = "user@worker-node"  # the shipped recipe's WORKER_SSH, until the user names the worker


def host_root_option(help: str):
    return option(Path("/"), "--host-root", kind="dir", show_default=True, help=help)


def ssh_config_option():
    return option(None, "--ssh-config", kind="file", help="ssh client config for the workers.")


@dataclass(frozen=True, kw_only=True)
class Request:
    target: str = argument("all", metavar="[RANK|all]")
    recipe: str | None = recipe_option(help="Recipe name or path: its ranks, and its clock_cap (default 0,2000).")
    host_root: Path = host_root_option("Read and write host files (/proc, /etc/sysctl.d, /run) below this root, on "
                                       "every rank.")
    ssh_config: Path | None = ssh_config_option()
    dry_run: bool = option(False, "--dry-run", kind="flag", help="Only read each rank's facts and say what differs.")
    as_json: bool = option(False, "--json", kind="flag")


@dataclass(frozen=True)
class Plan:
    request: Request
    tune: object  # tune.plan.TunePlan
    runners: Mapping[int, object] = field(compare=False, repr=False)


def placeholder_ranks(deployment) -> list[str]:
    """Ranks whose ssh target is still the shipped recipe's placeholder: nothing can reach them yet."""
    return [f"rank {r.rank}" for r in deployment.ranks if r.ssh == PLACEHOLDER_SSH]


def unblock_placeholder(deployment) -> str:
    from sparkstack.shipped import installed_copy_root

    path = deployment.recipe.path
    where = f"a copy of {path}" if installed_copy_root(path) is not None else str(path)
    return f"name the worker: WORKER_SSH=user@host in the environment, or ssh = \"user@host\" in [[nodes]] of {where}"


def plan(request: Request, environ: Mapping[str, str], deployment=None) -> Plan:
    from sparkstack.tune.plan import plan_tune

    if deployment is None:
        from sparkstack.deploy import load_deployment

        deployment = load_deployment(request.recipe, environ)
    tune, runners = plan_tune(deployment, request.target, request.host_root, request.ssh_config)
    return Plan(request, tune, runners)


@dataclass(frozen=True)
class Result:
    done: list
    problems: list


def apply(p: Plan, view: View) -> Result:
    from sparkstack.tune.apply import apply_tune

    done, problems = apply_tune(p.tune, p.runners, view.say)
    return Result(done, problems)


def without_page_cache(p: Plan) -> Plan:
    """Tune while the pair already serves: a page-cache drop matters only before a launch, so it is left out."""
    ranks = tuple(dataclasses.replace(r, steps=tuple(s for s in r.steps if s.name != "page-cache"))
                  for r in p.tune.ranks)
    return dataclasses.replace(p, tune=dataclasses.replace(p.tune, ranks=ranks))


def _detail(tune) -> str:
    """Per rank, the steps that differ (tune --dry-run shows each one's now -> want) and what it leaves alone."""
    parts = [f"rank {r.rank}: {', '.join(s.name for s in r.steps)}" for r in tune.ranks if r.steps]
    parts += [f"rank {r.rank}: {n}" for r in tune.ranks for n in r.notes]
    return "; ".join(parts) or "nothing to change"


def summary(p: Plan) -> Summary:
    t = p.tune
    problems = [f"rank {r.rank}: {pr}" for r in t.ranks for pr in r.problems]
    if problems:
        raise Blocked("; ".join(problems), None)
    if t.up_to_date:
        return Summary(UP_TO_DATE, f"ranks {', '.join(str(r.rank) for r in t.ranks)}: nothing differs")
    return Summary(WILL_RUN, _detail(t))


def _plan_lines(p: Plan) -> list[str]:
    from sparkstack.tune.plan import plan_lines

    return plan_lines(p.tune)


COMMAND = Command(
    ("tune",), Request, plan, apply, plan_lines=_plan_lines, plan_json=lambda p: p.tune.to_json(),
    result_json=lambda p, r: {**p.tune.to_json(), "done": r.done, "problems": r.problems},  # also on failure
    failure=lambda p, r: "; ".join(r.problems) if r is not None and r.problems else None, summary=summary,
    outputs=lambda p, r: {"done": r.done},
    on_interrupt=": the steps printed as done are done; the one under way may be half done (a file it writes is "
                 "renamed into place only when whole); run tune again for the rest")
