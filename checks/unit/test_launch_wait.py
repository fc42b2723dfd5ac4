"""wait_running meets a container that already died: the lab saw this race under load (the worker printed its
fatal line and exited before launch first looked), and the user got "exited right after start" instead of the
diagnosis the boot wait gives. Here the container is dead at the first look, every time."""

import os
import signal
import subprocess

import hostfix
import pytest
import standins
from clirun import sparkstack_cmd, start
from headfix import free_port
from inprocess_engine import wait_for

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


class AbsentContainer(DeadContainer):
    """A runner whose container is gone (removed by --rm, or never created): docker knows no such object."""

    looks = 0

    def run_docker(self, *args, timeout=None):
        if args[0] == "inspect":
            self.looks += 1
            assert self.looks <= 2, "a container that is absent was waited for, look after look"
            return subprocess.CompletedProcess(args, 1, "", f"Error: No such object: {args[-1]}\n")
        if args[0] == "logs":
            return subprocess.CompletedProcess(args, 1, "", f"Error: No such container: {args[-1]}\n")
        raise AssertionError(args)


def test_a_container_absent_right_after_start_is_said_at_once():
    with pytest.raises(LaunchFailed) as caught:
        wait_running(rank(), AbsentContainer(""), Timeouts(worker_start_s=3600))
    assert str(caught.value) == "rank 1 container glm53-tony-rank1 is not there right after start"


class RunningContainer(DeadContainer):
    """A runner whose container is up, printing the given logs."""

    def run_docker(self, *args, timeout=None):
        if args[0] == "inspect":
            return subprocess.CompletedProcess(args, 0, "running 2026-12-01T10:00:00.000000000Z\n", "")
        return super().run_docker(*args, timeout=timeout)


@pytest.mark.parametrize("fatal_rank", [0, 1])
def test_a_fatal_line_on_any_rank_ends_the_boot_wait_with_its_diagnosis(fatal_rank):
    """An NCCL error or an OOM on the worker is as fatal as on the head: no hour of waiting on /health."""
    from sparkstack.launch.apply import watch_boot
    from sparkstack.launch.plan import plan_launch_from_recipe
    from sparkstack.recipe import load_recipe

    plan = plan_launch_from_recipe(load_recipe("glm53-flash-dflash2-nvfp4"), {})
    runners = {r.rank: RunningContainer(f"INFO starting\n{FATAL_LINE if r.rank == fatal_rank else ''}\n")
               for r in plan.ranks}
    with pytest.raises(LaunchFailed) as caught:
        watch_boot(plan, runners, Timeouts(health_interval_s=0, health_attempts=1), None, lambda line: None)
    assert str(caught.value).startswith(f"rank {fatal_rank}: fatal boot line at ")
    assert "out of memory" in str(caught.value).lower()
    assert FATAL_LINE in caught.value.logs[fatal_rank]


# ---------------------------------------------------------------- the boot wait of `launch all`, stopped


@pytest.mark.parametrize("sig,code,by", [(signal.SIGINT, 130, ""), (signal.SIGTERM, 143, " by SIGTERM"),
                                         (signal.SIGHUP, 129, " by SIGHUP")], ids=["ctrl-c", "term", "hup"])
def test_a_stop_signal_in_the_boot_wait_ends_launch_as_ctrl_c_does(tmp_path, sig, code, by):
    """Both ranks started, the head never healthy: launch waits on /health. Ctrl-C, `kill` or a hangup there end it
    in one line with 128 + the signal's number, and leave the containers to boot (`launch stop` removes them)."""
    standins.install(tmp_path / "bin")
    head_log = tmp_path / "head.jsonl"
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", RECORD_LOG=str(head_log),
               STANDIN_REMOTE_RECORD_LOG=str(tmp_path / "worker.jsonl"), HF_HOME=str(hostfix.write_hub(tmp_path / "hf")),
               API_PORT=str(free_port()), SPARKSTACK_STATE_DIR=str(tmp_path / "state"), VLLM_API_KEY="k")
    proc = start(sparkstack_cmd() + ["launch", "all", "--host-root", str(hostfix.write_host(tmp_path / "root")),
                                     "--worker-delay", "0", "--health-interval", "0.1", "--health-attempts", "100000",
                                     "--no-gates"],  # its gates would run containers of their own before the boot
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        started = lambda: head_log.exists() and any(c[:2] == ["docker", "run"] for c in standins.recorded(head_log))  # noqa: E731
        wait_for("the head's container started", lambda: started() or proc.poll() is not None)
        proc.send_signal(sig)
        err = proc.communicate(timeout=60)[1]
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (f"sparkstack: interrupted{by} (outputs are published atomically: "
                                    "nothing half-written)")
    ran = standins.recorded(head_log) + standins.recorded(tmp_path / "worker.jsonl")
    assert [c[1] for c in ran if c[0] == "docker" and c[1] in ("run", "rm")] == ["run", "run"]


# ---------------------------------------------------------------- how often the boot watch reads the ranks' logs


class LateFatalLine(RunningContainer):
    """Up and quiet for its first `quiet_looks` reads of its logs, then printing the fatal line."""

    def __init__(self, quiet_looks: int) -> None:
        super().__init__("INFO starting\n")
        self.quiet_looks, self.looks = quiet_looks, 0

    def run_docker(self, *args, timeout=None):
        if args[0] == "logs":
            self.looks += 1
            self.logs = "INFO starting\n" + (FATAL_LINE + "\n" if self.looks > self.quiet_looks else "")
        return super().run_docker(*args, timeout=timeout)


def test_a_young_boots_fatal_line_is_read_at_the_next_health_poll_not_seconds_later(monkeypatch):
    """A boot that dies in its first seconds (a wrong NIC, an OOM at load) is the common failure: the logs are read
    at every health poll while the boot is young, so its diagnosis comes one poll later, not after a fixed pause."""
    from sparkstack.launch import apply
    from sparkstack.launch.plan import plan_launch_from_recipe
    from sparkstack.recipe import load_recipe

    clock = {"now": 1000.0}
    monkeypatch.setattr(apply.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(apply.time, "sleep", lambda s: clock.__setitem__("now", clock["now"] + s))
    monkeypatch.setattr(apply, "head_health_code", lambda plan: 503)
    monkeypatch.setattr(apply, "_port_open", lambda port: False)
    plan = plan_launch_from_recipe(load_recipe("glm53-flash-dflash2-nvfp4"), {})
    runners = {0: RunningContainer("INFO starting\n"), 1: LateFatalLine(quiet_looks=1)}
    with pytest.raises(LaunchFailed) as caught:
        apply.watch_boot(plan, runners, Timeouts(health_interval_s=0.5, health_attempts=100), None, lambda line: None)
    assert str(caught.value).startswith("rank 1: fatal boot line at ")
    # its first look found nothing; the line is there at the second, one 0.5 s poll later (a 3 s pause is 6 polls)
    assert clock["now"] - 1000.0 == pytest.approx(0.5)


@pytest.mark.parametrize("age,interval,gap", [
    (0.0, 0.5, 0.5),    # a young boot: every poll
    (5.0, 0.3, 0.5),    # a tenth of its age once that is longer than the poll
    (20.0, 1.0, 2.0),
    (45.0, 1.0, 3.0),   # an old boot (vLLM's CPU build reaches /health at about 45 s): at most 3 s apart
    (600.0, 0.3, 3.0),
    (0.0, 20.0, 3.0),   # a poll slower than the cap: the cap (the watch sleeps the poll anyway)
])
def test_the_looks_spread_out_as_the_boot_ages(age, interval, gap):
    from sparkstack.launch.apply import next_look_gap

    assert next_look_gap(age, interval) == pytest.approx(gap)
