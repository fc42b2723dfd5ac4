"""Run a function in a forked child that SIGKILLs itself just before its N-th change to the filesystem.

Called for N = 0, 1, ... up to the number of changes a full run makes, this shows every state a kill -9
can leave: a kill anywhere between two changes leaves what a kill just before the second one does. A
change is a call of one of MUTATORS from the os module (pathlib and shutil call them too). The child
never returns into pytest: it ends by os._exit or by the signal.
"""

import os
import signal
from collections.abc import Callable
from pathlib import Path

MUTATORS = ("replace", "rename", "symlink", "link", "unlink", "rmdir", "mkdir")


def run_killed_before(step: int, fn: Callable[[], object]) -> int | None:
    """None when the child was killed before change `step`; else the number of changes the whole run made
    (`step` = -1 never kills). A child that fails otherwise fails the test."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            calls = [0]

            def before(real):
                def changed(*args, **kwargs):
                    if calls[0] == step:
                        os.kill(os.getpid(), signal.SIGKILL)
                    calls[0] += 1
                    return real(*args, **kwargs)
                return changed

            for name in MUTATORS:
                setattr(os, name, before(getattr(os, name)))
            fn()
            os.write(w, b"%d" % calls[0])
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL, f"the child died of signal {os.WTERMSIG(status)}"
        return None
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "the function failed in the child"
    return int(out)


def loader_view(hub: Path, repo_id: str) -> tuple[str, dict[str, bytes]]:
    """What a loader finds after a kill: the snapshot refs/main names, resolved offline by huggingface_hub, and
    every file's bytes. A missing snapshot or a broken link fails the calling test, saying which."""
    from huggingface_hub import snapshot_download

    try:
        snap = Path(snapshot_download(repo_id, cache_dir=hub, local_files_only=True))
    except Exception as exc:  # noqa: BLE001 - whatever the hub library raises, the reader failed
        failure = f"huggingface_hub cannot resolve refs/main: {type(exc).__name__}"
    else:
        failure = None
    assert failure is None, failure
    files = {}
    for p in sorted(snap.rglob("*")):
        assert not p.is_symlink() or p.exists(), f"{p.name} is a broken link"
        if not p.is_dir():
            files[p.relative_to(snap).as_posix()] = p.read_bytes()
    return snap.name, files
