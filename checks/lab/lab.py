"""The two-host lab: a head and a worker as network namespaces on this machine.

- fabric: a veth pair named enp1s0f1np1 at both ends (like the CX7 port), 10.0.0.1 <-> 10.0.0.2
- management: a second veth pair (mgmt0), which ssh uses, so the fabric can go down in a test
- one dockerd per host, each with its own root and socket, started so the cgroup mounts stay visible
- sshd on the worker, on its management and its fabric address: its own host key, key-only auth; a
  client config with StrictHostKeyChecking yes

A worker is a second machine, not a second view of this one: its sshd, everything sshd starts, and its
dockerd share one mount namespace of their own, where root's HOME (/root) is a private, size-limited
tmpfs (so "already there" means there, and a full disk can be made), with its own /sys/class/net, and,
for a worker made without docker, no docker client on PATH. More workers can be added (`add_worker`),
each with its own pair of veths to the head and its own addresses.

Every process is tracked by its pidfile and stopped by PID; namespaces and mounts are removed on stop.
All addresses live only inside namespaces this lab creates.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from daemons import DaemonError, Dockerd, cmdline_holds, pid_alive, stop_pid, wait_for

FABRIC_IF = "enp1s0f1np1"
MGMT_IF = "mgmt0"
FABRIC = {"head": "10.0.0.1", "worker": "10.0.0.2"}
MGMT = {"head": "192.168.250.1", "worker": "192.168.250.2"}
WORKER_HOME = "/root"  # root's HOME, as sshd sets it; a private tmpfs inside each worker
DEFAULT_HOME_MIB = int(os.environ.get("SPARKSTACK_LAB_HOME_MIB", "512"))
# Each host's own shared memory (its own IPC namespace and /dev/shm), as two machines have: with one machine's
# /dev/shm seen by both, vLLM's ranks (`docker run --ipc host`) find each other's segments, take themselves for one
# node, and the tensor-parallel boot hangs after the rendezvous.
OWN_SHM = "mount -t tmpfs -o mode=1777,size=4g sparkstack-lab-shm /dev/shm"


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
    head_fabric_if: str = FABRIC_IF  # the head's end of this worker's links
    head_mgmt_if: str = MGMT_IF
    home_mib: int = 0  # size of the worker's private HOME
    sshd_pidfile: Path | None = None  # the worker's sshd also holds its mount namespace

    @property
    def nsenter(self) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.netns}"]

    def sshd_pid(self) -> int | None:
        try:
            return int(self.sshd_pidfile.read_text().strip())
        except (OSError, ValueError, AttributeError):
            return None

    def machine(self, *argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        """Run a command on the worker as the worker sees itself: its network and its mounts (its HOME)."""
        return sh("nsenter", "-t", str(self.sshd_pid()), "-m", "-n", *argv, check=check, **kw)

    @property
    def home_mount(self) -> Path:
        """Where the worker's HOME tmpfs is mounted out here (the lab's view of that machine's disk)."""
        return self.state / "home"

    def path(self, inside: str | Path) -> Path:
        """A path on the worker, as a plain path here: under its HOME, through the tmpfs's outside mount."""
        rel = Path(inside).relative_to(WORKER_HOME)
        return self.home_mount / rel

    @contextmanager
    def left_as_found(self):
        """Whatever a test writes under this worker's HOME, and every image it loads into its dockerd, is removed
        afterwards: the lab is shared by every lab test, its HOME is a small tmpfs (one test's leftovers are the
        next one's full disk), and an image already held is a ship with nothing to send."""
        before = _paths_under(self.home_mount)
        images = self._image_ids()
        try:
            yield
        finally:
            if self.dockerd is not None:
                for image in sorted(self._image_ids() - images):
                    self.docker("image", "rm", "--force", image, check=False)
            for path in sorted(_paths_under(self.home_mount) - before, reverse=True):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)

    def _image_ids(self) -> set[str]:
        if self.dockerd is None:
            return set()
        return set(self.docker("image", "ls", "--all", "--quiet", "--no-trunc").stdout.split())

    def run(self, *argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        """Run a command inside this host's network namespace, with its own /sys/class/net.

        (`ip netns exec` remounts /sys; fine for commands, not for dockerd: see _in_netns_with_own_sysfs.)
        """
        return sh("ip", "netns", "exec", self.netns, *argv, check=check, **kw)

    def docker(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        return self.dockerd.run(*args, check=check, timeout=timeout)


def _paths_under(root: Path) -> set[Path]:
    return {Path(d, n) for d, dirs, files in os.walk(root) for n in dirs + files}


def state_dir(tag: str) -> Path:
    """Daemon state lives in a short path: unix socket paths must stay under ~100 characters."""
    return Path("/tmp") / f"ssk-{tag}"


def new_tag() -> str:
    """pid plus a random part: a parallel lab, or a stale one from a reused pid, never shares a name."""
    return f"{os.getpid()}{secrets.token_hex(2)}"


@dataclass
class Lab:
    root: Path  # for the tests' own files
    tag: str = field(default_factory=new_tag)
    hosts: dict[str, Host] = field(default_factory=dict)
    ssh_config: Path | None = None
    startup_s: float = 0.0
    home_mib: int = DEFAULT_HOME_MIB

    @property
    def sshd_pidfile(self) -> Path | None:
        return self.hosts["worker"].sshd_pidfile if "worker" in self.hosts else None

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
        self._prepare_ssh()
        state = self.state / "head"
        state.mkdir(parents=True, exist_ok=True)
        h = self.hosts["head"] = Host("head", f"ssk-head-{self.tag}", FABRIC["head"], MGMT["head"], state)
        sh("ip", "netns", "add", h.netns)
        h.run("ip", "link", "set", "lo", "up")
        h.dockerd = Dockerd(h.state / "docker", prefix=self._in_netns_with_own_sysfs(h))
        h.dockerd.start()
        self.add_worker("worker", docker=True, home_mib=self.home_mib)
        self.startup_s = time.monotonic() - t0
        return self

    def add_worker(self, name: str, docker: bool = True, home_mib: int | None = None) -> Host:
        """A worker machine: its own namespaces, veths to the head, sshd, private HOME and (unless not) dockerd.

        The first worker gets the production names and addresses (enp1s0f1np1 at both ends, 10.0.0.2);
        the n-th gets its own /24s, and head-side links named after it."""
        n = len([x for x in self.hosts if x != "head"])
        if n == 0:
            fabric, mgmt, head_fab, head_mgmt = FABRIC["worker"], MGMT["worker"], FABRIC_IF, MGMT_IF
            head_fabric_ip, head_mgmt_ip = FABRIC["head"], MGMT["head"]
        else:
            i = n + 1
            fabric, mgmt = f"10.0.{i}.2", f"192.168.{249 + i}.2"
            head_fabric_ip, head_mgmt_ip = f"10.0.{i}.1", f"192.168.{249 + i}.1"
            head_fab, head_mgmt = f"fab-{name}"[:15], f"mgm-{name}"[:15]
        state = self.state / name
        state.mkdir(parents=True, exist_ok=True)
        w = Host(name, f"ssk-{name}-{self.tag}", fabric, mgmt, state, head_fabric_if=head_fab, head_mgmt_if=head_mgmt,
                 home_mib=self.home_mib if home_mib is None else home_mib)
        self.hosts[name] = w
        h = self.head
        sh("ip", "netns", "add", w.netns)
        sh("ip", "link", "add", head_fab, "netns", h.netns, "type", "veth", "peer", "name", FABRIC_IF, "netns", w.netns)
        sh("ip", "link", "add", head_mgmt, "netns", h.netns, "type", "veth", "peer", "name", MGMT_IF, "netns", w.netns)
        h.run("ip", "addr", "add", f"{head_fabric_ip}/24", "dev", head_fab)
        h.run("ip", "addr", "add", f"{head_mgmt_ip}/24", "dev", head_mgmt)
        h.run("ip", "link", "set", head_fab, "up")
        h.run("ip", "link", "set", head_mgmt, "up")
        w.run("ip", "link", "set", "lo", "up")
        w.run("ip", "addr", "add", f"{w.fabric_ip}/24", "dev", FABRIC_IF)
        w.run("ip", "addr", "add", f"{w.mgmt_ip}/24", "dev", MGMT_IF)
        w.run("ip", "link", "set", FABRIC_IF, "up")
        w.run("ip", "link", "set", MGMT_IF, "up")
        self._start_worker_sshd(w, docker)
        if docker:
            w.dockerd = Dockerd(w.state / "docker", prefix=["nsenter", "-t", str(w.sshd_pid()), "-m", "-n"])
            w.dockerd.start()
        return w

    def remove_worker(self, name: str) -> None:
        w = self.hosts.pop(name)
        self._stop_host(w)
        sh("ip", "netns", "delete", w.netns, check=False)
        self._write_ssh_client_files()

    def _in_netns_with_own_sysfs(self, host: Host) -> list[str]:
        """Enter the host's netns in a private mount namespace whose /sys/class/net shows that netns.

        `ip netns exec` would remount all of /sys and hide the cgroup mounts dockerd needs.
        """
        sysfs = host.state / "sysfs"
        sysfs.mkdir(exist_ok=True)
        script = ('mount -t sysfs sysfs "$0" && mount --bind "$0/class/net" /sys/class/net && '
                  f'mount --bind "$0/devices/virtual/net" /sys/devices/virtual/net && {OWN_SHM} && exec "$@"')
        return [*host.nsenter, "unshare", "-m", "-i", "--propagation", "private", "sh", "-c", script, str(sysfs)]

    def _prepare_ssh(self) -> None:
        d = self.ssh_dir
        d.mkdir(parents=True, exist_ok=True)
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "client_key"))
        shutil.copy(d / "client_key.pub", d / "authorized_keys")
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation dir

    def _write_ssh_client_files(self) -> None:
        """known_hosts (each worker's key under its management address) and one `Host` entry per worker."""
        d = self.ssh_dir
        known, config = [], []
        for w in self.hosts.values():
            if w.name == "head":
                continue
            pub = (w.state / "host_key.pub").read_text().split()
            known.append(f"{w.mgmt_ip} {pub[0]} {pub[1]}\n")
            config.append(
                f"Host {w.name} {w.mgmt_ip}\n  HostName {w.mgmt_ip}\n  User root\n  IdentityFile {d / 'client_key'}\n"
                f"  IdentitiesOnly yes\n  UserKnownHostsFile {d / 'known_hosts'}\n  GlobalKnownHostsFile /dev/null\n"
                "  StrictHostKeyChecking yes\n  BatchMode yes\n  ConnectTimeout 5\n")
        (d / "known_hosts").write_text("".join(known))
        self.ssh_config = d / "ssh_config"
        self.ssh_config.write_text("".join(config))

    def _start_worker_sshd(self, w: Host, docker: bool) -> None:
        """sshd in a mount namespace of the worker's own: sysfs of its netns, a tmpfs HOME, docker hidden if asked.

        sshd daemonizes inside it; its pid (the pidfile's) holds the namespace, and dockerd joins it."""
        d = w.state
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key"))
        w.sshd_pidfile = d / "sshd.pid"
        (d / "sshd_config").write_text(
            f"ListenAddress {w.mgmt_ip}\nListenAddress {w.fabric_ip}\nPort 22\nHostKey {d / 'host_key'}\n"
            f"PidFile {w.sshd_pidfile}\nAuthorizedKeysFile {self.ssh_dir / 'authorized_keys'}\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
            "PermitRootLogin prohibit-password\nUsePAM no\nStrictModes no\nSubsystem sftp internal-sftp\n")
        self._write_ssh_client_files()
        sysfs = d / "sysfs"
        sysfs.mkdir(exist_ok=True)
        # The HOME tmpfs is mounted out here first, then bound over /root inside the worker: tests can read the
        # worker's files by plain paths (symlinks included), and nobody but the lab knows where they are.
        w.home_mount.mkdir(exist_ok=True)
        sh("mount", "-t", "tmpfs", "-o", f"size={w.home_mib}m,mode=0700", "sparkstack-lab-home", str(w.home_mount))
        hide = "" if docker else "".join(
            f' && mount --bind /dev/null {shlex.quote(p)}'
            for p in dict.fromkeys(x for x in ("/usr/bin/docker", "/usr/local/bin/docker", shutil.which("docker"))
                                   if x and os.path.exists(x)))
        script = ('mount -t sysfs sysfs "$0" && mount --bind "$0/class/net" /sys/class/net && '
                  f'mount --bind "$0/devices/virtual/net" /sys/devices/virtual/net && {OWN_SHM} && '
                  f'mount --bind {shlex.quote(str(w.home_mount))} {WORKER_HOME}{hide} && exec "$@"')
        sh(*w.nsenter, "unshare", "-m", "-i", "--propagation", "private", "sh", "-c", script, str(sysfs),
           shutil.which("sshd") or "/usr/sbin/sshd", "-f", str(d / "sshd_config"), "-E", str(d / "sshd.log"))
        wait_for(lambda: w.sshd_pidfile.exists(), 10, "sshd", log=d / "sshd.log")
        wait_for(lambda: self.ssh("true", check=False, host=w.name).returncode == 0, 15, f"ssh to {w.name}",
                 log=d / "sshd.log")

    def ssh(self, *remote: str, check: bool = True, config: Path | None = None,
            host: str = "worker") -> subprocess.CompletedProcess:
        """ssh from the head to a worker, over management, with the lab's strict client config."""
        return self.head.run("ssh", "-F", str(config or self.ssh_config), host, shlex.join(remote), check=check)

    def pids(self) -> list[int]:
        found = [h.sshd_pid() for h in self.hosts.values()]
        found += [h.dockerd.pid() for h in self.hosts.values() if h.dockerd]
        found += [h.dockerd.containerd_pid() for h in self.hosts.values() if h.dockerd]
        return [p for p in found if p]

    def _stop_host(self, host: Host) -> None:
        """dockerd, then sshd, then anything still living in the worker's mount namespace (its sessions)."""
        mntns, held = None, None
        pid = host.sshd_pid()
        if pid and cmdline_holds(pid, b"sshd"):  # a stale pidfile's number may be another process's by now
            try:
                # Held open until the sweep is done: a freed namespace's inode number goes at once to the next one
                # made (any `ip netns exec` of a test beside us), whose processes the sweep would then kill.
                held = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
                mntns = os.fstat(held).st_ino
            except OSError:
                pass
        if mntns == os.stat("/proc/self/ns/mnt").st_ino:
            mntns = None  # never sweep the namespace the suite itself runs in
        try:
            if host.dockerd is not None:
                host.dockerd.stop()
            if pid:
                stop_pid(pid, expect=b"sshd")
            if mntns is not None:
                for left in pids_in_mount_ns(mntns):
                    stop_pid(left, timeout=5)
        finally:
            if held is not None:
                os.close(held)
        if host.name != "head":
            sh("umount", "-l", str(host.home_mount), check=False)

    def stop(self) -> None:
        for host in list(self.hosts.values())[::-1]:  # workers first; the head last
            self._stop_host(host)
        for host in self.hosts.values():
            sh("ip", "netns", "delete", host.netns, check=False)  # takes its veth ends with it
        shutil.rmtree(self.state, ignore_errors=True)


def pids_in_mount_ns(inode: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.stat(entry / "ns/mnt").st_ino == inode:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def machine_processes(host: Host, needle: bytes) -> list[int]:
    """Pids of the processes on a worker "machine" (its sshd's mount namespace) whose command line holds needle."""
    pid = host.sshd_pid()
    if pid is None:
        return []
    found = []
    held = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)  # so its inode number cannot pass to a new namespace meanwhile
    try:
        for other in pids_in_mount_ns(os.fstat(held).st_ino):
            try:
                if needle in Path(f"/proc/{other}/cmdline").read_bytes():
                    found.append(other)
            except OSError:
                continue  # it ended while we looked
    finally:
        os.close(held)
    return found


def veth_bytes(host: Host, ifname: str) -> int:
    """rx + tx bytes the kernel counted on one interface of `host`: what really crossed the wire."""
    out = host.run("cat", f"/sys/class/net/{ifname}/statistics/rx_bytes", f"/sys/class/net/{ifname}/statistics/tx_bytes")
    return sum(int(x) for x in out.stdout.split())


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


def in_netns(netns: str, make):
    """`make()` called in a thread that has joined network namespace `netns`: a socket it binds listens there
    (a stand-in server reachable from a command run inside that namespace). The calling thread is untouched."""
    import ctypes
    import threading

    libc = ctypes.CDLL(None, use_errno=True)
    box: dict = {}

    def join_and_make() -> None:
        fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
        try:
            if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
                box["error"] = OSError(ctypes.get_errno(), f"setns into {netns}")
                return
            box["made"] = make()
        except BaseException as exc:  # noqa: BLE001 (handed to the caller)
            box["error"] = exc
        finally:
            os.close(fd)

    t = threading.Thread(target=join_and_make)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["made"]
