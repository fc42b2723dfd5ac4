"""A rank's host facts that `tune` sets and preflight checks, read under a host-root prefix.

Read-only: files through the rank's Runner (over ssh, one `grep` of the files and one `find` of the sysctl
directories) and `nvidia-smi --query-gpu`. The prefix is the same path on every rank ("/" in production; a
prepared tree in tests), so nothing here or in tune ever needs the real /proc/sys or /etc of a test machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sparkstack.remote import Runner, failure_line

# 'zz-' sorts after every numbered file, Debian's 99-sysctl.conf (-> ../sysctl.conf) included: read last.
SYSCTL_FILE = "etc/sysctl.d/zz-sparkstack-tune.conf"
# systemd-sysctl's directories, in precedence order: a name in an earlier one hides the same name later.
SYSCTL_DIRS = ("etc/sysctl.d", "run/sysctl.d", "usr/local/lib/sysctl.d", "usr/lib/sysctl.d", "lib/sysctl.d")
SYSCTL_CONF = "etc/sysctl.conf"  # procps' `sysctl --system` reads it after every directory
# `nvidia-smi -lgc` cannot be read back (NVML has a setter for locked clocks, no getter) and does not survive
# a reboot; tune records the cap it set, with the kernel's boot id, in a file of its own.
CLOCK_STAMP = "run/sparkstack/clock-cap"
SWAPPINESS = "proc/sys/vm/swappiness"
BOOT_ID = "proc/sys/kernel/random/boot_id"
WRITTEN_BY = "# Written by sparkstack tune"
GPU_QUERY = ("persistence_mode", "clocks.current.graphics")


@dataclass(frozen=True)
class Meminfo:
    """Bytes, from /proc/meminfo; None where the line is missing."""

    total: int | None
    free: int | None
    available: int | None
    page_cache: int | None  # what dropping the page cache can free: Buffers + Cached - Shmem (tmpfs stays)

    def to_json(self) -> dict:
        return {"total": self.total, "free": self.free, "available": self.available, "page_cache": self.page_cache}


@dataclass(frozen=True)
class Setting:
    value: str
    file: str


@dataclass(frozen=True)
class Gpus:
    persistence: tuple[str, ...]  # per GPU, as nvidia-smi prints it: Enabled / Disabled
    clocks_mhz: tuple[int | None, ...]  # current graphics clock per GPU; None when nvidia-smi says [N/A]

    def to_json(self) -> dict:
        return {"persistence_mode": list(self.persistence), "clocks_current_graphics_mhz": list(self.clocks_mhz)}


@dataclass(frozen=True)
class HostFacts:
    where: str
    root: str
    swappiness: str | None  # live, from proc/sys/vm/swappiness
    swappiness_settings: tuple[Setting, ...]  # every vm.swappiness line the boot-time files hold, in the order applied
    our_file: str | None  # SYSCTL_FILE's text, when it exists
    swaps: tuple[str, ...]  # active swap areas, from proc/swaps
    memory: Meminfo
    boot_id: str | None
    clock_stamp: str | None  # CLOCK_STAMP's text, when it exists
    gpus: Gpus | None
    gpu_problem: str | None  # why `gpus` is None

    @property
    def persisted_swappiness(self) -> Setting | None:
        """The value a reboot brings: the last setting applied."""
        return self.swappiness_settings[-1] if self.swappiness_settings else None

    def stamped_cap(self) -> str | None:
        """The clock cap tune set during this boot, if any."""
        fields = stamp_fields(self.clock_stamp)
        if self.boot_id and fields.get("boot_id") == self.boot_id:
            return fields.get("clock_cap")
        return None

    def clock_cap_unmet(self, clock_cap: str) -> str | None:
        """Why `clock_cap` is not known to hold on every GPU (None when it is): tune's rule and preflight's.
        Only called with `gpus` read."""
        over = [c for c in self.gpus.clocks_mhz if c is not None and c > int(clock_cap.split(",")[1])]
        stamped = self.stamped_cap()
        if over:
            return f"graphics clock {max(over)} MHz, above the cap"
        # A lock set while persistence mode was off may be gone with the driver's last client.
        if any(m != "Enabled" for m in self.gpus.persistence):
            return "persistence mode off: a cap may not have held"
        if stamped != clock_cap:
            return f"{stamped} MHz set this boot" if stamped else "no cap set by sparkstack tune since boot"
        return None

    def path(self, rel: str) -> str:
        return host_path(self.root, rel)

    def to_json(self) -> dict:
        persisted = self.persisted_swappiness
        return {"where": self.where, "swappiness": self.swappiness,
                "swappiness_persisted": None if persisted is None else {"value": persisted.value, "file": persisted.file},
                "swaps": list(self.swaps), "memory": self.memory.to_json(), "clock_cap_this_boot": self.stamped_cap(),
                "gpus": None if self.gpus is None else self.gpus.to_json(), "gpu_problem": self.gpu_problem}


def host_path(root: str, rel: str) -> str:
    return os.path.join(root, rel)


def stamp_text(clock_cap: str, boot_id: str) -> str:
    return (f"{WRITTEN_BY}: the GPU clock cap it set with nvidia-smi -lgc, which lasts until reboot.\n"
            f"clock_cap={clock_cap}\nboot_id={boot_id}\n")


def stamp_fields(text: str | None) -> dict[str, str]:
    fields = {}
    for line in (text or "").splitlines():
        key, eq, value = line.partition("=")
        if eq and not key.startswith("#"):
            fields[key.strip()] = value.strip()
    return fields


def parse_meminfo(text: str | None) -> Meminfo:
    kib = {}
    for line in (text or "").splitlines():
        key, _, rest = line.partition(":")
        words = rest.split()
        if words and words[0].isdigit():
            kib[key.strip()] = int(words[0]) * 1024
    cache = None
    if "Cached" in kib:
        cache = max(0, kib.get("Buffers", 0) + kib["Cached"] - kib.get("Shmem", 0))
    return Meminfo(kib.get("MemTotal"), kib.get("MemFree"), kib.get("MemAvailable"), cache)


def read_meminfo(runner: Runner, root: str) -> Meminfo:
    path = host_path(root, "proc/meminfo")
    return parse_meminfo(runner.read_texts([path])[path])


def swappiness_lines(text: str, file: str) -> list[Setting]:
    """vm.swappiness in one sysctl.d file (`key = value`, `#`/`;` comments, a leading '-', '/' for '.')."""
    found = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        key, eq, value = line.lstrip("-").partition("=")
        if eq and key.strip().replace("/", ".") == "vm.swappiness":
            found.append(Setting(value.strip(), file))
    return found


def sysctl_files(runner: Runner, root: str) -> list[str]:
    """The boot-time sysctl files in the order they apply (systemd-sysctl's rules, then /etc/sysctl.conf)."""
    dirs = [host_path(root, rel) for rel in SYSCTL_DIRS]
    chosen: dict[str, str] = {}
    for folder, names in runner.list_dirs(dirs).items():  # dicts keep order: precedence order
        for name in names:
            if name.endswith(".conf"):
                chosen.setdefault(name, os.path.join(folder, name))
    return [chosen[name] for name in sorted(chosen)] + [host_path(root, SYSCTL_CONF)]


def query_gpus(runner: Runner) -> tuple[Gpus | None, str | None]:
    proc = runner.run(["nvidia-smi", f"--query-gpu={','.join(GPU_QUERY)}", "--format=csv,noheader,nounits"], timeout=60)
    if proc.returncode == 127:
        return None, f"nvidia-smi is not installed on {runner.label}"
    if proc.returncode != 0:
        return None, f"nvidia-smi failed on {runner.label}: {failure_line(proc)}"
    rows = [[f.strip() for f in line.split(",")] for line in proc.stdout.splitlines() if line.strip()]
    if not rows or any(len(r) != len(GPU_QUERY) for r in rows):
        return None, f"nvidia-smi on {runner.label} answered {proc.stdout.strip()[:80]!r}, not {len(GPU_QUERY)} fields per GPU"
    return Gpus(tuple(r[0] for r in rows), tuple(int(r[1]) if r[1].isdigit() else None for r in rows)), None


def read_facts(runner: Runner, root: str) -> HostFacts:
    """Every fact, in four read-only calls: the sysctl listing, the files, `nvidia-smi` (and the caller's `id`)."""
    sysctl = sysctl_files(runner, root)
    named = {rel: host_path(root, rel) for rel in (
        SWAPPINESS, "proc/swaps", "proc/meminfo", BOOT_ID, SYSCTL_FILE, CLOCK_STAMP)}
    texts = runner.read_texts(list(dict.fromkeys([*named.values(), *sysctl])))
    text = {rel: texts[path] for rel, path in named.items()}
    settings = [s for file in sysctl for s in swappiness_lines(texts[file] or "", file)]
    swaps = [line.split()[0] for line in (text["proc/swaps"] or "").splitlines()[1:] if line.strip()]
    gpus, problem = query_gpus(runner)
    return HostFacts(
        where=runner.label, root=root, swappiness=(text[SWAPPINESS] or "").strip() or None,
        swappiness_settings=tuple(settings), our_file=text[SYSCTL_FILE], swaps=tuple(swaps),
        memory=parse_meminfo(text["proc/meminfo"]),
        boot_id=(text[BOOT_ID] or "").strip() or None,
        clock_stamp=text[CLOCK_STAMP], gpus=gpus, gpu_problem=problem)
