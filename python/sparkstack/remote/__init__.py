"""Running commands on a rank's machine: here, or over the system ssh with strict host keys.

Every command is an argv list. ssh forces one command string on the far side;
that string is only ever `shlex.join(argv)`, so no user value is interpreted by
a shell. (plumbum's SshMachine quotes with its own rules; the design asks for
shlex.join, so the system ssh is driven directly.)

A runner may also reach its host on another address (the fabric) with the same host
key (`HostKeyAlias`), and may ask for bulk-transfer options: AES-GCM ciphers first
(about 2.5x faster than chacha20-poly1305 on x86), never compression.

A run's short commands to one host share one ssh connection (OpenSSH's ControlMaster): preflight, the boot watch
and stop ask a worker a dozen things, and each new connection costs a key exchange (0.2-0.3 s in the lab, more
over a real network). The master is closed when the run ends; bulk transfers keep connections of their own.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from sparkstack.errors import SparkstackError

# Put first in the cipher list where both ends offer them; `^` keeps ssh's own defaults after them, so a
# server without AES-GCM still connects (OpenSSH >= 8.x understands the prefix).
BULK_CIPHERS = "^aes128-gcm@openssh.com,aes256-gcm@openssh.com"

# A shared connection outlives its last command by this long at most, should the run die before closing it; a
# master whose peer went silent gives up after ServerAliveInterval x CountMax, so a dead link fails a command
# within a minute instead of hanging it on a connection that is gone.
SHARED_PERSIST_S = 60
SHARED_ALIVE = ("-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=6")  # a worker busy booting may stall
_SAFE_PATH = re.compile(r"[A-Za-z0-9/._-]+")
_masters: dict[str, list[str]] = {}  # control socket -> the argv that closes its master (`ssh -O exit`)


def _private(path: Path, st: os.stat_result) -> bool:
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def _control_dir() -> Path | None:
    """This user's directory for control sockets (0700, owned, not a link), or None: then nothing is shared.
    Whoever can open a control socket can run commands on its host as this user. XDG_RUNTIME_DIR only when it is
    this user's own (after `su` it may still be another user's, who could swap what is in it)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    try:
        if not base or not _private(Path(base), os.lstat(base)):
            base = tempfile.gettempdir()
        path = Path(base) / f"sparkstack-ssh-{os.geteuid()}"
        path.mkdir(mode=0o700, exist_ok=True)
        return path if _private(path, os.lstat(path)) else None
    except OSError:
        return None


def close_shared() -> None:
    """End every master this process opened (at exit: no ssh of ours outlives the run)."""
    for socket, argv in list(_masters.items()):
        del _masters[socket]
        if os.path.exists(socket):
            try:
                subprocess.run(argv, capture_output=True, timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass


atexit.register(close_shared)


@dataclass(frozen=True)
class Runner:
    """Where a rank's commands run. `ssh` None means this machine."""

    ssh: str | None = None
    ssh_config: Path | None = None
    docker_host: str | None = None
    connect_timeout_s: int = 10
    hostname: str | None = None  # connect to this address instead of the target's own (e.g. its fabric IP)
    host_key_alias: str | None = None  # the name its host key is known under, when `hostname` is set
    bulk: bool = False  # options for moving many bytes: AES-GCM first, no compression, no tty
    sudo: bool = False  # the user there is not root: `run_as_root` goes through `sudo -n` (never a password prompt)

    def __post_init__(self) -> None:
        # An ssh target or docker host that looks like an option would be read as one (`-oProxyCommand=...`).
        # A socket path may hold a space; an ssh target may not.
        for what, value, spaces in (("ssh target", self.ssh, False), ("docker host", self.docker_host, True)):
            if value is not None and (not value or value.startswith("-") or any(
                    not c.isprintable() or (c.isspace() and not (spaces and c == " ")) for c in value)):
                raise SparkstackError(f"{what} {value!r}: must be non-empty, not start with '-', and hold no "
                                      f"{'control characters' if spaces else 'whitespace or control characters'}")

    @property
    def label(self) -> str:
        return self.ssh or "local"

    def ssh_options(self) -> list[str]:
        opts = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", f"ConnectTimeout={self.connect_timeout_s}"]
        if self.ssh_config is not None:
            opts += ["-F", str(Path(self.ssh_config).absolute())]  # absolute: never read as an option
        if self.hostname is not None:
            # Same host key as on the management address: no second known_hosts entry to trust blindly.
            opts += ["-o", f"HostName={self.hostname}", "-o", f"HostKeyAlias={self.host_key_alias}",
                     "-o", "CheckHostIP=no"]
        if self.bulk:
            opts += ["-T", "-x", "-o", "Compression=no", "-o", f"Ciphers={BULK_CIPHERS}",
                     "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4"]
        else:
            opts += self._shared_connection()
        return opts

    def _shared_connection(self) -> list[str]:
        """ControlMaster options for this target, or none (no private socket directory, or a path ssh would
        expand, unquote or not bind). The socket is named by everything that picks the connection (the ssh
        config, the target, the address and host key it is reached by) and by this process: the master is this
        run's alone, and closing it at exit never cuts another run's commands."""
        where = _control_dir() if self.ssh is not None else None
        if where is None:
            return []
        key = json.dumps([str(Path(self.ssh_config).absolute()) if self.ssh_config else None, self.ssh,
                          self.hostname, self.host_key_alias, os.environ.get("SSH_AUTH_SOCK")])
        socket = str(where / f"{os.getpid()}-{hashlib.sha256(key.encode()).hexdigest()[:16]}")
        # ssh expands % ~ and ${}, and unquotes, in ControlPath; it binds PATH + 17 characters first, and a unix
        # socket's path has 104 bytes on the BSDs (108 on Linux)
        if not _SAFE_PATH.fullmatch(socket) or len(os.fsencode(socket)) + 17 >= 104:
            return []
        control = ["-o", f"ControlPath={socket}"]
        if socket not in _masters:
            config = ["-F", str(Path(self.ssh_config).absolute())] if self.ssh_config is not None else []
            _masters[socket] = ["ssh", *config, *control, "-O", "exit", "--", self.ssh]
        return ["-o", "ControlMaster=auto", *control, "-o", f"ControlPersist={SHARED_PERSIST_S}", *SHARED_ALIVE]

    def argv(self, argv: list[str]) -> list[str]:
        if self.ssh is None:
            return list(argv)
        return ["ssh", *self.ssh_options(), self.ssh, "--", shlex.join(argv)]

    def via(self, hostname: str, host_key_alias: str) -> Runner:
        """The same runner, connecting to `hostname` and checking the host key known as `host_key_alias`."""
        return replace(self, hostname=hostname, host_key_alias=host_key_alias)

    def popen(self, argv: list[str]) -> subprocess.Popen:
        """Start `argv` here or over ssh with stdin, stdout and stderr as pipes (plumbum: the local end of a
        pipeline we feed and read ourselves)."""
        from plumbum import local
        from plumbum.commands.processes import CommandNotFound

        full = self.argv(argv)
        try:  # this process's environment as it is now: plumbum's `local.env` is a copy made at its import
            cmd = local[shutil.which(full[0]) or full[0]][full[1:]]
        except CommandNotFound:
            raise SparkstackError(f"{full[0]}: not installed here") from None
        return cmd.popen(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ))

    def by_hand(self, argv: list[str]) -> str:
        """The line a person types to run `argv` there: `ssh HOST docker rm -f NAME` for a remote runner."""
        remote = shlex.join(argv)
        if self.ssh is None:
            return remote
        ssh = ["ssh", *(["-F", str(Path(self.ssh_config).absolute())] if self.ssh_config is not None else []), self.ssh]
        # ssh hands its words to the remote shell joined by spaces: one quoted word only where one is needed
        return f"{shlex.join(ssh)} {remote}" if remote == " ".join(argv) else shlex.join([*ssh, remote])

    def docker(self, *args: str) -> list[str]:
        return ["docker", *(["-H", self.docker_host] if self.docker_host else []), *args]

    def run(self, argv: list[str], timeout: float = 120, env: dict | None = None,
            input: str | None = None) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(self.argv(argv), capture_output=True, text=True, errors="replace", timeout=timeout,
                                  env=env, input=input)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 124, "", f"timed out after {timeout:.0f} s on {self.label}")
        except FileNotFoundError as exc:
            return subprocess.CompletedProcess(argv, 127, "", f"{exc.filename}: not installed on {self.label}")

    def run_docker(self, *args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
        return self.run(self.docker(*args), timeout=timeout, env=env)

    def as_root(self, argv: list[str]) -> list[str]:
        return ["sudo", "-n", *argv] if self.sudo else list(argv)

    def run_as_root(self, argv: list[str], timeout: float = 120, input: str | None = None) -> subprocess.CompletedProcess:
        return self.run(self.as_root(argv), timeout=timeout, input=input)

    def is_root(self) -> bool:
        """Whether commands there run as root (`id -u`: read-only)."""
        proc = self.run(["id", "-u"], timeout=60)
        if proc.returncode != 0 or not proc.stdout.strip().isdigit():
            raise SparkstackError(f"{self.label}: cannot tell which user runs there (`id -u`): {failure_line(proc)}")
        return proc.stdout.strip() == "0"

    def for_root(self) -> Runner:
        """This runner, its `run_as_root` through `sudo -n` where the user there is not root (asks `id -u`)."""
        return replace(self, sudo=not self.is_root())

    def read_texts(self, paths: list[str]) -> dict[str, str | None]:
        """Small text files there, in one go; None for a file that is missing, unreadable or empty.

        Over ssh one `grep -a -s -H -Z '' -- PATHS` (every line as "path NUL line"); a failed connection is an error."""
        if self.ssh is None:
            texts: dict[str, str | None] = {}
            for path in paths:
                try:
                    texts[path] = Path(path).read_text(errors="replace") or None
                except OSError:
                    texts[path] = None
            return texts
        proc = self.run(["grep", "-a", "-s", "-H", "-Z", "", "--", *paths], timeout=60)
        if proc.returncode not in (0, 1, 2):
            raise SparkstackError(f"{self.label}: reading {len(paths)} file(s): {failure_line(proc)}")
        lines: dict[str, list[str]] = {}
        for line in proc.stdout.split("\n"):  # not splitlines(): a file's line may hold \r or \f
            path, nul, text = line.partition("\0")
            if nul:
                lines.setdefault(path, []).append(text + "\n")
        return {path: "".join(lines[path]) if path in lines else None for path in paths}

    def list_dirs(self, paths: list[str]) -> dict[str, list[str]]:
        """The names in each directory there, sorted; empty for one that is missing. Over ssh one `find`."""
        names: dict[str, list[str]] = {path: [] for path in paths}
        if self.ssh is None:
            for path in paths:
                try:
                    names[path] = sorted(os.listdir(path))
                except OSError:
                    pass
            return names
        proc = self.run(["find", *paths, "-mindepth", "1", "-maxdepth", "1", "-printf", "%H\\0%f\\0"], timeout=60)
        if proc.returncode not in (0, 1):  # 1: some directory is missing
            raise SparkstackError(f"{self.label}: listing {', '.join(paths)}: {failure_line(proc)}")
        fields = proc.stdout.split("\0")
        for start, name in zip(fields[0::2], fields[1::2]):
            if start in names:
                names[start].append(name)
        return {path: sorted(found) for path, found in names.items()}


def sudo_refused(proc: subprocess.CompletedProcess) -> bool:
    """`sudo -n` said no: a password would be needed, no sudoers rule for the command ("Sorry, user U is not
    allowed to execute ..."), or no sudo at all."""
    line = failure_line(proc)
    return proc.returncode != 0 and (line.startswith("sudo:") or proc.returncode == 127 and "sudo" in line
                                     or line.startswith("Sorry, user ") and " is not allowed to execute " in line)


FOUND, NOT_THERE, UNREACHABLE = "found", "not there", "could not reach"
_NO_SUCH = re.compile(r"no such (object|container|image)\b", re.IGNORECASE)


def docker_answer(proc: subprocess.CompletedProcess) -> str:
    """What a `docker inspect` over a runner told: FOUND; NOT_THERE (docker itself answered that it has no such
    object); or UNREACHABLE (ssh, the daemon or the clock failed first: nothing is known about the object)."""
    if proc.returncode == 0:
        return FOUND
    if proc.returncode == 1 and _NO_SUCH.search((proc.stderr or "") + (proc.stdout or "")):
        return NOT_THERE
    return UNREACHABLE


def unreachable_reason(runner: Runner, proc: subprocess.CompletedProcess) -> str:
    """Why docker on `runner` did not answer, and what to check: one clause."""
    line = failure_line(proc)
    if runner.ssh is not None and proc.returncode == 255:
        # the very ssh options this run used, so the command the user copies tests what failed
        test = shlex.join(["ssh", *(["-F", str(Path(runner.ssh_config).absolute())] if runner.ssh_config else []),
                           "-o", "BatchMode=yes", runner.ssh, "true"])
        return f"ssh to {runner.ssh} failed ({line}); check that `{test}` works (WORKER_SSH, its ssh_config)"
    if proc.returncode == 124:
        return f"{line}; check that {runner.label} and its docker answer"
    if proc.returncode == 127:
        return f"{line}; install docker there"
    if runner.docker_host:
        where = f"docker host {runner.docker_host}"
    elif runner.ssh is None and os.environ.get("DOCKER_HOST"):  # docker here obeys it: say so, or the user looks
        where = f"the docker host DOCKER_HOST={os.environ['DOCKER_HOST']} names"  # at the wrong daemon
    else:
        where = f"dockerd on {runner.label}"
    return f"{line}; check that {where} runs (`systemctl status docker`) and that this user may use it"


def failure_line(proc: subprocess.CompletedProcess) -> str:
    """The most telling line of a failed command: its last line of stderr (or stdout)."""
    text = (proc.stderr or proc.stdout or "").strip()
    return text.splitlines()[-1] if text else f"exit {proc.returncode}"


def ssh_settings(target: str, ssh_config: Path | None = None) -> dict[str, str]:
    """What ssh would use for `target` (`ssh -G`: local, read-only, connects to nothing)."""
    argv = ["ssh", *(["-F", str(ssh_config)] if ssh_config is not None else []), "-G", "--", target]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise SparkstackError("ssh: not installed here") from None
    except subprocess.TimeoutExpired:
        raise SparkstackError(f"ssh -G {target}: timed out") from None
    if proc.returncode != 0:
        raise SparkstackError(f"ssh -G {target}: {failure_line(proc)}")
    settings = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        settings.setdefault(key.lower(), value.strip())
    return settings


def host_key_alias(target: str, ssh_config: Path | None = None) -> str:
    """The name `target`'s host key is recorded under in known_hosts, for reaching it on another address.

    ssh looks host keys up by the resolved HostName (with "[host]:port" off port 22), or by an
    explicit HostKeyAlias; an alias given on the command line is used verbatim."""
    s = ssh_settings(target, ssh_config)
    if s.get("hostkeyalias") and s["hostkeyalias"] != "none":
        return s["hostkeyalias"]
    host, port = s.get("hostname") or target.rpartition("@")[2], s.get("port", "22")
    return host if port == "22" else f"[{host}]:{port}"
