"""Durable file operations: fsynced writes, atomic renames, verified range copies.

Everything that publishes output goes through here, so a kill -9 at any moment
leaves either nothing, the old version, or a complete and verified new one.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sparkstack.errors import SparkstackError

CHUNK = 8 << 20
# Copy methods, best first. SPARKSTACK_COPY_METHOD forces one (tests use it to cover each path).
COPY_METHODS = ("copy_file_range", "sendfile", "readwrite")
# errnos that mean "this method is not available here", not "the copy failed".
_UNSUPPORTED = {errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_identity(path: str | os.PathLike) -> tuple[int, int, int, int]:
    """(device, inode, size, mtime) of the file `path` resolves to: an in-place edit changes it, a rename does not.

    ctime is left out: hardlinking a file (as outputs here do with their inputs) changes it."""
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def fsync_dir(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: str | os.PathLike, data: bytes) -> None:
    """Write a new file and fsync it. Callers make it visible by renaming its directory or itself."""
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Replace `path` with `data` so readers see either the old or the new content, never a mix.

    The new file keeps the mode of the one it replaces; a new one gets 0666 less the umask, as open() gives."""
    path = Path(path)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = None
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)  # the umask applies
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


@contextmanager
def staging_dir(beside: Path, label: str) -> Iterator[Path]:
    """A scratch dir on the destination's filesystem (so renames are atomic), removed on any exit."""
    beside.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_staging(beside, label)
    tmp = Path(tempfile.mkdtemp(dir=beside, prefix=f".sparkstack-{label}-{os.getpid()}-", suffix=".tmp"))
    os.chmod(tmp, 0o755)  # mkdtemp makes 0700; the published dir must read like any other
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _remove_abandoned_staging(beside: Path, label: str) -> None:
    """Staging dirs left by a killed run carry its pid; remove those whose process is gone."""
    prefix = f".sparkstack-{label}-"
    for old in beside.glob(prefix + "*.tmp"):
        pid = old.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(old, ignore_errors=True)


def replace_dir(new: Path, dest: Path) -> None:
    """Move the complete dir `new` to `dest`. An existing `dest` is swapped with it in one step, then removed.

    Readers of `dest` see the old tree or the new one, never neither: Linux's renameat2(RENAME_EXCHANGE).
    Where the filesystem cannot exchange, the old `dest` is moved aside first, and a kill between the two
    renames leaves `dest` absent and the old copy under a hidden name, never a mixture; the next run rebuilds it.
    """
    if dest.is_dir() and not dest.is_symlink() and exchange(new, dest):
        fsync_dir(dest.parent)
        shutil.rmtree(new, ignore_errors=True)  # the old tree, now under the staged name
        return
    old = None
    if dest.exists() or dest.is_symlink():
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        os.replace(dest, old)
    os.replace(new, dest)
    fsync_dir(dest.parent)
    if old is not None:
        if old.is_symlink():
            old.unlink()
        else:
            shutil.rmtree(old, ignore_errors=True)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically (renameat2 with RENAME_EXCHANGE). False where this system or
    filesystem cannot; any other failure raises."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # not glibc >= 2.28
        return False
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    fn.restype = ctypes.c_int
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in _UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), str(b))


def link_or_copy(src: Path, dst: Path, on_progress: Callable[[int], None] | None = None) -> str:
    """Hardlink `src` to `dst`; across filesystems, copy it (reflinking where the filesystem can).

    Returns "link" or "copy".
    """
    try:
        os.link(src, dst)
        return "link"
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
    size = src.stat().st_size
    with open(src, "rb") as fin, open(dst, "x+b") as fout:
        RangeCopier().copy(fin.fileno(), 0, fout.fileno(), 0, size, on_progress=on_progress)
        os.fsync(fout.fileno())
    return "copy"


class RangeCopier:
    """Copies byte ranges between files, then checks each chunk of the destination against the source.

    The kernel does the copy (copy_file_range, which reflinks on CoW filesystems;
    then sendfile; then plain read/write). Each chunk is read back from both sides
    while it is still in the page cache, compared byte for byte and fed to the
    caller's hash: one streaming pass, no second read of the output later.
    """

    def __init__(self, method: str | None = None) -> None:
        forced = method or os.environ.get("SPARKSTACK_COPY_METHOD")
        if forced and forced not in COPY_METHODS:
            raise SparkstackError(f"SPARKSTACK_COPY_METHOD={forced!r}: expected one of {', '.join(COPY_METHODS)}")
        self._methods = [forced] if forced else list(COPY_METHODS)
        self._src_buf = bytearray(CHUNK)
        self._dst_buf = bytearray(CHUNK)

    @property
    def method(self) -> str:
        return self._methods[0]

    def copy(self, src_fd: int, src_off: int, dst_fd: int, dst_off: int, length: int,
             digest=None, on_progress: Callable[[int], None] | None = None) -> None:
        while length > 0:
            n = min(CHUNK, length)
            self._copy_chunk(src_fd, src_off, dst_fd, dst_off, n)
            self._verify_chunk(src_fd, src_off, dst_fd, dst_off, n, digest)
            src_off += n
            dst_off += n
            length -= n
            if on_progress:
                on_progress(n)

    def _copy_chunk(self, src_fd: int, src_off: int, dst_fd: int, dst_off: int, n: int) -> None:
        while True:
            method = self._methods[0]
            try:
                if method == "copy_file_range":
                    self._loop(lambda o, k: os.copy_file_range(src_fd, dst_fd, k, src_off + o, dst_off + o), n)
                elif method == "sendfile":
                    os.lseek(dst_fd, dst_off, os.SEEK_SET)
                    self._loop(lambda o, k: os.sendfile(dst_fd, src_fd, src_off + o, k), n)
                else:
                    self._loop(lambda o, k: self._pread_pwrite(src_fd, src_off + o, dst_fd, dst_off + o, k), n)
                return
            except OSError as exc:
                if exc.errno in _UNSUPPORTED and len(self._methods) > 1:
                    self._methods.pop(0)
                    continue
                raise

    @staticmethod
    def _loop(step: Callable[[int, int], int], n: int) -> None:
        done = 0
        while done < n:
            moved = step(done, n - done)
            if moved == 0:
                raise SparkstackError("source file ended early: it changed or was truncated while being copied")
            done += moved

    def _pread_pwrite(self, src_fd: int, src_off: int, dst_fd: int, dst_off: int, k: int) -> int:
        view = memoryview(self._src_buf)[:k]
        got = os.preadv(src_fd, [view], src_off)
        if got == 0:
            return 0
        return os.pwrite(dst_fd, view[:got], dst_off)

    def _verify_chunk(self, src_fd: int, src_off: int, dst_fd: int, dst_off: int, n: int, digest) -> None:
        a = self._read_exact(src_fd, self._src_buf, src_off, n)
        b = self._read_exact(dst_fd, self._dst_buf, dst_off, n)
        if a != b:
            raise SparkstackError(f"verification failed: destination bytes at offset {dst_off} differ from the source")
        if digest is not None:
            digest.update(b)

    @staticmethod
    def _read_exact(fd: int, buf: bytearray, off: int, n: int):
        view = memoryview(buf)[:n]
        got = 0
        while got < n:
            k = os.preadv(fd, [view[got:]], off + got)
            if k == 0:
                raise SparkstackError("file ended early while verifying a copy")
            got += k
        # Full-size chunks compare as bytearrays (memcmp); the short tail is copied once.
        return buf if n == len(buf) else bytes(view)


def lock_path(dest: Path) -> Path:
    """Beside the destination, so it never lands inside the source nor inside what gets replaced."""
    return dest.parent / f".{dest.name}.sparkstack-lock"


@contextmanager
def dest_lock(dest: Path, on_wait: Callable[[Path, int | None], None]) -> Iterator[None]:
    """Hold an exclusive flock for one destination; a second run for it waits here.

    The holder writes its pid into the lock file (for the waiting line) and unlinks the file before
    releasing, so nothing is left behind. A waiter that wakes on an unlinked file retries on a fresh one.
    The kernel drops the lock when a holder dies, so a kill -9 leaves no stale lock.
    """
    path = lock_path(dest)
    path.parent.mkdir(parents=True, exist_ok=True)
    told = False
    while True:
        # O_NOFOLLOW: a planted symlink must not get some other file truncated.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not told:
                    on_wait(dest, _holder_pid(fd))
                    told = True
                fcntl.flock(fd, fcntl.LOCK_EX)
            if _still_linked(fd, path):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)


def _holder_pid(fd: int) -> int | None:
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() and len(text) < 12 else None


def _still_linked(fd: int, path: Path) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)
