"""A real vLLM OpenAI server, started as a user starts it: an argv list, a port the OS chose, a pidfile, a log.

Its output is written to the log with a docker-style RFC 3339 timestamp in front of each line (as
`docker logs --timestamps` gives it), so launch's boot timeline reads it as it reads a rank's container.
The server runs in its own process group and is stopped by that group's id (the API server, its engine core and
worker are children of one session).
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import requests

# One OpenMP thread per server: the model is tiny, and two servers of two spinning threads each beside the rest of
# the suite on 2 cores slowed every request about 80-fold (a bench cell of 2 s took 160 s in CI).
ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
       "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
       "DO_NOT_TRACK": "1"}
BOOT_BOUND_S = 900.0  # a bound on waiting, never a figure: a boot takes ~100 s of one core, more on a busy box
NGRAM = '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4,"prompt_lookup_min":2}'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Server:
    def __init__(self, python: str, model: Path, name: str, workdir: Path, extra: list[str]) -> None:
        self.python, self.model, self.name, self.workdir = python, model, name, workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [python, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", str(model),
                     "--served-model-name", name, "--host", "127.0.0.1", "--port", str(self.port),
                     "--dtype", "float32", "--max-model-len", "8192", "--enable-prefix-caching",
                     # no torch.compile: its C++ builds cost about 30 s of a core per boot (three boots a run, on a
                     # 2-core CI), and nothing here measures compiled speed; the Sparks' own EAGER knob does the same
                     "--enforce-eager", *extra]
        self.pidfile = workdir / "server.pid"
        self.log = workdir / "server.log"
        self.proc: subprocess.Popen | None = None
        self.boots: list[dict] = []  # per start: the log's size before it and its epoch start
        self._pump: threading.Thread | None = None

    def start(self) -> "Server":
        env = {**os.environ, **ENV}
        env.pop("PYTHONPATH", None)
        offset = self.log.stat().st_size if self.log.exists() else 0
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, cwd=self.workdir, start_new_session=True)
        self.pidfile.write_text(f"{self.proc.pid}\n")
        self.boots.append({"offset": offset, "started": time.time()})
        self._pump = threading.Thread(target=self._copy, args=(self.proc,), daemon=True, name=f"log-{self.name}")
        self._pump.start()
        return self

    def _copy(self, proc: subprocess.Popen) -> None:
        with open(self.log, "a", encoding="utf-8", errors="replace") as out:
            for raw in proc.stdout:
                out.write(f"{stamp()} {raw.decode('utf-8', 'replace')}")
                out.flush()

    def wait_healthy(self, bound_s: float = BOOT_BOUND_S) -> "Server":
        """Polls /health until 200; fails with the log's tail when the process dies or the bound passes."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < bound_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM ({self.name}) exited {self.proc.returncode} while booting:\n{self.tail()}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"vLLM ({self.name}) not healthy within {bound_s:.0f} s:\n{self.tail()}")

    def warm(self) -> "Server":
        """One short request at temperature 0: the first request of a fresh engine pays one-off compiles (the ngram
        proposer's numba kernel among them), which would otherwise land in the first measured figure."""
        body = {"model": self.name, "messages": [{"role": "user", "content": "warm up"}], "max_tokens": 32,
                "temperature": 0, "logprobs": True}  # bench and soak ask logprobs: their path is warmed too
        resp = requests.post(self.url + "/v1/chat/completions", json=body, timeout=BOOT_BOUND_S)
        if resp.status_code != 200:
            raise RuntimeError(f"vLLM ({self.name}) answered the warm-up with HTTP {resp.status_code}: {resp.text}")
        return self

    def tail(self, n: int = 40) -> str:
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\n".join(lines[-n:])

    def boot_log(self, boot: int = 0) -> str:
        """The timestamped lines of one start (0: the first)."""
        text = self.log.read_bytes()
        end = self.boots[boot + 1]["offset"] if boot + 1 < len(self.boots) else len(text)
        return text[self.boots[boot]["offset"]:end].decode("utf-8", "replace")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Stops the whole process group by its id (the pid recorded at start) and reaps the server."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=60)
        if self._pump is not None:
            self._pump.join(timeout=10)
        self._reap_group(self.proc.pid)

    @staticmethod
    def _reap_group(pgid: int) -> None:
        """The engine core and worker may outlive the API server for a moment: SIGKILL what is left of the group,
        polled until none is left (a bound, then it is said)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        raise RuntimeError(f"process group {pgid} still has members after SIGKILL")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill(signal.SIGTERM)
        elif self.proc is not None:
            self._reap_group(self.proc.pid)
        self.pidfile.unlink(missing_ok=True)
