"""The two-host lab: a head and a worker as network namespaces on this machine.

- fabric: a veth pair named enp1s0f1np1 at both ends (like the CX7 port), 10.0.0.1 <-> 10.0.0.2
- management: a second veth pair (mgmt0), which ssh uses, so the fabric can go down in a test
- one dockerd per host, each with its own root and socket, started so the cgroup mounts stay visible
- sshd on the worker: its own host key, key-only auth; a client config with StrictHostKeyChecking yes

Every process is tracked by its pidfile and stopped by PID; namespaces and mounts are removed on stop.
All addresses live only inside namespaces this lab creates.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from daemons import DaemonError, Dockerd, pid_alive, stop_pid, wait_for

FABRIC_IF = "enp1s0f1np1"
MGMT_IF = "mgmt0"
FABRIC = {"head": "10.0.0.1", "worker": "10.0.0.2"}
MGMT = {"head": "192.168.250.1", "worker": "192.168.250.2"}


def sh(*argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        raise DaemonError(f"{shlex.join(argv)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


@dataclass
class Host:
    name: str
    netns: str
    fabric_ip: str
    mgmt_ip: str
    state: Path
    dockerd: Dockerd | None = None

    @property
    def nsenter(self) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.netns}"]

    def run(self, *argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        """Run a command inside this host's network namespace, with its own /sys/class/net.

        (`ip netns exec` remounts /sys; fine for commands, not for dockerd: see _in_netns_with_own_sysfs.)
        """
        return sh("ip", "netns", "exec", self.netns, *argv, check=check, **kw)

    def docker(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        return self.dockerd.run(*args, check=check, timeout=timeout)


def state_dir(tag: str) -> Path:
    """Daemon state lives in a short path: unix socket paths must stay under ~100 characters."""
    return Path("/tmp") / f"ssk-{tag}"


@dataclass
class Lab:
    root: Path  # for the tests' own files
    tag: str = field(default_factory=lambda: f"{os.getpid()}")
    hosts: dict[str, Host] = field(default_factory=dict)
    ssh_config: Path | None = None
    sshd_pidfile: Path | None = None
    startup_s: float = 0.0

    @property
    def state(self) -> Path:
        return state_dir(self.tag)

    @property
    def ssh_dir(self) -> Path:
        return self.state / "ssh"

    @property
    def head(self) -> Host:
        return self.hosts["head"]

    @property
    def worker(self) -> Host:
        return self.hosts["worker"]

    def start(self) -> Lab:
        t0 = time.monotonic()
        self.root.mkdir(parents=True, exist_ok=True)
        for name in ("head", "worker"):
            state = self.state / name
            state.mkdir(parents=True, exist_ok=True)
            self.hosts[name] = Host(name, f"ssk-{name}-{self.tag}", FABRIC[name], MGMT[name], state)
        h, w = self.head, self.worker
        for host in (h, w):
            sh("ip", "netns", "add", host.netns)
        sh("ip", "link", "add", FABRIC_IF, "netns", h.netns, "type", "veth", "peer", "name", FABRIC_IF, "netns", w.netns)
        sh("ip", "link", "add", MGMT_IF, "netns", h.netns, "type", "veth", "peer", "name", MGMT_IF, "netns", w.netns)
        for host in (h, w):
            host.run("ip", "link", "set", "lo", "up")
            host.run("ip", "addr", "add", f"{host.fabric_ip}/24", "dev", FABRIC_IF)
            host.run("ip", "addr", "add", f"{host.mgmt_ip}/24", "dev", MGMT_IF)
            host.run("ip", "link", "set", FABRIC_IF, "up")
            host.run("ip", "link", "set", MGMT_IF, "up")
        for host in (h, w):
            host.dockerd = Dockerd(host.state / "docker", prefix=self._in_netns_with_own_sysfs(host))
            host.dockerd.start()
        self._start_sshd()
        self.startup_s = time.monotonic() - t0
        return self

    def _in_netns_with_own_sysfs(self, host: Host) -> list[str]:
        """Enter the host's netns in a private mount namespace whose /sys/class/net shows that netns.

        `ip netns exec` would remount all of /sys and hide the cgroup mounts dockerd needs.
        """
        sysfs = host.state / "sysfs"
        sysfs.mkdir(exist_ok=True)
        script = ('mount -t sysfs sysfs "$0" && mount --bind "$0/class/net" /sys/class/net && '
                  'mount --bind "$0/devices/virtual/net" /sys/devices/virtual/net && exec "$@"')
        return [*host.nsenter, "unshare", "-m", "--propagation", "private", "sh", "-c", script, str(sysfs)]

    def _start_sshd(self) -> None:
        w = self.worker
        d = self.ssh_dir
        d.mkdir(exist_ok=True)
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key"))
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "client_key"))
        shutil.copy(d / "client_key.pub", d / "authorized_keys")
        self.sshd_pidfile = d / "sshd.pid"
        (d / "sshd_config").write_text(
            f"ListenAddress {w.mgmt_ip}\nPort 22\nHostKey {d / 'host_key'}\nPidFile {self.sshd_pidfile}\n"
            f"AuthorizedKeysFile {d / 'authorized_keys'}\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PubkeyAuthentication yes\nPermitRootLogin prohibit-password\nUsePAM no\nStrictModes no\n"
            "Subsystem sftp internal-sftp\n")
        host_pub = (d / "host_key.pub").read_text().split()
        (d / "known_hosts").write_text(f"{w.mgmt_ip} {host_pub[0]} {host_pub[1]}\n")
        self.ssh_config = d / "ssh_config"
        self.ssh_config.write_text(
            f"Host worker {w.mgmt_ip}\n  HostName {w.mgmt_ip}\n  User root\n  IdentityFile {d / 'client_key'}\n"
            f"  IdentitiesOnly yes\n  UserKnownHostsFile {d / 'known_hosts'}\n  GlobalKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking yes\n  BatchMode yes\n  ConnectTimeout 5\n")
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation dir
        w.run(shutil.which("sshd") or "/usr/sbin/sshd", "-f", str(d / "sshd_config"), "-E", str(d / "sshd.log"))
        wait_for(lambda: self.sshd_pidfile.exists(), 10, "sshd", log=d / "sshd.log")
        wait_for(lambda: self.ssh("true", check=False).returncode == 0, 15, "ssh to the worker", log=d / "sshd.log")

    def ssh(self, *remote: str, check: bool = True, config: Path | None = None) -> subprocess.CompletedProcess:
        """ssh from the head to the worker, over management, with the lab's strict client config."""
        return self.head.run("ssh", "-F", str(config or self.ssh_config), "worker", shlex.join(remote), check=check)

    def pids(self) -> list[int]:
        found = []
        for pidfile in [self.sshd_pidfile] + [h.dockerd.pidfile for h in self.hosts.values() if h.dockerd]:
            try:
                found.append(int(pidfile.read_text().strip()))
            except (OSError, ValueError, AttributeError):
                pass
        return found

    def stop(self) -> None:
        if self.sshd_pidfile is not None:
            try:
                stop_pid(int(self.sshd_pidfile.read_text().strip()))
            except (OSError, ValueError):
                pass
        for host in self.hosts.values():
            if host.dockerd is not None:
                host.dockerd.stop()
        for host in self.hosts.values():
            sh("ip", "netns", "delete", host.netns, check=False)  # takes its veth ends with it
        shutil.rmtree(self.state, ignore_errors=True)


def lab_leftovers(tag: str, pids: list[int] = ()) -> list[str]:
    """What a stopped lab must not leave: its namespaces, mounts, state dir, or live daemons."""
    left = []
    netns = sh("ip", "netns", "list", check=False).stdout
    left += [line.split()[0] for line in netns.splitlines() if line.split() and line.split()[0].endswith(f"-{tag}")]
    state = state_dir(tag)
    left += [m for m in Path("/proc/self/mounts").read_text().splitlines() if f" {state}" in m]
    if state.exists():
        left.append(f"state dir {state}")
    left += [f"pid {pid}" for pid in pids if pid_alive(pid)]
    return left
