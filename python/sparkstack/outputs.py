"""Outputs sparkstack writes, and the rule that it never replaces what it did not write.

Every output directory carries `.sparkstack/output.json`, naming the command that
wrote it (and, where the command keeps one, the fingerprint of its inputs). A
`.tar` output carries the same facts as annotations in its index.json. An
existing `--out` without them is refused: it may hold someone's data.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sparkstack import fsio
from sparkstack.errors import SparkstackError

MARKER = Path(".sparkstack") / "output.json"
# index.json annotations of a .tar output
WRITTEN_BY = "org.sparkstack.written-by"
FINGERPRINT = "org.sparkstack.fingerprint"


@dataclass(frozen=True)
class OutputMarker:
    command: str  # e.g. "sparkstack strip"
    fingerprint: str | None = None
    files: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (relpath, fsio.file_identity) of what the output holds

    def to_bytes(self) -> bytes:
        doc = {"written_by": self.command, "fingerprint": self.fingerprint}
        if self.files:
            doc["files"] = {rel: list(identity) for rel, identity in self.files}
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()

    def files_unchanged(self, root: Path) -> bool:
        """Is every recorded file still the very file that was written (no in-place edit since)?"""
        try:
            return all(tuple(fsio.file_identity(root / rel)) == tuple(ident) for rel, ident in self.files)
        except OSError:
            return False

    def annotations(self) -> dict[str, str]:
        return {WRITTEN_BY: self.command, **({FINGERPRINT: self.fingerprint} if self.fingerprint else {})}


def read_marker(directory: Path) -> OutputMarker | None:
    """The marker of an output dir, or None when there is none (or it is unreadable)."""
    try:
        doc = json.loads((directory / MARKER).read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("written_by"), str):
        return None
    fingerprint = doc.get("fingerprint")
    files = doc.get("files")
    recorded: tuple = ()
    if isinstance(files, dict) and all(isinstance(v, list) and all(type(x) is int for x in v) for v in files.values()):
        recorded = tuple((str(k), tuple(v)) for k, v in sorted(files.items()))
    return OutputMarker(doc["written_by"], fingerprint if isinstance(fingerprint, str) else None, recorded)


def marker_from_annotations(annotations: object) -> OutputMarker | None:
    if not isinstance(annotations, dict) or not isinstance(annotations.get(WRITTEN_BY), str):
        return None
    fingerprint = annotations.get(FINGERPRINT)
    return OutputMarker(annotations[WRITTEN_BY], fingerprint if isinstance(fingerprint, str) else None)


def _refuse_cwd(path: Path) -> None:
    """Replacing the working directory (or a dir holding it) would leave the shell in a deleted dir."""
    if not str(path):
        raise SparkstackError("--out is empty; name a path")
    cwd = Path.cwd().resolve()
    if cwd == path.resolve() or cwd.is_relative_to(path.resolve()):
        raise SparkstackError(f"{path}: is the working directory or holds it; choose another --out")


def _existing(path: Path, option: str = "--out") -> bool:
    """Whether something is at `path` that a claim must judge; refuses what may never be replaced."""
    _refuse_cwd(path)
    if path.is_symlink():
        raise SparkstackError(f"{path}: is a symlink; refusing to replace it (choose another {option})")
    return path.exists()


def _same_command(path: Path, marker: OutputMarker, command: str, option: str = "--out") -> OutputMarker:
    if marker.command != command:
        raise SparkstackError(f"{path}: was written by `{marker.command}`, not `{command}`; choose another {option}")
    return marker


def claim_dir(path: Path, command: str) -> OutputMarker | None:
    """May `command` write the directory `path`? Returns the previous output's marker, or None when `path`
    is absent or an empty dir. Refuses (one line) anything sparkstack did not write, or another command wrote."""
    if not _existing(path):
        return None
    if not path.is_dir():
        raise SparkstackError(f"{path}: exists and is not a directory sparkstack wrote; choose another --out")
    marker = read_marker(path)
    if marker is None:
        if not any(path.iterdir()):
            return None
        raise SparkstackError(f"{path}: exists, is not empty and was not written by sparkstack "
                              f"(no {MARKER}); refusing to replace it: choose another --out or remove it yourself")
    return _same_command(path, marker, command)


def claim_file(path: Path, command: str, read_archive_marker: Callable[[Path], OutputMarker | None], *,
               what: str = "an archive", option: str = "--out") -> OutputMarker | None:
    """May `command` write the file `path` (`what` it is, given by `option`)? Like claim_dir, for a single file
    whose marker the caller reads."""
    if not _existing(path, option):
        return None
    if not path.is_file():
        raise SparkstackError(f"{path}: exists and is not a file; choose another {option}")
    marker = read_archive_marker(path)
    if marker is None:
        raise SparkstackError(f"{path}: exists and is not {what} sparkstack wrote; refusing to replace it: "
                              f"choose another {option} or remove it yourself")
    return _same_command(path, marker, command, option)
