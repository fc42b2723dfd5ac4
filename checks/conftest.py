import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECKS = Path(__file__).parent
sys.path.insert(0, str(CHECKS))


from clirun import sparkstack_cmd  # noqa: E402


@pytest.fixture
def run_cli():
    """Run the real CLI in a subprocess, as a user would."""

    def run(*args, env=None, check=None):
        full_env = dict(os.environ, **(env or {}))
        proc = subprocess.run(sparkstack_cmd() + [str(a) for a in args], capture_output=True, text=True, env=full_env)
        if check is not None:
            assert proc.returncode == check, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        return proc

    return run
