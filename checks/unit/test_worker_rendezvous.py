"""launch.apply.wait_for_workers: the pause before the head ends when every worker has said it is at the
rendezvous (vLLM's headless line), or stopped running, and at the latest after --worker-delay."""

import subprocess

import pytest

from sparkstack.launch import apply
from sparkstack.launch.plan import plan_launch_from_recipe
from sparkstack.recipe import load_recipe

# vLLM 0.32's line, as run_headless logs it (vllm/entrypoints/cli/serve.py), with the logger's prefix
HEADLESS = ("INFO 12-07 09:30:01 [serve.py:225] Launching vLLM (v0.32.0) headless multiproc executor, with head "
            "node address 10.0.0.1:29521 for torch.distributed process group.\n")


class Worker:
    """A worker's docker as the head's runner sees it: its logs poll by poll, and its container's state."""

    def __init__(self, logs: list[str], state: str = "running"):
        self.logs, self.state, self.polls = logs, state, 0

    def run_docker(self, *args, timeout=120):
        if args[0] == "logs":
            text = self.logs[min(self.polls, len(self.logs) - 1)]
            self.polls += 1
            return subprocess.CompletedProcess(args, 0, text, "")
        assert args[0] == "inspect", args
        return subprocess.CompletedProcess(args, 0, f"{self.state} 2026-12-07T09:30:00Z\n", "")


@pytest.fixture
def clock(monkeypatch):
    """Time moves only when the code sleeps: the test counts the seconds waited, not the machine's."""
    now = [0.0]
    monkeypatch.setattr(apply.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(apply.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    return now


def rank_1():
    return plan_launch_from_recipe(load_recipe(None), {}).ranks[1]


def test_the_head_starts_once_the_worker_says_it_is_at_the_rendezvous(clock):
    worker, events = Worker(["loading\n", "loading\n", "loading\n" + HEADLESS]), []
    apply.wait_for_workers([rank_1()], {1: worker}, 20.0, events.append)
    assert clock[0] == 2.0 and worker.polls == 3  # two one-second polls, then the line
    assert events[-1] == "rank 1 is at the rendezvous after 2.0 s"


def test_a_worker_that_never_says_so_gets_the_full_delay_and_the_head_starts(clock):
    events = []
    apply.wait_for_workers([rank_1()], {1: Worker(["still importing\n"])}, 20.0, events.append)
    assert clock[0] == 20.0
    assert events[-1] == "rank(s) 1 did not say within 20 s; starting the head"


def test_a_worker_that_stopped_is_not_waited_for(clock):
    events = []
    apply.wait_for_workers([rank_1()], {1: Worker(["Traceback\n"], state="exited")}, 20.0, events.append)
    assert clock[0] == 0.0 and len(events) == 1  # the boot watch names the stopped rank, with its logs
