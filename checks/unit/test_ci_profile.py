"""CI's verdict must not depend on the draw: .ci/run selects the derandomized hypothesis profile."""

import os
import re
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[2]


def test_ci_selects_the_derandomized_profile():
    script = (ROOT / ".ci/run").read_text()
    assert re.search(r"^export .*\bSPARKSTACK_HYPOTHESIS_PROFILE=ci\b", script, re.M), "CI must select the ci profile"


@pytest.mark.skipif(os.environ.get("SPARKSTACK_HYPOTHESIS_PROFILE") != "ci", reason="only under CI's profile")
def test_the_ci_profile_is_deterministic():
    assert settings.default.derandomize is True
    assert settings.default.database is None
