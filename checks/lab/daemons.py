"""Real daemons for the tests, each tracked by its pidfile and stopped by PID.

dockerd is started with the flags LAB.md lists (no bridge, no iptables), its own
data root, exec root and socket, on a containerd of its own that is started and waited for
first, so it never touches a system daemon.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path


class DaemonError(RuntimeError):
    pass


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.1)
    tail = log.read_text()[-2000:] if log and log.exists() else ""
    raise DaemonError(f"{what} did not come up within {timeout:.0f} s\n{tail}")


def stop_pid(pid: int, timeout: float = 15, expect: bytes | None = None) -> None:
    """SIGTERM, then SIGKILL after `timeout`. With `expect`, only a process whose command line holds it: a pid read
    from a pidfile may by now be another process's (pid_max is 32768 here, and the suite starts thousands)."""
    if expect is not None and not cmdline_holds(pid, expect):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pid)
        if not pid_alive(pid):
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def cmdline_holds(pid: int, needle: bytes) -> bool:
    try:
        return needle in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _reap(pid: int) -> None:
    """Collect our own exited child, so it does not linger as a zombie that still answers kill(0)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


class Dockerd:
    """A private dockerd. `prefix` wraps the command (e.g. to enter a network namespace)."""

    def __init__(self, state: Path, prefix: list[str] | None = None) -> None:
        self.state = state
        self.socket = state / "docker.sock"
        self.pidfile = state / "docker.pid"
        self.log = state / "dockerd.log"
        self.containerd_socket = state / "containerd.sock"
        self.containerd_config = state / "containerd.toml"
        self.containerd_log = state / "containerd.log"
        self.containerd_pidfile = state / "containerd.pid"
        self.prefix = prefix or []
        self.proc: subprocess.Popen | None = None
        self.containerd_proc: subprocess.Popen | None = None

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout: float = 120) -> Dockerd:
        """containerd first, waited for here, then dockerd on it. A dockerd that starts its own containerd gives it a
        fixed few seconds and dies with "timeout waiting for containerd to start" on a loaded box (CI, 2026-12-02);
        `timeout` is only a bound on waiting."""
        dockerd, containerd = shutil.which("dockerd"), shutil.which("containerd")
        if dockerd is None or containerd is None:
            raise DaemonError("dockerd and containerd must be installed")
        for d in ("data", "exec", "containerd-root", "containerd-state"):
            (self.state / d).mkdir(parents=True, exist_ok=True)
        # no system config (/etc/containerd), no CRI plugin: what dockerd gives the containerd it manages
        self.containerd_config.write_text('version = 2\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n')
        with open(self.containerd_log, "wb") as log:
            self.containerd_proc = subprocess.Popen(
                self.prefix + [containerd, "--config", str(self.containerd_config), "--address",
                               str(self.containerd_socket), "--root", str(self.state / "containerd-root"),
                               "--state", str(self.state / "containerd-state")],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        wait_for(self.containerd_socket.exists, timeout, "containerd", self.containerd_proc, self.containerd_log)
        self.containerd_pidfile.write_text(f"{self.containerd_proc.pid}\n")  # what the lab's leftover checks read
        argv = [dockerd, "--storage-driver=overlay2", "--iptables=false", "--ip6tables=false", "--bridge=none",
                "--ip-forward=false", "--ip-masq=false", "--data-root", str(self.state / "data"),
                "--exec-root", str(self.state / "exec"), "-H", self.host, "--pidfile", str(self.pidfile),
                "--containerd", str(self.containerd_socket)]
        # dockerd joins containerd's namespaces: a prefix that makes a private mount namespace would make a second
        # one, where dockerd's overlay mounts are not runc's ("can't get final child's PID from pipe")
        joined = ["nsenter", "-t", str(self.containerd_proc.pid), "-m", "-n"] if self.prefix else []
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(joined + argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        wait_for(self._answers, timeout, "dockerd", self.proc, self.log)
        return self

    def _answers(self) -> bool:
        if not self.socket.exists():
            return False
        return subprocess.run(self.cli("version", "--format", "{{.Server.Version}}"), capture_output=True).returncode == 0

    def cli(self, *args: str) -> list[str]:
        return ["docker", "-H", self.host, *args]

    def run(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.cli(*args), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise DaemonError(f"docker {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def pid(self) -> int | None:
        try:
            return int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            # Our child's number only while it is unreaped: once waited for, it may be another process's.
            return self.proc.pid if self.proc and self.proc.poll() is None else None

    def containerd_pid(self) -> int | None:
        try:
            return int(self.containerd_pidfile.read_text().strip())
        except (OSError, ValueError):
            return self.containerd_proc.pid if self.containerd_proc and self.containerd_proc.poll() is None else None

    def stop(self) -> None:
        pid = self.pid()
        if pid:
            stop_pid(pid, expect=b"dockerd")
        if self.proc is not None and self.proc.poll() is None:
            stop_pid(self.proc.pid)
            self.proc.wait(timeout=30)
        pid = self.containerd_pid()  # after dockerd, which still talks to it while it stops
        if pid:
            stop_pid(pid, expect=b"containerd")
        if self.containerd_proc is not None and self.containerd_proc.poll() is None:
            stop_pid(self.containerd_proc.pid)
            self.containerd_proc.wait(timeout=30)
        self.containerd_pidfile.unlink(missing_ok=True)  # a second stop must signal no one
        # overlay2 leaves mounts under the data root when a container was killed hard.
        subprocess.run(["sh", "-c", f"grep -o ' {self.state}/[^ ]*' /proc/self/mounts | sort -r | xargs -r -n1 umount -l"],
                       capture_output=True)
