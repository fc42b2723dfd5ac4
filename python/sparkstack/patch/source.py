"""Where an overlay's files come from: the one resolver behind every --overlay-src.

Three shapes are accepted, because the user may hold any of them:
  - an upstream checkout at the pinned rev, with `<subdir>/` (overlay-dflash2/) at its root;
  - the blog's working directory, given as its root (files sit under `files/<subdir>/`) or as its `files/`;
  - the blog's bundle file (tar, tar.gz or zip, with or without one top-level directory).
A dir that already holds the files themselves is accepted too (the old meaning of --overlay-src).

A bundle is hashed before any byte of it is parsed and must match `[source] bundle_sha256`; it is then
unpacked, refusing anything but plain files and dirs inside the tree, into a scratch dir that is removed
on every exit.
"""

from __future__ import annotations

import hashlib
import shutil
import stat
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sparkstack import fsio
from sparkstack.errors import SparkstackError
from sparkstack.patch.overlay import UNPINNED, Overlay, SourceFile, Step

# The blog's bundle is a few hundred kB of text; these bound what a hostile archive can make us write.
MAX_BUNDLE_MEMBERS = 10_000
MAX_BUNDLE_BYTES = 256 << 20
_CHUNK = 1 << 20


def source_files(overlay: Overlay, steps: tuple[Step, ...]) -> tuple[SourceFile, ...]:
    """The files a run with these steps reads from the overlay source: every install, then each step's script."""
    return tuple(i.file for i in overlay.installs) + tuple(s.script for s in steps)


def locate_files(overlay: Overlay, root: Path, label: str | None = None) -> Path:
    """The dir holding the overlay's files under `root`, in whichever layout it has."""
    candidates = (root / overlay.subdir, root / "files" / overlay.subdir, root)
    first = overlay.installs[0].file.path if overlay.installs else None
    holders = [c for c in candidates if c.is_dir() and (first is None or (c / first).is_file())]
    if len(holders) > 1 and first is not None:
        # Two layouts in one dir (a checkout with the blog's tree copied in): taking the first silently could pin
        # the files the user did not mean; the same bytes in both is no question.
        paths = [i.file.path for i in overlay.installs]
        def read(c: Path, p: str) -> bytes | None:
            return (c / p).read_bytes() if (c / p).is_file() else None
        differ = [p for p in paths if len({read(c, p) for c in holders}) > 1]
        if differ:
            raise SparkstackError(f"{label or root}: holds the overlay's files in {len(holders)} layouts ("
                                  f"{', '.join(str(c) for c in holders)}) and they differ ({', '.join(differ[:3])}"
                                  f"{' ...' if len(differ) > 3 else ''}); pass the one you mean as --overlay-src")
    if holders:
        return holders[0]
    # No candidate holds the first file: keep the old answer (subdir if present, else root) so the
    # missing-file message names the place the user most likely meant.
    for cand in candidates:
        if cand.is_dir():
            return cand
    raise SparkstackError(f"{label or root}: overlay source dir does not exist")


def require_source(overlay: Overlay, given: Path | None) -> Path:
    """--overlay-src is given and names a dir or a regular file; checked before anything else is read."""
    if given is None:
        raise SparkstackError(f"no overlay source: pass --overlay-src DIR or BUNDLE, a checkout of {overlay.repo} "
                              f"at {overlay.rev}, the blog's working directory, or its bundle")
    if not given.exists():
        raise SparkstackError(f"{given}: overlay source does not exist (expected a dir or a bundle file)")
    if not given.is_dir() and not given.is_file():  # a fifo would block the hash forever
        raise SparkstackError(f"{given}: overlay source is neither a dir nor a regular file")
    return given


@contextmanager
def opened_source(overlay: Overlay, given: Path | None) -> Iterator[Path]:
    """Yield the dir holding the overlay's files for --overlay-src `given` (a dir or a bundle file)."""
    require_source(overlay, given)
    if given.is_dir():
        yield locate_files(overlay, given)
        return
    with open(given, "rb") as f:
        _check_bundle_hash(overlay, given, f)
        with fsio.staging_dir(Path(tempfile.gettempdir()), "bundle") as scratch:
            tree = scratch / "tree"
            tree.mkdir()
            _unpack(given, f, tree)
            entries = list(tree.iterdir())
            root = entries[0] if len(entries) == 1 and entries[0].is_dir() else tree
            yield locate_files(overlay, root, label=f"{given} (unpacked)")


def _check_bundle_hash(overlay: Overlay, given: Path, f) -> None:
    """Hash the whole file through the one open descriptor, so what is unpacked is what was hashed."""
    h = hashlib.sha256()
    while chunk := f.read(_CHUNK):
        h.update(chunk)
    actual = h.hexdigest()
    if overlay.bundle_sha256 is None:
        raise SparkstackError(f"{given}: sha256 {actual}; {overlay.path} pins no bundle ([source] bundle_sha256), "
                              "so a bundle cannot be checked; pass a dir instead")
    if actual != overlay.bundle_sha256:
        raise SparkstackError(f"{given}: sha256 {actual} is not the pinned bundle {overlay.bundle_sha256} "
                              f"({overlay.path} [source] bundle_sha256); refused, nothing written")
    f.seek(0)


def _member_path(bundle: Path, name: str) -> tuple[str, ...]:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or "\\" in name or "\0" in name or ".." in parts:
        raise SparkstackError(f"{bundle}: member {name!r} would land outside the bundle's tree; refused")
    return tuple(parts)


class _Budget:
    """Counts what an archive actually unpacks (not what its headers claim)."""

    def __init__(self, bundle: Path):
        self.bundle, self.members, self.bytes = bundle, 0, 0

    def member(self) -> None:
        self.members += 1
        if self.members > MAX_BUNDLE_MEMBERS:
            raise SparkstackError(f"{self.bundle}: more than {MAX_BUNDLE_MEMBERS} members; not the blog's bundle")

    def add(self, n: int) -> None:
        self.bytes += n
        if self.bytes > MAX_BUNDLE_BYTES:
            raise SparkstackError(f"{self.bundle}: unpacks to more than {MAX_BUNDLE_BYTES} bytes; not the blog's bundle")


def _write_member(bundle: Path, tree: Path, parts: tuple[str, ...], reader, budget: _Budget) -> None:
    target = tree.joinpath(*parts)
    if target.exists() or target.is_symlink():
        raise SparkstackError(f"{bundle}: member {'/'.join(parts)} appears twice; refused")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "xb") as out:
        while chunk := reader.read(_CHUNK):
            budget.add(len(chunk))
            out.write(chunk)


def _unpack(bundle: Path, f, tree: Path) -> None:
    budget = _Budget(bundle)
    try:
        if zipfile.is_zipfile(f):
            f.seek(0)
            _unpack_zip(bundle, f, tree, budget)
        else:
            f.seek(0)
            _unpack_tar(bundle, f, tree, budget)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
        shutil.rmtree(tree, ignore_errors=True)
        raise SparkstackError(f"{bundle}: not a readable tar, tar.gz or zip ({exc})") from None
    except SparkstackError:
        shutil.rmtree(tree, ignore_errors=True)
        raise


def _unpack_tar(bundle: Path, f, tree: Path, budget: _Budget) -> None:
    with tarfile.open(fileobj=f, mode="r:*") as tar:
        for m in tar:
            budget.member()
            parts = _member_path(bundle, m.name)
            if m.isdir():
                if parts:
                    tree.joinpath(*parts).mkdir(parents=True, exist_ok=True)
            elif m.isreg() and parts:
                reader = tar.extractfile(m)
                _write_member(bundle, tree, parts, reader, budget)
            else:
                kind = "link" if m.issym() or m.islnk() else "device or special file"
                raise SparkstackError(f"{bundle}: member {m.name!r} is a {kind}; a bundle holds only files and dirs")


def _unpack_zip(bundle: Path, f, tree: Path, budget: _Budget) -> None:
    with zipfile.ZipFile(f) as zf:
        for info in zf.infolist():
            budget.member()
            parts = _member_path(bundle, info.filename)
            mode = info.external_attr >> 16
            if info.is_dir():
                if parts:
                    tree.joinpath(*parts).mkdir(parents=True, exist_ok=True)
            elif stat.S_IFMT(mode) in (0, stat.S_IFREG) and parts:  # many zip writers set no file type
                with zf.open(info) as reader:
                    _write_member(bundle, tree, parts, reader, budget)
            else:
                raise SparkstackError(f"{bundle}: member {info.filename!r} is a link or special file; "
                                      "a bundle holds only files and dirs")


def check_pinned(overlay: Overlay, source_dir: Path, files: tuple[SourceFile, ...], given: Path) -> None:
    """Refuse a source whose files differ from the pins, naming every such file with both hashes."""
    bad = []
    for f in files:
        path = source_dir / f.path
        if f.sha256 == UNPINNED:
            continue
        if not path.is_file():
            bad.append(f"{f.path}: missing, pinned {f.sha256}")
            continue
        actual = fsio.sha256_file(path)
        if actual != f.sha256:
            bad.append(f"{f.path}: sha256 {actual} does not match the pinned {f.sha256}")
    if bad:
        raise SparkstackError(f"{given}: {len(bad)} overlay file(s) differ from the pins in {overlay.path}: "
                              + "; ".join(bad))
