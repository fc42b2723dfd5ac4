"""issue 38: a rank that cannot be reached is never reported as stopped or absent (the real ssh and docker
clients, pointed at nothing: an ssh_config whose `Host *` is a closed port, a DOCKER_HOST nobody listens on)."""

from __future__ import annotations

import json
import socket

import pytest
from clirun import need


@pytest.fixture
def faults(tmp_path):
    need("ssh")
    need("docker")
    with socket.socket() as s:  # a port that was just free and is closed now: ssh is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "ssh_config"
    config.write_text(f"Host *\n  HostName 127.0.0.1\n  Port {port}\n  UserKnownHostsFile /dev/null\n")
    env = {"DOCKER_HOST": f"unix://{tmp_path}/nobody.sock", "WORKER_SSH": "user@worker-node", "HOME": str(tmp_path),
           "SPARKSTACK_STATE_DIR": str(tmp_path / "state")}
    return config, env


def test_stop_with_nothing_reachable_says_so_and_prints_the_manual_commands(faults, run_inproc):
    config, env = faults
    proc = run_inproc("launch", "stop", "--ssh-config", config, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "not there" not in proc.stdout and "removed" not in proc.stdout
    assert proc.stdout.count("could not reach") == 2, proc.stdout
    assert "stop it by hand: docker rm -f glm53-tony-rank0" in proc.stdout
    assert f"stop it by hand: ssh -F {config} user@worker-node docker rm -f glm53-tony-rank1" in proc.stdout
    assert "Traceback" not in proc.stderr and proc.stderr.strip().splitlines()[-1].startswith("sparkstack: error: ")


def test_stop_of_one_rank_touches_that_rank_only(faults, run_inproc):
    config, env = faults
    proc = run_inproc("launch", "1", "stop", "--ssh-config", config, env=env)
    assert proc.returncode == 1
    assert "rank 1 on user@worker-node: could not reach" in proc.stdout and "rank 0" not in proc.stdout + proc.stderr
    dry = run_inproc("launch", "1", "stop", "--dry-run", "--json", "--ssh-config", config, env=env, check=0)
    assert [step["rank"] for step in json.loads(dry.stdout)["would_run"]] == [1]


def test_status_says_could_not_reach_and_fails(faults, run_inproc):
    config, env = faults
    proc = run_inproc("launch", "status", "--json", "--ssh-config", config, env=env)
    assert proc.returncode == 1
    states = [row["state"] for row in json.loads(proc.stdout)["ranks"]]
    assert all(s.startswith("could not reach") for s in states), states


def test_probe_says_unreachable_not_absent(faults, run_inproc):
    config, env = faults
    proc = run_inproc("launch", "all", "--dry-run", "--probe", "--ssh-config", config, env=env)
    text = proc.stdout + proc.stderr
    assert "local unreachable" in text and "user@worker-node unreachable" in text
    assert "is not present" not in text


@pytest.mark.parametrize("words", [["stop", "stop"], ["status", "stop"], ["0", "status"], ["2", "stop"]])
def test_a_bad_target_and_action_is_one_usage_line(faults, run_inproc, words):
    config, env = faults
    proc = run_inproc("launch", *words, env=env)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_the_stop_before_a_relaunch_reaches_every_rank(faults, monkeypatch):
    """up and sweep stop the pair through a launch's own plan (not a `stop` verb's) before they start it again:
    that stop acts on every rank. It once acted on none, and the relaunch met its own running container."""
    from sparkstack.launch import command as launch_cmd
    from sparkstack.terminal import View

    config, env = faults
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    import os

    p = launch_cmd.plan(launch_cmd.Request(target="all", ssh_config=config), dict(os.environ))
    stopped = launch_cmd.stop(p, View())
    assert sorted(line.split(":", 1)[0] for line in stopped.failures) == ["rank 0 on local", "rank 1 on user@worker-node"]
