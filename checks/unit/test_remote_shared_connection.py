"""A run's short ssh commands to one host share one connection (ControlMaster), in a private directory, and the
master is closed when the run ends. Bulk transfers and local commands never share."""

import os
import shutil
import socket
import stat
import tempfile
from pathlib import Path

import pytest

from sparkstack import remote
from sparkstack.remote import Runner


def option(argv: list[str], name: str) -> str | None:
    values = [argv[i + 1].split("=", 1)[1] for i, a in enumerate(argv[:-1])
              if a == "-o" and argv[i + 1].startswith(name + "=")]
    assert len(values) <= 1, values
    return values[0] if values else None


@pytest.fixture
def runtime_dir(monkeypatch):
    """A short XDG_RUNTIME_DIR, as systemd's /run/user/UID is (a unix socket's path has under 108 bytes)."""
    short = Path(tempfile.mkdtemp(prefix="ssk-", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short))
    monkeypatch.setattr(remote, "_masters", {})
    yield short
    shutil.rmtree(short)


def test_a_remote_runners_commands_share_one_master_in_a_private_directory(runtime_dir, tmp_path):
    config = tmp_path / "ssh_config"
    argv = Runner(ssh="worker", ssh_config=config).argv(["docker", "ps"])
    assert option(argv, "ControlMaster") == "auto" and option(argv, "ControlPersist") == "60"
    path = option(argv, "ControlPath")
    where = runtime_dir / f"sparkstack-ssh-{os.geteuid()}"
    assert os.path.dirname(path) == str(where)
    assert stat.S_IMODE(os.lstat(where).st_mode) == 0o700
    # the far end's command is still the last word, after `--`
    assert argv[-3:] == ["worker", "--", "docker ps"]
    # the same target through the same config: the same socket; another config, target or address: another one
    assert option(Runner(ssh="worker", ssh_config=config).argv(["true"]), "ControlPath") == path
    others = [Runner(ssh="worker", ssh_config=tmp_path / "other"), Runner(ssh="spark-2", ssh_config=config),
              Runner(ssh="worker", ssh_config=config).via("10.0.0.2", "worker")]
    assert len({path, *(option(r.argv(["true"]), "ControlPath") for r in others)}) == 4


def test_a_runtime_directory_too_deep_for_a_socket_path_shares_nothing(monkeypatch, tmp_path):
    deep = tmp_path / ("d" * 80)
    deep.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(deep))
    argv = Runner(ssh="worker").argv(["true"])
    assert option(argv, "ControlPath") is None and "BatchMode=yes" in argv


def test_bulk_transfers_and_local_commands_never_share(runtime_dir):
    assert option(Runner(ssh="worker", bulk=True).argv(["cat"]), "ControlMaster") is None
    assert Runner().argv(["docker", "ps"]) == ["docker", "ps"]


@pytest.mark.parametrize("mode", [0o755, 0o777])
def test_a_socket_directory_others_can_open_is_not_used(runtime_dir, mode):
    """Whoever can reach a control socket runs commands on the host as this user."""
    where = runtime_dir / f"sparkstack-ssh-{os.geteuid()}"
    where.mkdir()
    where.chmod(mode)
    argv = Runner(ssh="worker").argv(["true"])
    assert option(argv, "ControlMaster") is None and option(argv, "ControlPath") is None
    assert "BatchMode=yes" in argv  # the command still runs, on a connection of its own


def test_a_socket_directory_that_is_a_link_is_not_used(runtime_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (runtime_dir / f"sparkstack-ssh-{os.geteuid()}").symlink_to(elsewhere)
    assert option(Runner(ssh="worker").argv(["true"]), "ControlPath") is None


def test_at_exit_each_open_master_is_told_to_exit_and_no_other(runtime_dir, monkeypatch):
    ran = []
    monkeypatch.setattr(remote.subprocess, "run", lambda argv, **kw: ran.append(argv))
    open_one = option(Runner(ssh="worker").argv(["true"]), "ControlPath")
    option(Runner(ssh="spark-2").argv(["true"]), "ControlPath")  # its master never came up: no socket
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(open_one)
    try:
        remote.close_shared()
    finally:
        listener.close()
    assert len(ran) == 1
    assert ran[0][0] == "ssh" and ran[0][-4:] == ["-O", "exit", "--", "worker"]
    assert option(ran[0], "ControlPath") == open_one
    remote.close_shared()  # once only
    assert len(ran) == 1


def test_each_run_has_a_master_of_its_own(runtime_dir, monkeypatch):
    """A `launch status` ending beside a `launch` in its boot watch must not close the connection launch uses."""
    mine = option(Runner(ssh="worker").argv(["true"]), "ControlPath")
    monkeypatch.setattr(remote.os, "getpid", lambda: 999999)
    assert option(Runner(ssh="worker").argv(["true"]), "ControlPath") != mine


@pytest.mark.parametrize("name", ['a"b', "a'b", "a${HOME}b", "a%hb", "a b", "a~b"])
def test_a_runtime_directory_ssh_would_expand_or_unquote_shares_nothing(monkeypatch, name):
    base = Path(tempfile.mkdtemp(prefix="ssk-", dir="/tmp"))
    try:
        odd = base / name
        odd.mkdir(mode=0o700)
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(odd))
        argv = Runner(ssh="worker").argv(["true"])
        assert option(argv, "ControlPath") is None and "BatchMode=yes" in argv
    finally:
        shutil.rmtree(base)


def test_a_runtime_directory_that_is_not_this_users_own_is_passed_over(monkeypatch, tmp_path):
    """After `su`, XDG_RUNTIME_DIR may still name the other user's: its owner could swap the socket directory."""
    shared = Path(tempfile.mkdtemp(prefix="ssk-", dir="/tmp"))
    try:
        shared.chmod(0o777)
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(shared))
        monkeypatch.setattr(remote.tempfile, "gettempdir", lambda: str(shared.parent))
        path = option(Runner(ssh="worker").argv(["true"]), "ControlPath")
        assert path is not None and not path.startswith(str(shared) + "/")
        assert os.path.dirname(path) == f"{shared.parent}/sparkstack-ssh-{os.geteuid()}"
    finally:
        shutil.rmtree(shared)
