"""wait_running meets a container that already died: the lab saw this race under load (the worker printed its
fatal line and exited before launch first looked), and the user got "exited right after start" instead of the
diagnosis the boot wait gives. Here the container is dead at the first look, every time."""

import subprocess

import pytest

from sparkstack.launch.apply import LaunchFailed, Timeouts, wait_running
from sparkstack.launch.plan import RankPlan

FATAL_LINE = ("(Worker_TP1 pid=7) ERROR 12-01 10:00:05 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. "
              "Tried to allocate 2.00 GiB")


class DeadContainer:
    """A runner whose container has exited; its logs are given."""

    label = "worker"

    def __init__(self, logs: str) -> None:
        self.logs = logs

    def run_docker(self, *args, timeout=None):
        if args[0] == "inspect":
            return subprocess.CompletedProcess(args, 0, "exited 2026-12-01T10:00:00.000000000Z\n", "")
        if args[0] == "logs":
            stamped = "".join(f"2026-12-01T10:00:05.000000000Z {line}\n" for line in self.logs.splitlines())
            return subprocess.CompletedProcess(args, 0, stamped, "")
        raise AssertionError(args)


def rank() -> RankPlan:
    return RankPlan(rank=1, host="worker", ssh="worker", docker_host=None, name="glm53-tony-rank1",
                    fabric_ip="10.0.0.2", nic="enp1s0f1np1", hca="rocep1s0f1", hub="/hf/hub", docker_run=("docker",))


def test_a_container_dead_of_a_fatal_line_before_the_first_look_gets_the_diagnosis():
    with pytest.raises(LaunchFailed) as caught:
        wait_running(rank(), DeadContainer(f"INFO starting\n{FATAL_LINE}\n"), Timeouts())
    message = str(caught.value)
    assert message.startswith("rank 1: fatal boot line at 5"), message
    assert "out of memory" in message.lower()
    assert FATAL_LINE in caught.value.logs[1]


def test_a_container_dead_without_a_fatal_line_says_it_exited():
    with pytest.raises(LaunchFailed) as caught:
        wait_running(rank(), DeadContainer("INFO starting\n"), Timeouts())
    assert str(caught.value) == "rank 1 container glm53-tony-rank1 is exited right after start"
