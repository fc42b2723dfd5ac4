"""Run a function in a forked child that SIGKILLs itself just before its N-th change to the filesystem.

Called for N = 0, 1, ... up to the number of changes a full run makes, this shows every state a kill -9
can leave: a kill anywhere between two changes leaves what a kill just before the second one does. A
change is a call of one of MUTATORS from the os module (pathlib and shutil call them too). The child
never returns into pytest: it ends by os._exit or by the signal.
"""

import os
import signal
from collections.abc import Callable

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
