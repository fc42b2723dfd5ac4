"""How a command is stopped: Ctrl-C, SIGTERM and SIGHUP end it the same way.

Every long command handles Ctrl-C (a KeyboardInterrupt): it prints its summary so far, writes its record, keeps
its partials for a resume, restores the screen. `install()` makes SIGTERM and SIGHUP raise a KeyboardInterrupt
too (`Stopped`, which carries the signal), so each of those paths serves all three, and passes the signal on to
this process's children, as a terminal's Ctrl-C reaches its whole foreground group. The exit code is 128 + the
signal's number: 130, 143, 129 (`exit_code`).

A SIGINT or SIGHUP this process inherited as ignored stays ignored: that is what `nohup`, and a shell starting a
job with `&` and no job control, promise. SIGTERM is always handled.
"""

from __future__ import annotations

import os
import signal

_received: int | None = None  # the first stop signal this process got


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where Ctrl-C's KeyboardInterrupt would be."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _note(signum: int) -> None:
    global _received
    if _received is None:
        _received = signum


def _on_sigint(signum, frame) -> None:
    _note(signum)
    raise KeyboardInterrupt  # Python's own, unchanged: Popen's exit gives children a Ctrl-C already reached


def _on_stop(signum, frame) -> None:
    _note(signum)
    for pid in _children():
        try:
            os.kill(pid, signum)
        except OSError:  # gone already
            pass
    raise Stopped(signum)


def _children() -> list[int]:
    """This process's children, from /proc (each one's parent pid). An un-reaped child keeps its pid, so none
    of these can be a stranger's."""
    me, found = os.getpid(), []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rpartition(b")")[2].split()  # the name in (...) may hold spaces
        if len(fields) > 1 and fields[1] == str(me).encode():
            found.append(int(name))
    return found


def install() -> None:
    """Handle SIGTERM always, SIGHUP unless inherited as ignored; note a SIGINT where Python handles it."""
    global _received
    _received = None  # a fresh run (the in-process test runner calls the entry point many times)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)
    signal.signal(signal.SIGTERM, _on_stop)
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
        signal.signal(signal.SIGHUP, _on_stop)


def received() -> int:
    """The signal that stopped this process: SIGINT unless SIGTERM or SIGHUP came first."""
    return _received or signal.SIGINT


def name() -> str:
    """How a message names the stop: "Ctrl-C", "SIGTERM" or "SIGHUP"."""
    return "Ctrl-C" if received() == signal.SIGINT else signal.Signals(received()).name


def exit_code() -> int:
    """128 + the stop signal's number, as a shell reports a command the signal ended."""
    return 128 + received()
