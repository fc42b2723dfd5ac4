"""`sparkstack up`'s human forms: the plan as one table, what a run did, and where a stopped run stands."""

from __future__ import annotations

from sparkstack.units import human_bytes
from sparkstack.up.plan import BLOCKED, UP_TO_DATE, WILL_RUN, UpPlan


def plan_lines(plan: UpPlan) -> list[str]:
    """One row per stage: its state and its one line; a blocked stage adds the command that unblocks it."""
    width = max(len(s.name) for s in plan.stages)
    lines = [f"up: recipe {plan.recipe}"]
    if plan.licence is not None:  # before any stage: fetch downloads the drafter under it
        lines.append(f"  licence: drafter {plan.licence['repo']}: "
                     f"{plan.licence['licence'] or 'not recorded in the recipe: read its model card before use'}")
    for s in plan.stages:
        lines.append(f"  {s.name:<{width}}  {s.state:<10}  {s.detail}")
        if s.state == BLOCKED and s.unblock:
            lines.append(f"  {'':<{width}}  {'':<10}  unblock: {s.unblock}")
    counts = {state: [s.name for s in plan.stages if s.state == state] for state in (UP_TO_DATE, WILL_RUN, BLOCKED)}
    total = sum(s.bytes or 0 for s in plan.stages if s.state == WILL_RUN)
    summary = f"{len(counts[UP_TO_DATE])} up to date, {len(counts[WILL_RUN])} to run"
    if total:
        summary += f" ({human_bytes(total)} known up front)"
    if counts[BLOCKED]:
        summary += f", blocked: {', '.join(counts[BLOCKED])} (up runs the stages before the first, then stops there)"
    lines.append(summary if counts[WILL_RUN] or counts[BLOCKED] else summary + ": nothing to do")
    if plan.last_run:
        ended = next((r for r in plan.last_run.get("stages", []) if r.get("outcome") in ("failed", "cut", "blocked")),
                     None)
        how = f"stopped at {ended['stage']} ({ended['outcome']})" if ended else "finished"
        lines.append(f"last up: {plan.last_run.get('started_at')}, {how}")
    return lines


def result_lines(result) -> list[str]:
    """What each stage did, with its time; ship adds the bytes each host was sent."""
    lines = []
    for r in result.runs:
        took = f" in {r.seconds:.1f} s" if r.outcome in ("done", "failed", "cut") else ""
        lines.append(f"  {r.stage:<6}  {r.outcome}{took}: {r.detail}")
        sent = r.outputs.get("bytes_sent") if r.outcome == "done" else None
        resumed = r.outputs.get("bytes_resumed") or {}
        if isinstance(sent, dict):
            lines.append("          sent " + ", ".join(
                f"{h} {human_bytes(n, 'GiB')}" + (f" (and {human_bytes(resumed[h], 'GiB')} of cut blobs kept: not "
                                                   "sent again)" if resumed.get(h) else "") for h, n in sent.items()))
    lines.append(f"record: {result.record}")
    return lines


def stopped_lines(result) -> list[str]:
    """After Ctrl-C or a failure: what is done, what was cut, and that `up` may simply be run again."""
    by = {}
    for r in result.runs:
        by.setdefault(r.outcome, []).append(r.stage)
    parts = [f"{what}: {', '.join(by[key])}" for key, what in
             (("done", "done"), ("up to date", "up to date"), ("cut", "cut"), ("failed", "failed"),
              ("blocked", "blocked"), ("not started", "not started"), ("skipped", "skipped")) if key in by]
    return ["up: " + "; ".join(parts),
            "run `sparkstack up` again: finished stages plan as up to date, and a cut transfer resumes"]
