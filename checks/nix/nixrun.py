"""Helpers for the tests that run Nix on a throwaway clone of this checkout (checks/nix/test_*.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STUB_VENV = Path("/opt/sparkstack-nix-stub-venv")  # the only venv nix/stub reads (nix/stub/make-venv)
TIMEOUT = 900


def required(what: str, ok: bool, hint: str) -> None:
    if ok:
        return
    if os.environ.get("SPARKSTACK_REQUIRE_TOOLS"):
        pytest.fail(f"{what} is required here (SPARKSTACK_REQUIRE_TOOLS is set): {hint}")
    pytest.skip(f"{what} missing: {hint}")


def run(argv, cwd, env=None, check=0, timeout=TIMEOUT):
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check is not None:
        assert proc.returncode == check, f"{argv}: exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def working_tree_clone(dest: Path) -> Path:
    """`git clone` of this checkout, then its working tree as it is (uncommitted and new files too), staged."""
    required("git", shutil.which("git") is not None, "apt-get install git")
    assert (ROOT / ".git").exists(), f"{ROOT} is not a git checkout"
    run(["git", "clone", "-q", "--no-hardlinks", ROOT, dest], cwd=dest.parent)
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT).stdout
    for rel in filter(None, listed.split("\0")):
        src, dst = ROOT / rel, dest / rel
        if dst.is_symlink() or dst.exists():
            dst.unlink()
        if src.is_symlink() or src.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst, follow_symlinks=False)
    run(["git", "add", "-A"], cwd=dest)
    return dest
