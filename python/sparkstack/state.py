"""The state directory: launch's run records and `up`'s last record, under one root."""

from __future__ import annotations

import json
import os
from pathlib import Path


def state_root() -> Path:
    """$SPARKSTACK_STATE_DIR, else $XDG_STATE_HOME/sparkstack, else ~/.local/state/sparkstack."""
    base = os.environ.get("SPARKSTACK_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "sparkstack")
    return Path(base)


def launch_runs_dir() -> Path:
    return state_root() / "runs"


def up_record_path() -> Path:
    return state_root() / "up" / "last.json"


def read_up_record() -> dict | None:
    """The last `up`'s record, or None when there is none (or it is unreadable)."""
    try:
        doc = json.loads(up_record_path().read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
