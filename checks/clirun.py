"""How tests start the real CLI: the interpreter running the tests, `-m sparkstack.cli` (no installed script needed)."""

import sys


def sparkstack_cmd() -> list[str]:
    return [sys.executable, "-m", "sparkstack.cli"]
