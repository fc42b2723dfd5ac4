"""The page cache: one way to sync and drop it on a machine, which tune's page-cache step and launch's
--drop-caches and memory guard all run."""

from __future__ import annotations

import subprocess

from sparkstack.remote import Runner

DROP_CACHES = (("sync",), ("sysctl", "-w", "vm.drop_caches=3"))


def drop_page_cache(runner: Runner) -> tuple[list[str], subprocess.CompletedProcess] | None:
    """sync, then drop the page cache on one machine (as root: `sudo -n` where the runner says so).
    None when done; else the command that failed and how."""
    for argv in DROP_CACHES:
        proc = runner.run_as_root(list(argv), timeout=300)
        if proc.returncode != 0:
            return list(argv), proc
    return None
