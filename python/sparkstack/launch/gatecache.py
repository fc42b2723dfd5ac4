"""Gates that passed, remembered by what decides them: the image's content (its config digest, which names every
byte of it) and the gate's own argv (the script's text included). A gate runs with no network and no GPU, so the
same image and argv give the same answer: an unchanged relaunch skips the gate and says it did. Only passes are
kept; a failure runs again next time. A record that cannot be read is no record; one that cannot be written costs
the next launch a rerun, never this one."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sparkstack import fsio
from sparkstack.state import state_root


@dataclass(frozen=True)
class Passed:
    line: str  # what the gate said when it passed
    date: str  # when (UTC, YYYY-MM-DD HH:MM)


@dataclass(frozen=True)
class GateCache:
    root: Path

    def _path(self, image_id: str, argv: Sequence[str]) -> Path:
        key = hashlib.sha256(json.dumps([image_id, list(argv)]).encode()).hexdigest()
        return self.root / f"{key}.json"

    def passed(self, image_id: str, argv: Sequence[str]) -> Passed | None:
        try:
            doc = json.loads(self._path(image_id, argv).read_text())
        except (OSError, ValueError, RecursionError):
            return None
        ok = isinstance(doc, dict) and doc.get("image") == image_id and doc.get("argv") == list(argv)
        line, date = (doc.get("line"), doc.get("date")) if ok else (None, None)
        return Passed(line, date) if isinstance(line, str) and isinstance(date, str) else None

    def record(self, image_id: str, argv: Sequence[str], line: str) -> None:
        doc = {"image": image_id, "argv": list(argv), "line": line,
               "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fsio.write_atomic(self._path(image_id, argv), (json.dumps(doc) + "\n").encode())
        except OSError:
            pass  # the next launch runs the gate again: slower, never wrong


def gate_cache() -> GateCache:
    return GateCache(state_root() / "gates")


def cached_line(passed: Passed, image_id: str) -> str:
    return f"{passed.line} (cached: passed {passed.date} UTC for {image_id[:19]} with this argv)"
