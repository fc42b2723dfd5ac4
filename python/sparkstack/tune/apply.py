"""Apply a tune plan: each rank's steps, as root (`sudo -n` where the user is not), in order.

A rank's problems (planned) are left for the user; its other steps still run. A failed step stops that rank's
later steps (a refused `sudo -n` names the command to run by hand); the other ranks go on. Every step can be
run again: a re-run after a failure picks up what is still left.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from sparkstack.remote import Runner, failure_line, sudo_refused
from sparkstack.tune.pagecache import drop_page_cache
from sparkstack.tune.plan import RankTune, Step, TunePlan


def _run_step(step: Step, runner: Runner) -> tuple[list[str], subprocess.CompletedProcess] | None:
    if step.name == "page-cache":
        return drop_page_cache(runner)  # the same drop launch's --drop-caches runs
    for command in step.commands:
        proc = runner.run_as_root(list(command.argv), timeout=300, input=command.input)
        if proc.returncode != 0:
            return list(command.argv), proc
    return None


def _failure(rank: RankTune, step: Step, runner: Runner, argv: list[str], proc: subprocess.CompletedProcess) -> str:
    where = f"rank {rank.rank} ({runner.label})"
    if runner.sudo and sudo_refused(proc):
        there = "here" if runner.ssh is None else f"on {runner.ssh}"
        return f"{where}: sudo -n refused {step.name} ({failure_line(proc)}); run it {there} yourself: {step.by_hand}"
    return f"{where}: {step.name}: `{' '.join(argv)}` failed: {failure_line(proc)}"


def apply_tune(plan: TunePlan, runners: dict[int, Runner],
               on_event: Callable[[str], None]) -> tuple[list[dict], list[str]]:
    """Carry out every rank's steps; returns what was done (JSON-ready rows) and what was not, one line each."""
    done, problems = [], []
    for rank in plan.ranks:
        where = f"rank {rank.rank} ({rank.where})"
        problems += [f"{where}: {p}" for p in rank.problems]
        if rank.up_to_date:
            on_event(f"{where}: up to date")
        runner = runners[rank.rank]
        for step in rank.steps:
            failed = _run_step(step, runner)
            if failed:
                problems.append(_failure(rank, step, runner, *failed))
                break
            done.append({"rank": rank.rank, "step": step.name, "was": step.now, "now": step.want})
            on_event(f"{where}: {step.name}: {step.now} -> {step.want}")
        for note in rank.notes:
            on_event(f"{where}: note: {note}")
    return done, problems
