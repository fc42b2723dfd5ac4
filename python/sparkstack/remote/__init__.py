"""Running commands on a rank's machine: here, or over the system ssh with strict host keys.

Every command is an argv list. ssh forces one command string on the far side;
that string is only ever `shlex.join(argv)`, so no user value is interpreted by
a shell. (plumbum's SshMachine quotes with its own rules; the design asks for
shlex.join, so the system ssh is driven directly.)
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sparkstack.errors import SparkstackError


@dataclass(frozen=True)
class Runner:
    """Where a rank's commands run. `ssh` None means this machine."""

    ssh: str | None = None
    ssh_config: Path | None = None
    docker_host: str | None = None
    connect_timeout_s: int = 10

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

    def argv(self, argv: list[str]) -> list[str]:
        if self.ssh is None:
            return list(argv)
        ssh = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
               "-o", f"ConnectTimeout={self.connect_timeout_s}"]
        if self.ssh_config is not None:
            ssh += ["-F", str(Path(self.ssh_config).absolute())]  # absolute: never read as an option
        return ssh + [self.ssh, "--", shlex.join(argv)]

    def docker(self, *args: str) -> list[str]:
        return ["docker", *(["-H", self.docker_host] if self.docker_host else []), *args]

    def run(self, argv: list[str], timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(self.argv(argv), capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 124, "", f"timed out after {timeout:.0f} s on {self.label}")
        except FileNotFoundError as exc:
            return subprocess.CompletedProcess(argv, 127, "", f"{exc.filename}: not installed on {self.label}")

    def run_docker(self, *args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
        return self.run(self.docker(*args), timeout=timeout, env=env)


def failure_line(proc: subprocess.CompletedProcess) -> str:
    """The most telling line of a failed command: its last line of stderr (or stdout)."""
    text = (proc.stderr or proc.stdout or "").strip()
    return text.splitlines()[-1] if text else f"exit {proc.returncode}"
