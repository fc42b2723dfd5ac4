"""The bench, block by block: each block's rounds are batches (batch.py); a noisy block runs once more."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from sparkstack.bench.batch import Batch, run_concurrent
from sparkstack.bench.plan import BenchPlan, Block
from sparkstack.bench.report import NOISY, SERVER_BUSY, Cell, Report, make_cell, noisy
from sparkstack.endpoint import metrics
from sparkstack.endpoint.client import Endpoint
from sparkstack.errors import SparkstackError
from sparkstack.verify.checks import served_models


def _run_block(plan: BenchPlan, endpoint: Endpoint, block: Block, attempt: int, has_metrics: bool,
               on_request: Callable[[], None]) -> list[Batch]:
    batches: list[Batch] = []
    before = None
    for r in range(block.rounds):
        bodies = [plan.body(block, attempt, r, s) for s in range(block.concurrency)]
        batch = run_concurrent(endpoint, bodies, scrape=has_metrics, before=before, on_done=lambda _o: on_request())
        if batch.restarted:
            raise SparkstackError(f"{block.name}: the server's counters went back during round {r + 1} "
                                  f"({batch.restarted[0]}): it restarted; bench again")
        if not batch.results:
            first = batch.failures[0]
            raise SparkstackError(f"{block.name}: every request of round {r + 1} failed: {first.error}")
        batches.append(batch)
        before = batch.after
    return batches


def run_bench(plan: BenchPlan, endpoint: Endpoint, *, force: bool = False,
              on_progress: Callable[[str, int, int], None] | None = None) -> Report:
    """Run every block of the plan. `on_progress(label, requests_done, requests_planned)` after each request.

    Refuses a server that is already running requests (their tokens would count as ours) unless `force`, which
    flags every cell `server_busy` instead."""
    healthy, detail = endpoint.health()
    if not healthy:
        where = detail if endpoint.url in detail else f"{endpoint.url}/health: {detail}"
        raise SparkstackError(f"{where}: the server is not serving")
    model = plan.settings.model or served_models(endpoint)[0]
    plan = dataclasses.replace(plan, settings=dataclasses.replace(plan.settings, model=model))
    start = endpoint.scrape()
    warnings = [] if start is not None else [f"{endpoint.url}/metrics: not found (404): no spec-decode figures"]
    has_metrics = start is not None
    busy = _busy(start)
    if busy and not force:
        raise SparkstackError(f"server busy: {busy} when the bench started; their tokens would count as ours "
                              "(--force to bench anyway, every cell flagged server_busy)")
    if busy:
        warnings.append(f"server busy: {busy} when the bench started; every cell is flagged server_busy")
    progress = _Progress(plan.requests, on_progress)
    cells: list[Cell] = []
    for block in plan.blocks:
        try:
            progress.label = block.name
            batches = _run_block(plan, endpoint, block, 0, has_metrics, progress.tick)
            rerun = noisy(batches)
            if rerun:  # once more, from fresh rounds; still noisy then is a fault
                progress.planned += block.requests
                progress.label = f"{block.name} (rerun: noisy)"
                batches = _run_block(plan, endpoint, block, 1, has_metrics, progress.tick)
        except SparkstackError as exc:  # e.g. the server died: the finished cells are still measurements
            if not cells:
                raise
            return Report(plan.suite.version, plan.settings, tuple(cells), tuple(warnings), str(exc), plan.salt)
        flags = ([SERVER_BUSY] if busy else []) + ([NOISY] if rerun and noisy(batches) else [])
        cells.append(make_cell(block, batches, flags, rerun, plan.settings.temperature))
    return Report(plan.suite.version, plan.settings, tuple(cells), tuple(warnings), salt=plan.salt)


class _Progress:
    """Requests done of requests planned, told to the caller after each request."""

    def __init__(self, planned: int, report: Callable[[str, int, int], None] | None) -> None:
        self.planned, self.report = planned, report
        self.done = 0
        self.label = ""

    def tick(self) -> None:
        self.done += 1
        if self.report is not None:
            self.report(self.label, self.done, self.planned)


def _busy(scrape: metrics.Scrape | None) -> str:
    """'N requests running, M waiting' when the server is working already; '' when idle (or unknown)."""
    if scrape is None:
        return ""
    running, waiting = scrape.get(metrics.RUNNING) or 0, scrape.get(metrics.WAITING) or 0
    return f"{running:g} requests running, {waiting:g} waiting" if running or waiting else ""
