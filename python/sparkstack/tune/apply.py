"""Apply a tune plan: each rank's steps, as root (`sudo -n` where the user is not), in order.

The first failure stops with one line; a refused `sudo -n` names the command to run by hand. Every step
can be run again: a re-run after a failure picks up what is still left.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from sparkstack.errors import SparkstackError
from sparkstack.launch.apply import drop_page_cache
from sparkstack.remote import Runner, failure_line, sudo_refused
from sparkstack.tune.plan import RankTune, Step, TunePlan


def _run_step(step: Step, runner: Runner) -> tuple[list[str], subprocess.CompletedProcess] | None:
    if step.name == "page-cache":
        return drop_page_cache(runner)  # launch's own drop-caches code
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


def apply_tune(plan: TunePlan, runners: dict[int, Runner], on_event: Callable[[str], None]) -> list[dict]:
    """Carry out every rank's steps; returns what was done, as JSON-ready rows."""
    problems = [f"rank {r.rank} ({r.where}): {p}" for r in plan.ranks for p in r.problems]
    if problems:
        raise SparkstackError(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    done = []
    for rank in plan.ranks:
        if rank.up_to_date:
            on_event(f"rank {rank.rank} ({rank.where}): up to date")
            continue
        runner = runners[rank.rank]
        for step in rank.steps:
            failed = _run_step(step, runner)
            if failed:
                raise SparkstackError(_failure(rank, step, runner, *failed))
            done.append({"rank": rank.rank, "step": step.name, "was": step.now, "now": step.want})
            on_event(f"rank {rank.rank} ({rank.where}): {step.name}: {step.now} -> {step.want}")
    return done
