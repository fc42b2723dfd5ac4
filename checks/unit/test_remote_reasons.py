"""remote.unreachable_reason: the clause that says why docker did not answer names what the user must check, as
this run had it (the ssh_config it used, the DOCKER_HOST docker obeyed)."""

import shlex
import subprocess

from sparkstack.remote import Runner, unreachable_reason


def failed(code: int, stderr: str) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess(["x"], code, "", stderr)


def test_an_ssh_failure_names_the_test_command_with_this_runs_ssh_config(tmp_path):
    config = tmp_path / "my ssh config"
    reason = unreachable_reason(Runner(ssh="me@w", ssh_config=config), failed(255, "Connection refused\n"))
    assert f"check that `ssh -F {shlex.quote(str(config))} -o BatchMode=yes me@w true` works" in reason, reason
    assert "Connection refused" in reason
    plain = unreachable_reason(Runner(ssh="me@w"), failed(255, "Connection refused\n"))
    assert "`ssh -o BatchMode=yes me@w true`" in plain and "-F" not in plain


def test_a_local_docker_under_docker_host_names_it(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.9.9.9:2375")
    reason = unreachable_reason(Runner(), failed(1, "Cannot connect to the Docker daemon at tcp://10.9.9.9:2375\n"))
    assert "the docker host DOCKER_HOST=tcp://10.9.9.9:2375 names" in reason, reason
    monkeypatch.delenv("DOCKER_HOST")
    assert "dockerd on local runs" in unreachable_reason(Runner(), failed(1, "Cannot connect\n"))
