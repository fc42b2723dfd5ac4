"""`launch all --memory-guard[=GIB]`: MemFree polled from the launch process, the remedy only under the threshold.

End to end through the CLI with recording stand-ins (the worker through the ssh stand-in) and a head that answers
/health and one chat chunk; and the guard alone, with a recording runner and a clock of the test's own.
"""

import json
import os
import subprocess
from pathlib import Path

import hostfix
import pytest
import standins
from clirun import sparkstack_cmd
from headfix import free_port, serve
from sparkstack.launch.guard import MemoryGuard
from sparkstack.remote import Runner

MEM_FREE_KIB = hostfix.MEMINFO["MemFree"]
DROP, COMPACT = ["sysctl", "-w", "vm.drop_caches=3"], ["sysctl", "-w", "vm.compact_memory=1"]


def launch_all(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`launch all ARGS --json` against the stand-ins and a head that answers /health and one chat chunk."""
    port = free_port()
    server = serve(port, b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\ndata: [DONE]\n\n')
    standins.install(tmp_path / "bin")
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", RECORD_LOG=str(tmp_path / "head.jsonl"),
               STANDIN_REMOTE_RECORD_LOG=str(tmp_path / "worker.jsonl"), HF_HOME=str(hostfix.write_hub(tmp_path / "hf")),
               API_PORT=str(port), SPARKSTACK_STATE_DIR=str(tmp_path / "state"), VLLM_API_KEY="k", **(env or {}))
    try:
        return subprocess.run(sparkstack_cmd() + ["launch", "all", *args, "--json", "--host-root",
                                                  str(hostfix.write_host(tmp_path / "root")), "--worker-delay", "0",
                                                  "--health-interval", "0", "--health-attempts", "3"],
                              capture_output=True, text=True, env=env, timeout=120, check=False)
    finally:
        server.shutdown()


@pytest.mark.parametrize("guard,fires", [("--memory-guard=120", True), ("--memory-guard", False)])
def test_guard_acts_on_each_rank_under_the_threshold_and_not_above(tmp_path, guard, fires):
    """MemFree is 112.5 GiB (hostfix): under 120 GiB both ranks get a drop and a compaction; above 8 GiB nothing."""
    proc = launch_all(tmp_path, guard)
    assert proc.returncode == 0, proc.stderr
    fired = json.loads(proc.stdout)["memory_guard"]
    head = standins.recorded(tmp_path / "head.jsonl")
    worker = standins.recorded(tmp_path / "worker.jsonl")
    if fires:
        assert fired == [{"rank": 0, "mem_free": MEM_FREE_KIB * 1024}, {"rank": 1, "mem_free": MEM_FREE_KIB * 1024}]
        for ran in (head, worker):
            assert ran.index(["sync"]) < ran.index(DROP) < ran.index(COMPACT)
        assert "memory guard: rank 1: MemFree 112.5 GiB < 120 GiB" in proc.stderr
        # The acts happened during the boot: after the head's container started.
        assert next(i for i, c in enumerate(head) if c[:2] == ["docker", "run"]) < head.index(COMPACT)
    else:
        assert fired == [] and COMPACT not in head and COMPACT not in worker and DROP not in head + worker


@pytest.mark.parametrize("option", ["--drop-caches", "--memory-guard=120"])
def test_drop_caches_goes_through_sudo_n_where_the_user_is_not_root(tmp_path, option):
    """--drop-caches and the guard drop the page cache with the same code, and the same `sudo -n` (tune's too)."""
    proc = launch_all(tmp_path, option, env={"STANDIN_REMOTE_UID": "1000", "STANDIN_UID": "0"})
    assert proc.returncode == 0, proc.stderr
    head, worker = standins.recorded(tmp_path / "head.jsonl"), standins.recorded(tmp_path / "worker.jsonl")
    assert ["sudo", "-n", *DROP] in worker and ["sudo", "-n", "sync"] in worker
    assert DROP in head and not any(c[0] == "sudo" for c in head)  # root on the head: no sudo


class Recording(Runner):
    """A runner whose commands only get written down, all succeeding."""

    def run(self, argv, timeout=120, env=None, input=None):
        self.ran.append(list(argv))
        return subprocess.CompletedProcess(argv, 0, "", "")


def guard_over(tmp_path: Path, free_kib: int, threshold_gib: float, now: list[float]):
    root = hostfix.write_host(tmp_path / "root")
    (root / "proc/meminfo").write_text(hostfix.meminfo(MemFree=free_kib))
    runner = Recording()  # local: reads the host root's files itself
    object.__setattr__(runner, "ran", [])
    events: list[str] = []
    guard = MemoryGuard({0: runner}, str(root), int(threshold_gib * 2**30), deadline=100.0,
                        on_event=events.append, clock=lambda: now[0])
    return guard, runner, events


def test_guard_waits_after_acting_then_stops_at_its_deadline(tmp_path):
    now = [0.0]
    guard, runner, events = guard_over(tmp_path, free_kib=2 * 2**20, threshold_gib=8, now=now)  # 2 GiB free
    guard()
    assert runner.ran == [["sync"], DROP, COMPACT]
    now[0] = 1.0
    guard()  # still low, but it just acted: give the loader time
    assert runner.ran == [["sync"], DROP, COMPACT]
    now[0] = 60.0
    guard()
    assert runner.ran == [["sync"], DROP, COMPACT] * 2
    now[0] = 100.0
    guard()
    guard()
    assert len(runner.ran) == 6 and events[-1].startswith("memory guard: deadline reached after acting 2 time(s)")
    assert len([e for e in events if "deadline" in e]) == 1


def test_guard_leaves_a_rank_with_enough_free_memory_alone(tmp_path):
    guard, runner, events = guard_over(tmp_path, free_kib=9 * 2**20, threshold_gib=8, now=[0.0])
    guard()
    assert runner.ran == [] and events == [] and guard.fired == []
