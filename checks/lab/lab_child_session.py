"""Run only as a child session by test_lab.py::test_lab_leaves_nothing_behind (the name keeps pytest
from collecting it otherwise): it brings a lab up, then fails or waits to be interrupted."""

import os
import time

import pytest


def test_child_session(lab):
    (lab.root / "ready").write_text("up")
    if os.environ.get("SPARKSTACK_LAB_CHILD") == "fail":
        # the parent reads the lab's pids first: failing at once raced its read against our own teardown
        deadline = time.monotonic() + 120
        while not (lab.root / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        pytest.fail("deliberate failure, to check teardown")
    time.sleep(120)
