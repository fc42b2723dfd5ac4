"""The head's side of the ship protocol: the helper over ssh, and the bytes of each blob.

Every connection runs `python3 -c BOOT` on the host (through remote.Runner: the system ssh, strict
host keys, `shlex.join` of that argv). BOOT reads the helper's compressed source from stdin and runs
it; the request follows as one JSON line. Payload bytes go with sendfile(2) from the blob's file
into ssh's stdin pipe: the head never copies them through Python.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from sparkstack.errors import SparkstackError
from sparkstack.remote import Runner
from sparkstack.ship.plan import Blob, BlobState, Inventory, Room

PROTOCOL = 1
BOOT = ("import sys,zlib;r=sys.stdin.buffer;n=int(r.readline());"
        "exec(compile(zlib.decompress(r.read(n)),'sparkstack-ship-helper','exec'))")
REPLY_LIMIT = 64 << 20  # an inventory of tens of thousands of blobs fits; a runaway reply does not
SEND_CHUNK = 8 << 20


@lru_cache(maxsize=1)
def helper_payload() -> bytes:
    return zlib.compress((Path(__file__).with_name("helper.py")).read_bytes(), 9)


class ShipError(SparkstackError):
    pass


class Mismatch(ShipError):
    """The host hashed what arrived and it was not the blob's name; it kept nothing."""


class Session:
    """One ssh connection running the helper for one request."""

    def __init__(self, runner: Runner, request: dict) -> None:
        self.runner = runner
        self.proc = runner.popen(["python3", "-c", BOOT])
        self.fd = self.proc.stdin.fileno()
        self._err = bytearray()
        self._drain = threading.Thread(target=self._read_err, daemon=True)
        self._drain.start()
        try:
            import fcntl
            fcntl.fcntl(self.fd, 1031, 1 << 20)  # F_SETPIPE_SZ: bigger pipe, fewer wakeups of ssh (best effort)
        except OSError:
            pass
        payload = helper_payload()
        self.write(b"%d\n" % len(payload) + payload)
        self.send({"protocol": PROTOCOL, **request})

    def _read_err(self) -> None:
        for chunk in iter(lambda: self.proc.stderr.read1(65536), b""):
            self._err += chunk
            del self._err[:-8192]  # only the last lines can ever be shown

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view):]
        except BrokenPipeError:
            raise self.failure() from None

    def send(self, doc: dict) -> None:
        self.write(json.dumps(doc, separators=(",", ":")).encode() + b"\n")

    def receive(self) -> dict:
        line = self.proc.stdout.readline(REPLY_LIMIT)
        if not line:
            raise self.failure()
        if not line.endswith(b"\n"):
            raise ShipError(f"the helper's reply is not one line of at most {REPLY_LIMIT} bytes")
        try:
            doc = json.loads(line)
        except ValueError:
            raise ShipError(f"the helper answered something that is not JSON: {line[:80]!r}") from None
        if not isinstance(doc, dict):
            raise ShipError("the helper's reply is not a JSON object")
        if doc.get("ok") is False:
            raise (Mismatch if doc.get("mismatch") is True else ShipError)(_one_line(doc.get("error")))
        return doc

    def failure(self) -> ShipError:
        """Why the connection ended: the helper's own error line if it sent one, else ssh's last stderr line."""
        for line in self.proc.stdout.read().splitlines() if self.proc.stdout else []:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and doc.get("ok") is False:
                self.close(kill=True)
                return ShipError(_one_line(doc.get("error")))
        self.close(kill=True)
        lines = [l.strip() for l in bytes(self._err).decode(errors="replace").splitlines() if l.strip()]
        lines = [l for l in lines if not l.startswith("Warning: Permanently added")]
        return ShipError(lines[-1] if lines else f"ssh exited {self.proc.returncode} without a reply")

    def close(self, kill: bool = False) -> int:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        if kill:
            try:
                code = self.proc.wait(timeout=10)
            except Exception:  # noqa: BLE001 - a hung ssh is killed, whatever the wait raised
                self.proc.kill()
                code = self.proc.wait()
        else:
            code = self.proc.wait()
        self._drain.join(timeout=5)
        return code


def _one_line(value: object) -> str:
    text = str(value or "the helper failed without saying why")
    return " ".join(text.split())[:500]


# ---------------------------------------------------------------- inventory


def inventory(runner: Runner, request: dict) -> Inventory:
    s = Session(runner, {"op": "inventory", **request})
    try:
        doc = s.receive()
    finally:
        s.close(kill=True)
    return parse_inventory(doc)


def parse_inventory(doc: dict) -> Inventory:
    """The host's answer, held to its shape: every value another machine sent is checked before use."""
    def bad(what: str) -> ShipError:
        return ShipError(f"malformed inventory ({what})")

    if doc.get("protocol") != PROTOCOL:
        raise bad("protocol")
    blobs = {}
    for key, st in (doc.get("blobs") or {}).items():
        if not isinstance(st, dict) or st.get("state") not in ("present", "partial", "missing", "corrupt"):
            raise bad(f"blob {key}")
        have = st.get("have", 0)
        if not isinstance(have, int) or have < 0:
            raise bad(f"blob {key} partial length")
        blobs[key] = BlobState(st["state"], have)
    docker = doc.get("docker") or {}
    if not isinstance(docker, dict):
        raise bad("docker")
    entries = {}
    for name, st in (doc.get("entries") or {}).items():
        if not isinstance(st, dict):
            raise bad(f"entry {name}")
        entries[name] = (st.get("snapshot_current") is True, st.get("ref_current") is True)
    room = {}
    for area, r in (doc.get("free") or {}).items():
        if not (isinstance(r, dict) and all(isinstance(r.get(k), int) for k in ("bytes", "device"))):
            raise bad(f"free space of {area}")
        room[area] = Room(r["bytes"], r["device"], str(r.get("at")))
    roots = doc.get("roots") or {}
    err = docker.get("error")
    held = docker.get("layers_held", 0)
    if not isinstance(held, int) or held < 0:
        raise bad("layers held by docker")
    return Inventory(blobs, None if err is None else _one_line(err), docker.get("holds") is True,
                     docker.get("named") is True, held, entries, room,
                     {str(k): str(v) for k, v in roots.items()} if isinstance(roots, dict) else {},
                     str(doc.get("python", "?")))


# ---------------------------------------------------------------- streams


@dataclass(frozen=True)
class Attempt:
    """What one try at one blob did."""

    sent: int  # payload bytes written to the connection
    resumed: int  # bytes of the host's verified partial that were not sent again
    restarted: bool  # the host held a partial whose prefix did not hash like ours: sent from byte 0
    refused: str | None = None  # the host's line when what arrived did not hash to the blob's name (it kept nothing)


class Stream:
    """One ssh connection receiving blobs one after another."""

    def __init__(self, runner: Runner, hub: str) -> None:
        self.session = Session(runner, {"op": "recv", "hub": hub})
        self.session.receive()  # the helper is up and ready for frames

    def send_blob(self, blob: Blob, on_bytes: Callable[[int], None]) -> Attempt:
        """Send one blob once, resuming from the host's partial only where its prefix hashes like ours."""
        s = self.session
        s.send({"blob": blob.wire()})
        answer = s.receive()
        if answer.get("have") == "complete":
            return Attempt(0, 0, False)
        have = answer.get("have")
        if not isinstance(have, int) or not 0 <= have <= blob.size:
            raise ShipError(f"bad partial length for {blob.key}")
        # A partial counts only if its bytes hash like ours: its size alone says nothing.
        offset = have if have and prefix_sha256(blob, have) == answer.get("prefix") else 0
        s.send({"offset": offset})
        sent = send_bytes(s, blob, offset, on_bytes)
        try:
            s.receive()  # verified and renamed into place, or a Mismatch: the host hashed it and kept nothing
        except Mismatch as exc:
            return Attempt(sent, offset, have > offset, str(exc))
        return Attempt(sent, offset, have > offset)

    def close(self) -> None:
        self.session.close()


def _read_range(blob: Blob, start: int, length: int) -> bytes:
    if blob.data is not None:
        return blob.data[start:start + length]
    with open(blob.source, "rb") as f:
        return os.pread(f.fileno(), length, blob.offset + start)


def local_digest(blob: Blob) -> str:
    """The blob's bytes here, hashed the way its name says (sha256, or git's blob sha1)."""
    h = hashlib.sha256() if blob.algo == "sha256" else hashlib.sha1(b"blob %d\0" % blob.size)
    pos = 0
    while pos < blob.size:
        chunk = _read_range(blob, pos, min(SEND_CHUNK, blob.size - pos))
        if not chunk:
            break
        h.update(chunk)
        pos += len(chunk)
    return h.hexdigest()


def prefix_sha256(blob: Blob, length: int) -> str:
    h = hashlib.sha256()
    pos = 0
    while pos < length:
        chunk = _read_range(blob, pos, min(SEND_CHUNK, length - pos))
        if not chunk:
            break
        h.update(chunk)
        pos += len(chunk)
    return h.hexdigest()


def send_bytes(s: Session, blob: Blob, offset: int, on_bytes: Callable[[int], None]) -> int:
    """Write blob[offset:] into the connection: sendfile from the file, no copy through Python."""
    left = blob.size - offset
    if blob.data is not None:
        s.write(blob.data[offset:])
        on_bytes(left)
        return left
    sent = 0
    with open(blob.source, "rb") as f:
        pos = blob.offset + offset
        use_sendfile = True
        while left:
            n = min(SEND_CHUNK, left)
            try:
                if use_sendfile:
                    n = os.sendfile(s.fd, f.fileno(), pos, n)
                else:
                    chunk = os.pread(f.fileno(), n, pos)
                    s.write(chunk)
                    n = len(chunk)
            except BrokenPipeError:
                raise s.failure() from None
            except OSError as exc:
                if use_sendfile and exc.errno in (errno.EINVAL, errno.ENOSYS):
                    use_sendfile = False
                    continue
                raise
            if n == 0:
                raise ShipError(f"{blob.source}: shorter than the {blob.size} bytes of {blob.key}")
            pos += n
            left -= n
            sent += n
            on_bytes(n)
    return sent


# ---------------------------------------------------------------- finish


def finish(runner: Runner, request: dict) -> dict:
    s = Session(runner, {"op": "finish", **request})
    try:
        return s.receive()
    finally:
        s.close(kill=True)
