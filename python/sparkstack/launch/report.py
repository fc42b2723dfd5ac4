"""What `launch` shows before it acts: which ranks a TARGET names, the dry-run document, the preflight verdict."""

from __future__ import annotations

import shlex

from sparkstack.launch.calibrate import measure_record
from sparkstack.launch.plan import LaunchPlan, RankPlan
from sparkstack.launch.preflight import PreflightCheck
from sparkstack.launch.confirm import confirm_lines
from sparkstack.launch.timeline import timeline_lines
from sparkstack.recipe.kv import KvPlan

def dry_run_document(plan: LaunchPlan, target: str, selected: list[RankPlan], checks: list[PreflightCheck],
                     drop_caches: bool) -> dict:
    """`launch --dry-run --json`: one rank prints its own object (with `docker_run`); `all` always prints `ranks`."""
    doc = plan.to_json()
    extra = {"preflight": [c.to_json() for c in checks],
             "would_drop_caches_on": [r.rank for r in selected] if drop_caches else [],
             "would_load": _would_load(plan, selected, checks)}
    if target == "all":
        return {**doc, "ranks": [r.to_json() for r in selected], **extra}
    return {**{k: v for k, v in doc.items() if k != "ranks"}, **selected[0].to_json(), **extra}


def _would_load(plan: LaunchPlan, selected: list[RankPlan], checks: list[PreflightCheck]) -> dict | None:
    """With --image LAYOUT, apply loads it on the head unless the head already holds its config digest."""
    if plan.image_layout is None or 0 not in [r.rank for r in selected]:
        return None
    known = [c for c in checks if c.name == "image" and c.rank == 0]
    if known and known[0].status == "pass" and "not here yet" not in known[0].detail:
        return None  # --probe saw it there already
    return {"rank": 0, "from": str(plan.image_layout), "config_digest": plan.image_config_digest,
            "if_missing": not known}


def dry_run_lines(plan: LaunchPlan, selected: list[RankPlan], checks: list[PreflightCheck], drop_caches: bool) -> list[str]:
    """The human form of dry_run_document."""
    r = plan.recipe
    lines = [f"recipe {r.name} ({r.status}{': ' + r.blocked_reason if r.blocked else ''}), profile {plan.profile}"]
    lines += [c.line() for c in checks]
    if drop_caches:
        lines.append(f"would drop the page cache on rank(s) {', '.join(str(rk.rank) for rk in selected)}")
    load = _would_load(plan, selected, checks)
    if load:
        lines.append(f"would load {load['from']} ({load['config_digest'][:19]}) on rank 0"
                     + (" if it is missing there" if load["if_missing"] else ""))
    for rk in selected:
        where = rk.ssh or "this machine"
        lines.append(f"\n# rank {rk.rank} on {rk.host} ({where}){' via ' + rk.docker_host if rk.docker_host else ''}")
        lines.append(shlex.join(rk.docker_run))
    lines += [f"note: {note}" for note in plan.notes]
    return lines


def preflight_verdict(checks: list[PreflightCheck]) -> str | None:
    """None when launch may go on; else the one line that says why not."""
    failed = [c for c in checks if c.status == "fail"]
    if not failed:
        return None
    return f"preflight failed ({len(failed)}): {failed[0].line().strip()}"


def stop_lines(cmds: list[tuple[int, str, list[str]]]) -> list[str]:
    """`launch stop --dry-run`: what would run where."""
    return [f"would run on {on} (rank {r}): {' '.join(argv)}" for r, on, argv in cmds]


def boot_lines(run: str, boot: dict | None) -> list[str]:
    """A run's boot: its readiness times, then the per-rank timeline and the KV pool."""
    if boot is None:
        return [f"last run {run}: no boot watched (the head was not started)"]
    return [f"run {run}: port open {boot['port_open_s']} s, /health {boot['health_s']} s, first token {boot['ttft_s']} s",
            *timeline_lines(boot.get("timeline", []), boot.get("kv_pool")), *confirm_lines(boot.get("confirm"))]


def kv_status_line(planned: KvPlan, last_run: dict | None) -> str | None:
    """`launch status`: the plan's KV tokens against what the last run's boot measured; None when it measured none."""
    if not last_run:
        return None
    m = measure_record(last_run)
    if m.tokens is None:
        return None
    plan = "?" if planned.tokens is None else f"{planned.tokens:,}"
    ratio = f" ({m.tokens / planned.tokens:.3f}x the plan)" if planned.tokens else ""
    pool = "" if m.pool_bytes is None else f", pool {m.pool_bytes:,} B ({m.pool})"
    return f"KV: plan {plan} tokens, measured {m.tokens:,}{ratio}{pool} (run {m.run_id})"


def status_lines(rows: list[dict], last_run: dict | None, planned_kv: KvPlan | None = None) -> list[str]:
    """`launch status`: one line per rank, then the last run's boot; with `planned_kv` (launch.kv.kv_plan of the
    deployment as it stands), the plan's KV tokens against the boot's."""
    lines = [" ".join(f"{k}={'-' if v is None else v}" for k, v in row.items()) for row in rows]  # None: not known
    if last_run:
        lines += boot_lines(last_run["id"], last_run.get("boot"))
        kv = kv_status_line(planned_kv, last_run) if planned_kv is not None else None
        if kv:
            lines.append(kv)
    return lines


def started_lines(run) -> list[str]:
    """What a launch started (launch.apply.Started): the boot, the memory guard, the run record."""
    lines = boot_lines(run.record.stem, run.boot.to_json()) if run.boot is not None else []
    if run.guard is not None:
        lines.append(f"memory guard: stopped with the boot watch; acted {len(run.guard.fired)} time(s)")
    lines.append(f"run record: {run.record}")
    return lines


def last_up_lines(record: dict | None) -> list[str]:
    """The last `up`'s record, as `launch status` shows it: one line per stage."""
    if not record:
        return []
    lines = [f"last up: recipe {record.get('recipe')}, {record.get('started_at')} ({record.get('record')})"]
    for r in record.get("stages", []):
        took = f" in {r.get('seconds', 0):.1f} s" if r.get("outcome") in ("done", "failed", "cut") else ""
        lines.append(f"  {r.get('stage')}: {r.get('outcome')}{took}")
    return lines
