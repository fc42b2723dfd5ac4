"""The tune plan: per rank, what differs from a tuned host, as data.

`plan_rank` is pure (facts in, steps out); `plan_tune` reads each rank's facts (read-only: files,
`id -u`, `nvidia-smi --query-gpu`) and plans. Apply (tune/apply.py) carries the steps out.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from sparkstack.deploy import Deployment, runner_for, select_ranks
from sparkstack.remote import Runner
from sparkstack.tune import facts as hostfacts
from sparkstack.tune.facts import WRITTEN_BY, HostFacts
from sparkstack.units import GIB
from sparkstack.tune.pagecache import DROP_CACHES

PAGE_CACHE_DROP_BYTES = 2 * GIB  # less than this in the page cache is not worth a drop
SWAPPINESS_FILE_TEXT = (f"{WRITTEN_BY}: unified memory must not swap (vm.swappiness 0 does not survive a reboot "
                        "unless set here).\nvm.swappiness = 0\n")


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    input: str | None = None  # stdin

    def to_json(self) -> dict:
        return {"argv": list(self.argv), "stdin": self.input}


@dataclass(frozen=True)
class Step:
    name: str  # swappiness | swappiness-persisted | persistence-mode | clock-cap | page-cache
    now: str
    want: str
    commands: tuple[Command, ...]  # run as root, in order (page-cache: tune.pagecache runs these)
    by_hand: str  # the same as one shell line, for a user to run themselves

    def to_json(self) -> dict:
        return {"step": self.name, "now": self.now, "want": self.want,
                "commands": [c.to_json() for c in self.commands], "by_hand": self.by_hand}


@dataclass(frozen=True)
class RankTune:
    rank: int
    host: str
    where: str
    sudo: bool  # not root there: every command goes through `sudo -n`
    facts: HostFacts
    steps: tuple[Step, ...]
    notes: tuple[str, ...]  # what was left alone, and why: the rank is not up to date while any is left
    problems: tuple[str, ...]  # what tune will not do for you: apply skips those steps and fails at the end

    @property
    def up_to_date(self) -> bool:
        return not self.steps and not self.problems and not self.notes

    def to_json(self) -> dict:
        return {"rank": self.rank, "host": self.host, "where": self.where, "sudo": self.sudo,
                "up_to_date": self.up_to_date, "facts": self.facts.to_json(),
                "steps": [s.to_json() for s in self.steps], "notes": list(self.notes), "problems": list(self.problems)}


@dataclass(frozen=True)
class TunePlan:
    recipe: str
    clock_cap: str
    host_root: str
    ranks: tuple[RankTune, ...]

    @property
    def up_to_date(self) -> bool:
        return all(r.up_to_date for r in self.ranks)

    def to_json(self) -> dict:
        return {"recipe": self.recipe, "clock_cap": self.clock_cap, "host_root": self.host_root,
                "up_to_date": self.up_to_date, "ranks": [r.to_json() for r in self.ranks]}


def _sudo(argv: tuple[str, ...]) -> str:
    return shlex.join(("sudo", *argv))


def write_file(path: str, text: str) -> tuple[tuple[Command, ...], str]:
    """Commands that write `text` to `path` atomically (temp file, fsync, rename, fsync of the directory),
    and the shell line that writes it by hand."""
    folder, tmp = os.path.dirname(path), path + ".sparkstack-tmp"  # systemd-sysctl reads only *.conf
    commands = (Command(("mkdir", "-p", "--", folder)),
                Command(("dd", f"of={tmp}", "conv=fsync", "status=none"), text),
                Command(("mv", "-f", "--", tmp, path)),
                Command(("sync", "--", folder)))
    by_hand = (f"{_sudo(('mkdir', '-p', '--', folder))} && "
               f"{shlex.join(('printf', '%s' + chr(92) + 'n', *text.splitlines()))} | {_sudo(('tee', path))} >/dev/null")
    return commands, by_hand


def _step(name: str, now: str, want: str, *argvs: tuple[str, ...]) -> Step:
    return Step(name, now, want, tuple(Command(a) for a in argvs), " && ".join(_sudo(a) for a in argvs))


def _swappiness_persisted(facts: HostFacts, problems: list[str]) -> Step | None:
    persisted = facts.persisted_swappiness
    if persisted is not None and persisted.value == "0":
        return None
    ours = facts.path(hostfacts.SYSCTL_FILE)
    # What is read after our file wins over it: /etc/sysctl.conf (procps reads it last), or a name sorting later.
    if persisted is not None and (persisted.file == facts.path(hostfacts.SYSCTL_CONF)
                                  or os.path.basename(persisted.file) > os.path.basename(ours)):
        problems.append(f"swappiness-persisted skipped: {persisted.file} sets vm.swappiness = {persisted.value} and "
                        f"is read last at boot: set 0 there yourself")
        return None
    if facts.our_file is not None and facts.our_file != SWAPPINESS_FILE_TEXT:  # a file tune wrote holds exactly that
        problems.append(f"swappiness-persisted skipped: {ours} exists and is not what sparkstack tune writes; left as "
                        "it is: set vm.swappiness = 0 there yourself, or move it away")
        return None
    now = "not set at boot" if persisted is None else f"{persisted.value} (from {persisted.file})"
    commands, by_hand = write_file(ours, SWAPPINESS_FILE_TEXT)
    return Step("swappiness-persisted", now, f"0 in {ours}", commands, by_hand)


def _gpu_steps(facts: HostFacts, clock_cap: str, notes: list[str]) -> list[Step]:
    if facts.gpus is None:
        notes.append(f"{facts.gpu_problem}: persistence mode and the clock cap are left alone")
        return []
    steps = []
    if any(m != "Enabled" for m in facts.gpus.persistence):
        steps.append(_step("persistence-mode", ", ".join(facts.gpus.persistence), "Enabled", ("nvidia-smi", "-pm", "1")))
    # The one rule preflight checks too; the cap comes after persistence mode, which keeps it held.
    now = facts.clock_cap_unmet(clock_cap)
    if now:
        cap = ("nvidia-smi", "-lgc", clock_cap)
        text = hostfacts.stamp_text(clock_cap, facts.boot_id)
        stamp, stamp_by_hand = write_file(facts.path(hostfacts.CLOCK_STAMP), text)
        # By hand too the cap is recorded: without the stamp neither tune nor preflight can tell it was set.
        steps.append(Step("clock-cap", now, clock_cap, (Command(cap), *stamp), f"{_sudo(cap)} && {stamp_by_hand}"))
    return steps


def plan_rank(rank: int, host: str, facts: HostFacts, sudo: bool, clock_cap: str) -> RankTune:
    """What differs on one rank, from its facts alone."""
    # Every host has both: without them the root is not a host's (a mistyped --host-root), and nothing is done there.
    unread = [rel for rel, value in ((hostfacts.SWAPPINESS, facts.swappiness), (hostfacts.BOOT_ID, facts.boot_id))
              if value is None]
    if unread:
        problem = (f"cannot read {' or '.join(facts.path(rel) for rel in unread)}: is {facts.root} the host's root "
                   "(--host-root)? nothing done on this rank")
        return RankTune(rank, host, facts.where, sudo, facts, (), (), (problem,))
    steps, notes, problems = [], [], []
    if facts.swappiness != "0":
        steps.append(_step("swappiness", facts.swappiness, "0", ("sysctl", "-w", "vm.swappiness=0")))
    persisted = _swappiness_persisted(facts, problems)
    if persisted:
        steps.append(persisted)
    steps += _gpu_steps(facts, clock_cap, notes)
    cache = facts.memory.page_cache
    if cache is None:
        notes.append(f"cannot read the page cache size under {facts.root}: no drop")
    elif cache >= PAGE_CACHE_DROP_BYTES:
        steps.append(_step("page-cache", f"{cache / GIB:.1f} GiB", f"under {PAGE_CACHE_DROP_BYTES / GIB:g} GiB",
                           *DROP_CACHES))
    return RankTune(rank, host, facts.where, sudo, facts, tuple(steps), tuple(notes), tuple(problems))


def plan_tune(plan: Deployment, target: str, host_root: Path, ssh_config: Path | None) -> tuple[TunePlan, dict[int, Runner]]:
    """Read every selected rank's facts (read-only) and plan; also returns the runners apply uses."""
    root = str(host_root.absolute())
    ranks, runners = [], {}
    for rank in select_ranks(plan, target, actions=("all",)):
        runner = runners[rank.rank] = runner_for(rank, ssh_config).for_root()
        ranks.append(plan_rank(rank.rank, rank.host, hostfacts.read_facts(runner, root), runner.sudo,
                               plan.recipe.clock_cap))
    return TunePlan(plan.recipe.name, plan.recipe.clock_cap, root, tuple(ranks)), runners


def plan_lines(plan: TunePlan) -> list[str]:
    """The human form of a tune plan (`tune --dry-run`)."""
    lines = []
    for r in plan.ranks:
        who = f"rank {r.rank} ({r.host}, {r.where}{', sudo -n' if r.sudo else ''})"
        lines.append(f"{who}: up to date" if r.up_to_date else f"{who}:")
        lines += [f"  {s.name}: {s.now} -> {s.want}" for s in r.steps]
        lines += [f"  problem: {p}" for p in r.problems]
        lines += [f"  note: {n}" for n in r.notes]
    return lines
