"""The lab's stand-in engine (checks/lab/standin_engine.py), served in-process for unit tests.

    with serving(accept_pattern=(4, 2, 1, 0)) as engine:
        engine.url ...
"""

import contextlib
import importlib.util
import time
from pathlib import Path

_spec = importlib.util.spec_from_file_location("standin_engine", Path(__file__).parent / "lab" / "standin_engine.py")
standin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(standin)

Behaviour = standin.Behaviour
Engine = standin.Engine


@contextlib.contextmanager
def serving(**fields):
    """An engine on 127.0.0.1 (a free port) with the given Behaviour fields; stopped on exit."""
    engine = Engine(Behaviour(**fields)).start()
    try:
        yield engine
    finally:
        engine.stop()


def wait_for(what, predicate, timeout=60.0):
    """The first truthy value of predicate(), polled; a bound on a phase of a test, never a measured figure."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")
