"""The Hugging Face hub cache layout: resolving a model source and naming blobs the way the hub does.

An entry is `hub/models--ORG--NAME/` with `blobs/`, `snapshots/<rev>/` (relative
symlinks into ../../blobs) and `refs/main`. Large (LFS) files are blobs named
by their sha256; small files by their git blob sha1.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub.utils.sha import git_hash

from sparkstack.errors import SparkstackError

# A revision is a git commit hash. refs/main is read by hand (it is one line) rather than through
# huggingface_hub.try_to_load_from_cache, whose import alone costs ~0.16 s on every strip.
_REVISION = re.compile(r"[0-9a-f]{40}")

# Directories a model dir may hold that are bookkeeping, not model files.
IGNORED_DIRS = frozenset({".sparkstack", ".cache", ".git"})


@dataclass(frozen=True)
class SourceFile:
    relpath: str  # inside the snapshot / model dir, with "/" separators
    path: Path  # the real file to read (a blob, for a cache entry)
    blob: str | None  # the blob name in the entry's blobs/, when the file is a proper cache link
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class ModelSource:
    """A model on disk: either one revision of a cache entry, or a flat model dir."""

    kind: str  # "cache" or "flat"
    root: Path  # the cache entry dir, or the flat model dir
    model_dir: Path  # snapshots/<rev> for a cache entry; the dir itself when flat
    revision: str | None
    files: tuple[SourceFile, ...]

    def file(self, relpath: str) -> SourceFile | None:
        for f in self.files:
            if f.relpath == relpath:
                return f
        return None


def repo_id_from_folder(folder: str) -> str:
    """`models--ORG--NAME` -> `ORG/NAME`."""
    parts = folder.split("--")
    if len(parts) < 2 or parts[0] != "models" or not all(parts[1:]):
        raise SparkstackError(f"{folder}: not a model cache entry name (expected models--ORG--NAME)")
    return "/".join(parts[1:])


def _is_cache_entry(path: Path) -> bool:
    return path.name.startswith("models--") and (path / "snapshots").is_dir()


def resolve_source(path: str | os.PathLike) -> ModelSource:
    """Work out what SRC is: a cache entry (at refs/main), one snapshot of it, or a flat model dir."""
    p = Path(path).absolute()
    if not p.is_dir():
        raise SparkstackError(f"{p}: no such directory")
    if _is_cache_entry(p):
        repo_id_from_folder(p.name)
        ref = p / "refs" / "main"
        if not ref.is_file():
            raise SparkstackError(f"{p}: cache entry has no refs/main; pass a snapshot dir instead")
        revision = ref.read_text().strip()
        if not _REVISION.fullmatch(revision):
            raise SparkstackError(f"{ref}: expected a 40-hex commit hash, found {revision[:60]!r}")
        snapshot = p / "snapshots" / revision
        if not (snapshot / "config.json").exists():
            raise SparkstackError(f"{p}: refs/main names {revision}, but snapshots/{revision}/config.json is missing")
        return _scan("cache", p, snapshot, revision)
    if p.parent.name == "snapshots" and _is_cache_entry(p.parent.parent):
        if not (p / "config.json").exists():
            raise SparkstackError(f"{p}: snapshot has no config.json")
        return _scan("cache", p.parent.parent, p, p.name)
    if (p / "config.json").is_file():
        return _scan("flat", p, p, None)
    raise SparkstackError(
        f"{p}: neither an HF cache entry (models--ORG--NAME with snapshots/) nor a model dir with config.json"
    )


def _scan(kind: str, root: Path, model_dir: Path, revision: str | None) -> ModelSource:
    blobs = (root / "blobs").resolve() if kind == "cache" else None
    files = []
    for dirpath, dirnames, filenames in os.walk(model_dir):
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_DIRS)
        for name in sorted(filenames):
            link = Path(dirpath, name)
            real = link.resolve()
            if not real.is_file():
                raise SparkstackError(f"{link}: dangling link or not a regular file")
            st = real.stat()
            blob = real.name if blobs is not None and link.is_symlink() and real.parent == blobs else None
            rel = link.relative_to(model_dir).as_posix()
            files.append(SourceFile(rel, real, blob, st.st_size, st.st_mtime_ns))
    files.sort(key=lambda f: f.relpath)
    return ModelSource(kind, root, model_dir, revision, tuple(files))


def no_mtp_destination(source: ModelSource) -> Path:
    """The default output: the sibling `models--ORG--NAME-no-MTP` entry, or `<dir>-no-MTP` for a flat dir."""
    return source.root.with_name(source.root.name + "-no-MTP")


def git_blob_name(data: bytes) -> str:
    """The name the hub gives a small (non-LFS) file's blob: its git blob sha1."""
    return git_hash(data)


def snapshot_link_target(relpath: str, blob: str) -> str:
    """The relative symlink from snapshots/<rev>/<relpath> to blobs/<blob>."""
    depth = relpath.count("/")
    return "../" * (2 + depth) + "blobs/" + blob
