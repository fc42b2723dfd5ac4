"""The fetch suites under the other huggingface_hub major: fetch/hub.py's transport seam, really run both ways.

The test venv takes pip's newest huggingface_hub (2.x, httpx2); nix/stub's venv holds nixpkgs' (1.28, httpx:
nix/nixpkgs-versions.toml). This test runs checks/unit/test_fetch.py and checks/badinput/test_fetch_badinput.py
again with the stub venv's interpreter and this checkout's sparkstack (PYTHONPATH), against the same hub
stand-in, and needs the two majors to differ: with SPARKSTACK_REQUIRE_TOOLS set, a missing stub venv or the
same major on both sides fails instead of skipping.
"""

from __future__ import annotations

import os
import subprocess
from importlib import metadata

from nixrun import ROOT, STUB_VENV, TIMEOUT, required

SUITES = ["checks/unit/test_fetch.py", "checks/badinput/test_fetch_badinput.py"]


def major(version: str) -> int:
    return int(version.split(".")[0])


def test_the_fetch_suites_pass_under_the_stub_venvs_huggingface_hub(tmp_path):
    python = STUB_VENV / "bin/python3"
    required("the stub's host venv", python.exists(), "run nix/stub/make-venv")
    theirs = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('huggingface_hub'))"],
                            capture_output=True, text=True, check=True).stdout.strip()
    ours = metadata.version("huggingface_hub")
    required(f"another huggingface_hub major than this venv's {ours}", major(theirs) != major(ours),
             f"the stub venv has {theirs}; nix/stub/make-venv installs nix/nixpkgs-versions.toml's")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([python, "-m", "pytest", *SUITES, "-q", "-p", "no:cacheprovider", "--basetemp",
                           tmp_path / "pytest"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, f"under huggingface_hub {theirs}:\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
    assert " passed" in proc.stdout and " failed" not in proc.stdout, proc.stdout[-2000:]
