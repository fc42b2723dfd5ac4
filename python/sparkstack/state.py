"""Where sparkstack keeps what it remembers between runs: launch's run records and up's last run.

The root is $SPARKSTACK_STATE_DIR, else $XDG_STATE_HOME/sparkstack, else ~/.local/state/sparkstack (the XDG
base directory rule for state that outlives a run but is not worth backing up).
"""

from __future__ import annotations

import os
from pathlib import Path


def state_root() -> Path:
    base = os.environ.get("SPARKSTACK_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "sparkstack")
    return Path(base)


def launch_runs_dir() -> Path:
    """launch's run records, one `<run id>.json` each, and `latest`."""
    return state_root() / "runs"


def sweeps_dir() -> Path:
    """sweep's records, one `<sweep id>.json` each, with its cells' bench documents beside it."""
    return state_root() / "sweeps"


def up_record_path() -> Path:
    """up's record of its last run, which the next `up` resumes from."""
    return state_root() / "up" / "last.json"


def read_up_record() -> dict | None:
    """The last `up`'s record, or None when there is none (or it is unreadable)."""
    import json

    try:
        doc = json.loads(up_record_path().read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
