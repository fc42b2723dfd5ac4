"""The HTTP scaffold the stand-ins share: a threaded server on 127.0.0.1 (a free port) that serves from a daemon
thread, takes a client hanging up as no news, and stops cleanly; `Served` gives a stand-in start/stop as a
context manager.

hub_standin.py and registry_standin.py stand on it. lab/standin_engine.py keeps its own few lines of the same,
because it is installed into the lab's image as one stdlib-only file (lab/conftest.py), and imports nothing of
checks/.
"""

from __future__ import annotations

import sys
import threading
from http.server import ThreadingHTTPServer


class StandinServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address) -> None:
        # a client that hangs up (or skopeo's TLS probe, which resets) is not news; anything else is printed
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


def serve(handler, host: str = "127.0.0.1", port: int = 0) -> StandinServer:
    """`handler` (a BaseHTTPRequestHandler class) served from a daemon thread, on a port the kernel picks."""
    server = StandinServer((host, port), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


def shut(server: StandinServer) -> None:
    server.shutdown()
    server.server_close()


def url_of(server: StandinServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}"


class Served:
    """A stand-in's life: `with Standin(...) as s:` starts it and stops it; a subclass defines start and stop."""

    def start(self):
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
