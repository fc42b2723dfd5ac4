"""The optional boot memory guard (`launch all --memory-guard[=GIB]`).

While the ranks boot, the launch process itself polls each rank's MemFree (the worker's over ssh, with a
read-only `grep` of /proc/meminfo), and where it is under the threshold drops the page cache (launch's drop-caches code) and
compacts memory on that rank. It runs only from the boot watch's rounds, so it stops at readiness, at a
failure or at its deadline, and nothing of it is ever left running on a worker.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sparkstack.errors import SparkstackError
from sparkstack.remote import Runner, failure_line
from sparkstack.tune.facts import read_meminfo
from sparkstack.units import GIB
from sparkstack.tune.pagecache import drop_page_cache

COMPACT = ("sysctl", "-w", "vm.compact_memory=1")
COOLDOWN_S = 30.0  # after acting on a rank, let the loader run before judging that rank again
DEADLINE_S = 1800.0  # twice a cold boot (about 15 min): by then the engine holds its memory, or the boot has failed


@dataclass
class MemoryGuard:
    runners: dict[int, Runner]  # the ranks being booted
    host_root: str
    threshold_bytes: int
    deadline: float  # on `clock`
    on_event: Callable[[str], None]
    clock: Callable[[], float] = time.monotonic
    fired: list[dict] = field(default_factory=list)
    off: set[int] = field(default_factory=set)  # ranks the guard gave up on (one line said why)
    _last: dict[int, float] = field(default_factory=dict)
    _done: bool = False

    def __call__(self) -> None:
        """One round: every rank's MemFree, and the remedy where it is low."""
        now = self.clock()
        if self._done:
            return
        if now >= self.deadline:
            self._done = True
            self.on_event(f"memory guard: deadline reached after acting {len(self.fired)} time(s); stopped")
            return
        for rank, runner in sorted(self.runners.items()):
            if rank in self.off or now - self._last.get(rank, -COOLDOWN_S) < COOLDOWN_S:
                continue
            free = read_meminfo(runner, self.host_root).free
            if free is None:
                self._give_up(rank, f"cannot read MemFree on {runner.label}")
            elif free < self.threshold_bytes:
                self._act(rank, runner, free, now)

    def _give_up(self, rank: int, why: str) -> None:
        self.off.add(rank)
        self.on_event(f"memory guard: rank {rank}: {why}; not guarding it")

    def _act(self, rank: int, runner: Runner, free: int, now: float) -> None:
        self._last[rank] = now
        failed = drop_page_cache(runner)
        if failed is None:
            proc = runner.run_as_root(list(COMPACT), timeout=300)
            failed = (list(COMPACT), proc) if proc.returncode != 0 else None
        if failed:
            argv, proc = failed
            self._give_up(rank, f"`{' '.join(argv)}` failed on {runner.label}: {failure_line(proc)}")
            return
        self.fired.append({"rank": rank, "mem_free": free})
        self.on_event(f"memory guard: rank {rank}: MemFree {free / GIB:.1f} GiB < {self.threshold_bytes / GIB:g} GiB: "
                      "page cache dropped, memory compacted")


def memory_guard(runners: dict[int, Runner], ranks: list[int], host_root: str, threshold_gib: float,
                 on_event: Callable[[str], None], deadline_s: float = DEADLINE_S) -> MemoryGuard:
    """A guard over `ranks`, acting as root (`sudo -n` where the user is not), for `deadline_s` from now."""
    guarded = {}
    guard = MemoryGuard(guarded, host_root, int(threshold_gib * GIB), time.monotonic() + deadline_s, on_event)
    for rank in ranks:
        try:
            guarded[rank] = runners[rank].for_root()
        except SparkstackError as exc:
            guard._give_up(rank, str(exc))
    return guard
