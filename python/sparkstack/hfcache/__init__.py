"""The Hugging Face hub cache layout. Every other module reads and writes cache entries through here.

An entry is `hub/models--ORG--NAME/` with `blobs/`, `snapshots/<rev>/` (relative
symlinks into ../../blobs) and `refs/main`. Large (LFS) files are blobs named
by their sha256; small files by their git blob sha1.

Reading: `resolve_source`, `read_ref`, `snapshot_state`. Writing: `publish_snapshot`,
which makes a staged entry visible so that a kill at any moment leaves the entry
absent, at its previous complete revision, or complete at the new one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sparkstack import fsio
from sparkstack.errors import SparkstackError
from sparkstack.hfcache import probe
from sparkstack.safetensors_header import read_header
from sparkstack.text import printable

# A revision is a git commit hash; a small file's blob is named by its git blob sha1, of the same form; an LFS
# file's blob by its sha256. refs/main is read by hand (it is one line) rather than through
# huggingface_hub.try_to_load_from_cache, whose import alone costs ~0.16 s on every strip.
COMMIT = re.compile(r"[0-9a-f]{40}")
SHA256 = re.compile(r"[0-9a-f]{64}")

# Directories a model dir may hold that are bookkeeping, not model files.
IGNORED_DIRS = frozenset({".sparkstack", ".cache", ".git"})


@dataclass(frozen=True)
class SourceFile:
    relpath: str  # inside the snapshot / model dir, with "/" separators
    path: Path  # the real file to read (a blob, for a cache entry)
    blob: str | None  # the blob name in the entry's blobs/, when the file is a proper cache link
    size: int
    mtime_ns: int
    identity: tuple[int, int, int, int]  # (device, inode, size, mtime_ns) of the real file


@dataclass(frozen=True)
class ModelSource:
    """A model on disk: either one revision of a cache entry, or a flat model dir."""

    kind: str  # "cache" or "flat"
    root: Path  # the cache entry dir, or the flat model dir
    model_dir: Path  # snapshots/<rev> for a cache entry; the dir itself when flat
    revision: str | None
    files: tuple[SourceFile, ...]
    at_main: bool = False  # the revision is the one the entry's refs/main names

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
    if p.exists() and not p.is_dir():
        what = "a file" if p.is_file() else "not a directory"
        raise SparkstackError(f"{printable(p)}: is {what}; give the model's directory (a cache entry models--ORG--NAME, "
                              f"one of its snapshots, or a dir holding config.json), such as {printable(p.parent)}")
    if not p.is_dir():
        raise SparkstackError(f"{printable(p)}: no such directory")
    if _is_cache_entry(p):
        repo_id_from_folder(p.name)
        revision = read_ref(p)
        if revision is None:
            raise SparkstackError(f"{p}: cache entry has no refs/main; pass a snapshot dir instead")
        snapshot = p / "snapshots" / revision
        if not (snapshot / "config.json").exists():
            raise SparkstackError(f"{p}: refs/main names {revision}, but snapshots/{revision}/config.json is missing")
        return _scan("cache", p, snapshot, revision, at_main=True)
    if p.parent.name == "snapshots" and _is_cache_entry(p.parent.parent):
        if not (p / "config.json").exists():
            raise SparkstackError(f"{p}: snapshot has no config.json")
        try:
            at_main = read_ref(p.parent.parent) == p.name
        except SparkstackError:
            at_main = False
        return _scan("cache", p.parent.parent, p, p.name, at_main)
    if (p / "config.json").is_file():
        return _scan("flat", p, p, None)
    raise SparkstackError(
        f"{p}: neither an HF cache entry (models--ORG--NAME with snapshots/) nor a model dir with config.json"
    )


def _scan(kind: str, root: Path, model_dir: Path, revision: str | None, at_main: bool = False) -> ModelSource:
    blobs = (root / "blobs").resolve() if kind == "cache" else None
    # Links may point into the entry's blobs/ or stay inside the model dir; a link anywhere else would pull an
    # outside file (a secret, /proc/self/environ) into the output and whatever is shipped from it.
    inside = [p for p in (blobs, model_dir.resolve()) if p is not None]
    files = []
    for dirpath, dirnames, filenames in os.walk(model_dir):
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_DIRS)
        for name in sorted(filenames):
            link = Path(dirpath, name)
            real = link.resolve()
            if not any(real.is_relative_to(d) for d in inside):
                raise SparkstackError(f"{link}: links outside the model ({real}); refusing to read it")
            if not real.is_file():
                raise SparkstackError(f"{link}: dangling link or not a regular file")
            st = real.stat()
            blob = real.name if blobs is not None and link.is_symlink() and real.parent == blobs else None
            rel = link.relative_to(model_dir).as_posix()
            files.append(SourceFile(rel, real, blob, st.st_size, st.st_mtime_ns, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)))
    files.sort(key=lambda f: f.relpath)
    return ModelSource(kind, root, model_dir, revision, tuple(files), at_main)


NO_MTP_SUFFIX = "-no-MTP"


def no_mtp_destination(source: ModelSource) -> Path:
    """The default output: the sibling `models--ORG--NAME-no-MTP` entry, or `<dir>-no-MTP` for a flat dir."""
    return source.root.with_name(source.root.name + NO_MTP_SUFFIX)


def git_blob_name(data: bytes) -> str:
    """The name the hub gives a small (non-LFS) file's blob: its git blob sha1."""
    # Imported here: huggingface_hub 1.x reads its settings (HF_HUB_ETAG_TIMEOUT, ...) when its utils are
    # imported, and fetch checks those first, to name a bad one in one line.
    from huggingface_hub.utils.sha import git_hash

    return git_hash(data)


def blob_is_intact(path: Path, name: str) -> bool:
    """Does the blob at `path` hold what its name says? LFS blobs are named by sha256, small ones by git blob sha1."""
    try:
        if blob_algorithm(name) == "sha256":
            return fsio.sha256_file(path) == name
        return git_blob_name(path.read_bytes()) == name
    except (OSError, SparkstackError):  # unreadable, or no hub blob name at all
        return False


def snapshot_link_target(relpath: str, blob: str) -> str:
    """The relative symlink from snapshots/<rev>/<relpath> to blobs/<blob>."""
    depth = relpath.count("/")
    return "../" * (2 + depth) + "blobs/" + blob


# ---------------------------------------------------------------- paths inside an entry


def snapshot_dir(entry: Path, revision: str) -> Path:
    return entry / "snapshots" / revision


def snapshot_text(hub: str, cache_name: str, revision: str) -> str:
    """hub/<cache_name>/snapshots/<revision> as posix text: a path on another machine or in a container."""
    return f"{hub}/{cache_name}/snapshots/{revision}"


def ref_file(entry: Path, ref: str = "main") -> Path:
    """Where an entry's ref (refs/main) lives."""
    return entry / "refs" / ref


def blobs_dir(entry: Path) -> Path:
    return entry / "blobs"


# ---------------------------------------------------------------- refs


def read_ref(entry: Path, ref: str = "main") -> str | None:
    """The commit a ref names, or None when the ref file is absent. Anything but a 40-hex commit is refused."""
    path = ref_file(entry, ref)
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # a fifo here would block the read forever
            raise SparkstackError(f"{path}: is not a regular file")
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise SparkstackError(f"{path}: is a directory, not a ref file") from None
    except OSError as exc:
        raise SparkstackError(f"{path}: cannot read: {exc.strerror or exc}") from None
    revision = raw.decode("utf-8", errors="replace").strip()
    if not COMMIT.fullmatch(revision):
        raise SparkstackError(f"{path}: expected a 40-hex commit hash, found {revision[:60]!r}")
    return revision


# ---------------------------------------------------------------- completeness


@dataclass(frozen=True)
class SnapshotState:
    """What a snapshot on disk holds, and whether a loader would find every shard whole."""

    entry: Path
    revision: str | None
    complete: bool
    detail: str  # why not complete, or a one-line summary when it is
    shards: int = 0
    files: frozenset[str] = frozenset()
    tensor_names: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # per shard read: its tensors' names

    def has(self, relpath: str) -> bool:
        return relpath in self.files


def snapshot_state(entry: Path, revision: str | None = None) -> SnapshotState:
    """Check one snapshot (default: the one refs/main names): every indexed shard present, at the size its header implies."""
    if revision is None:
        revision = read_ref(entry)
        if revision is None:
            return SnapshotState(entry, None, False, f"{entry}/refs/main is missing")
    snap = snapshot_dir(entry, revision)
    files = frozenset(p.relative_to(snap).as_posix() for p in snap.rglob("*") if not p.is_dir())
    report = probe.snapshot_report(str(snap), check_sizes=False)  # no broken link; every indexed shard there
    if not report["complete"]:
        return SnapshotState(entry, revision, False, report["detail"], files=files)
    shards = report["shards"]
    names = {}
    for shard in shards:
        try:
            header = read_header(snap / shard)  # also proves the file is exactly as long as its header says
        except SparkstackError as exc:
            return SnapshotState(entry, revision, False, str(exc), files=files)
        names[shard] = tuple(t.name for t in header.tensors)
    return SnapshotState(entry, revision, True, f"{len(shards)} shards complete at {revision[:12]}", len(shards), files,
                         names)


# ---------------------------------------------------------------- publishing


def _fsync_tree(root: Path) -> None:
    for dirpath, _, _ in os.walk(root):
        fsio.fsync_dir(dirpath)


def publish_snapshot(stage: Path, entry: Path, revision: str, bookkeeping: dict[str, bytes],
                     set_main: bool = True) -> None:
    """Publish a staged entry (`stage/blobs/`, `stage/snapshots/<revision>/`) at `entry`.

    refs/main moves to `revision` when `set_main` (or when the entry has none yet). Staged blobs
    replace same-named ones: they were verified on the way in, what sits there may not be.
    `bookkeeping` files go under `entry/.sparkstack/`, written last: they record what
    was published, so they must never describe a snapshot that is not in place yet.
    """
    if not entry.exists():
        # A fresh entry appears whole, in one rename.
        (stage / "refs").mkdir()
        fsio.write_durable(stage / "refs" / "main", revision.encode())
        (stage / ".sparkstack").mkdir()
        for name, data in bookkeeping.items():
            fsio.write_durable(stage / ".sparkstack" / name, data)
        _fsync_tree(stage)
        os.rename(stage, entry)
        fsio.fsync_dir(entry.parent)
        return
    # An existing entry: blobs first (content-addressed, so an early kill leaves only unused blobs),
    # then swap the snapshot dir, then refs/main, and the bookkeeping last.
    _fsync_tree(stage)
    blobs = entry / "blobs"
    blobs.mkdir(exist_ok=True)
    for blob in sorted((stage / "blobs").iterdir()):
        os.replace(blob, blobs / blob.name)
    fsio.fsync_dir(blobs)
    (entry / "snapshots").mkdir(exist_ok=True)
    fsio.replace_dir(stage / "snapshots" / revision, entry / "snapshots" / revision)
    (entry / "refs").mkdir(exist_ok=True)
    if set_main or not (entry / "refs" / "main").exists():
        fsio.write_atomic(entry / "refs" / "main", revision.encode())
    (entry / ".sparkstack").mkdir(exist_ok=True)
    for name, data in bookkeeping.items():
        fsio.write_atomic(entry / ".sparkstack" / name, data)


# ---------------------------------------------------------------- shipping an entry to another host

def blob_algorithm(name: str) -> str:
    """How a hub blob's name proves its bytes: LFS blobs are named by their sha256, small files by their git blob sha1."""
    if SHA256.fullmatch(name):
        return "sha256"
    if COMMIT.fullmatch(name):
        return "git-sha1"
    raise SparkstackError(f"{name!r}: not a hub blob name (64-hex sha256 or 40-hex git sha1)")


def hub_path(hf_home: str, remote: bool = False) -> str:
    """The hub dir under an HF_HOME, as text: `~` expanded here, or, for another machine (`remote`), left for the
    far side to expand. The one spelling of $HF_HOME/hub."""
    if remote and hf_home.startswith("~"):
        return hf_home.rstrip("/") + "/hub"  # expanded on the far side at apply time
    return os.path.join(os.path.expanduser(hf_home), "hub")


@dataclass(frozen=True)
class EntryLayout:
    """Where one revision of an entry lives, relative to its hub: what a copy elsewhere must rebuild.

    `links` are (relpath in the snapshot, blob name, relative link target). Everything here is
    the hub's own layout, stated once so that a receiver needs no knowledge of it."""

    name: str
    revision: str
    blobs_dir: str
    snapshot_dir: str
    ref_file: str
    lock_file: str  # huggingface_hub keeps its locks under hub/.locks/<entry>/
    links: tuple[tuple[str, str, str], ...]

    def to_json(self) -> dict:
        return {"name": self.name, "revision": self.revision, "blobs_dir": self.blobs_dir, "snapshot": self.snapshot_dir,
                "ref": self.ref_file, "lock": self.lock_file, "links": [list(l) for l in self.links]}


@dataclass(frozen=True)
class EntryBlob:
    name: str
    algorithm: str
    size: int
    path: Path  # the blob file on this machine


def entry_for_copy(hub: Path, name: str) -> tuple[EntryLayout, tuple[EntryBlob, ...]]:
    """One cache entry at refs/main, as blobs plus the layout that names them. Every snapshot file must
    be a proper link into the entry's blobs (a copied-in real file has no content name to ship by)."""
    repo_id_from_folder(name)
    if "/" in name or name in (".", ".."):
        raise SparkstackError(f"{name!r}: not a cache entry name")
    entry = hub / name
    if not (entry / "snapshots").is_dir():
        raise SparkstackError(f"{entry}: no such cache entry (no snapshots/ dir)")
    source = resolve_source(entry)
    links, blobs = [], {}
    for f in source.files:
        if f.blob is None:
            raise SparkstackError(f"{source.model_dir / f.relpath}: not a link into {entry}/blobs; cannot ship it by content")
        algorithm = blob_algorithm(f.blob)
        links.append((f.relpath, f.blob, snapshot_link_target(f.relpath, f.blob)))
        blobs[f.blob] = EntryBlob(f.blob, algorithm, f.size, f.path)
    layout = EntryLayout(name, source.revision, f"{name}/blobs", f"{name}/snapshots/{source.revision}",
                         f"{name}/refs/main", f".locks/{name}/sparkstack-ship.lock", tuple(links))
    return layout, tuple(blobs[b] for b in sorted(blobs))


# ---------------------------------------------------------------- checking a snapshot on another machine


def probe_argv(hub: str, name: str, revision: str) -> list[str]:
    """An argv that checks one snapshot with nothing but python3 (a worker has no sparkstack), reading only.

    Its stdout is one JSON line, read back by `probe_result`. `hub` may start with `~`: it is expanded there."""
    return ["python3", "-c", Path(probe.__file__).read_text(), hub, name, revision]


def probe_result(stdout: str) -> tuple[bool, str] | None:
    """(complete, detail) from a probe's output, or None when it is not the probe's answer."""
    try:
        doc = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("complete"), bool) or not isinstance(doc.get("detail"), str):
        return None
    return doc["complete"], doc["detail"][:300]


# ---------------------------------------------------------------- one hub revision, fetched


@dataclass(frozen=True)
class ListedFile:
    """One file of a hub revision as the hub lists it: its path in the snapshot, its blob name, its size."""

    relpath: str
    blob: str  # sha256 for LFS files, git blob sha1 for the others: the name the cache gives its blob
    size: int

    def to_json(self) -> dict:
        return {"file": self.relpath, "blob": self.blob, "size": self.size}


def entry_name(repo_id: str) -> str:
    """`ORG/NAME` -> `models--ORG--NAME`."""
    return "models--" + repo_id.replace("/", "--")


def entry_holds(cache_name: str, repo_id: str) -> bool:
    """Does the entry `cache_name` hold revisions of `repo_id`: its own entry, or strip's output of it (same revisions)?"""
    return cache_name in (entry_name(repo_id), entry_name(repo_id) + NO_MTP_SUFFIX)


def _listing_record(revision: str) -> str:
    return f"listing-{revision}.json"


def read_listing(entry: Path, revision: str) -> tuple[ListedFile, ...] | None:
    """The file list a fetch recorded when it published `revision` (a commit's files never change), or None."""
    try:
        doc = json.loads((entry / ".sparkstack" / _listing_record(revision)).read_text())
        return tuple(ListedFile(f["file"], f["blob"], f["size"]) for f in doc["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _holds(path: Path, blob: str, size: int, blobs: Path) -> bool:
    """Is `path` (a snapshot link, or a blob itself) the blob `blob` of `size` bytes in this entry?"""
    try:
        real = path.resolve(strict=True)
        return real.parent == blobs.resolve() and real.name == blob and real.stat().st_size == size
    except (OSError, RuntimeError):
        return False


def snapshot_needs(entry: Path, revision: str, files: tuple[ListedFile, ...]) -> tuple[tuple[ListedFile, ...], ...]:
    """(present, to_link, to_download) for the snapshot at `revision`: files already linked to their blob at their
    size; files whose blob the entry holds (another revision shares it) but the snapshot lacks; the rest.
    Names and sizes only: what fetch publishes it has hashed, and nothing here re-reads gigabytes."""
    snap, blobs = snapshot_dir(entry, revision), blobs_dir(entry)
    present, to_link, to_download = [], [], []
    for f in files:
        if _holds(snap / f.relpath, f.blob, f.size, blobs):
            present.append(f)
        elif _holds(blobs / f.blob, f.blob, f.size, blobs):
            to_link.append(f)
        else:
            to_download.append(f)
    return tuple(present), tuple(to_link), tuple(to_download)


def refuse_unlisted(entry: Path, revision: str, files: tuple[ListedFile, ...], repo_id: str) -> None:
    """Publishing swaps `snapshots/<revision>` whole: a file there that the commit does not list (one a user
    added) would be lost with the old dir, so it is refused, named."""
    snap, listed = snapshot_dir(entry, revision), {f.relpath for f in files}
    for dirpath, dirnames, filenames in os.walk(snap):
        dirnames.sort()
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            path = Path(dirpath, name)
            if path.relative_to(snap).as_posix() not in listed:
                raise SparkstackError(f"{path}: not a file of {repo_id}@{revision}, and publishing replaces "
                                      "that snapshot dir whole; move it out, then fetch again")


def publish_fetched(stage_entry: Path, entry: Path, revision: str, files: tuple[ListedFile, ...],
                    repo_id: str) -> None:
    """Publish a fetch staged as a cache entry of its own (`stage_entry`: the downloaded blobs and their links).

    The staged snapshot gets a link for every other listed file (their blobs are the entry's already), then
    goes in whole, with refs/main naming `revision` and the listing recorded for the next fetch's check."""
    refuse_unlisted(entry, revision, files, repo_id)
    snap = snapshot_dir(stage_entry, revision)
    snap.mkdir(parents=True, exist_ok=True)
    blobs_dir(stage_entry).mkdir(exist_ok=True)
    shutil.rmtree(stage_entry / ".no_exist", ignore_errors=True)  # a 404 an earlier attempt met is not the commit's truth
    listed = {f.blob for f in files}
    for left in blobs_dir(stage_entry).iterdir():  # a killed download's temp file is no blob to publish
        if left.name not in listed:
            left.unlink()
    for f in files:
        link = snap / f.relpath
        if not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(snapshot_link_target(f.relpath, f.blob), link)
    record = {"revision": revision, "files": [f.to_json() for f in files]}
    publish_snapshot(stage_entry, entry, revision, {_listing_record(revision): json.dumps(record, indent=1).encode()})
