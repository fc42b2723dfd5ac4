"""How tests start the real CLI, and find the real tools it drives."""

import os
import shutil
import sys

import pytest


def sparkstack_cmd() -> list[str]:
    """The interpreter running the tests, `-m sparkstack.cli`: no installed script needed."""
    return [sys.executable, "-m", "sparkstack.cli"]


def need(tool: str) -> str:
    """The path of a tool the test drives; a missing one skips, or fails where SPARKSTACK_REQUIRE_TOOLS is set (CI)."""
    path = shutil.which(tool)
    if path is None:
        if os.environ.get("SPARKSTACK_REQUIRE_TOOLS"):
            pytest.fail(f"{tool} is required here (SPARKSTACK_REQUIRE_TOOLS is set) but not installed")
        pytest.skip(f"{tool} not installed")
    return path
