"""Apply a soak plan: C request streams and one supervisor (the calling thread) that polls /health and /metrics,
closes windows and ends the soak. Every finished request and every window is one JSONL line, written as it
happens (one write(2) per line on an O_APPEND file; fsync per window), so a Ctrl-C or a kill loses nothing
already measured.

While /health fails, no new request starts (requests in flight finish): a soak measures serving, and a flood of
refused connections would measure nothing. Each fall from healthy is a flap; the soak ends, with one line, when
/health stays down `dead_after_s`.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

from sparkstack import interrupt
from sparkstack.endpoint import metrics
from sparkstack.endpoint.client import Endpoint, EndpointError
from sparkstack.errors import SparkstackError
from sparkstack.soak import report
from sparkstack.soak.plan import SoakPlan
from sparkstack.text import printable
from sparkstack.verify.run import mask_key

ERROR_PAUSE_S = 0.5   # a stream waits this long after a failed request, so a failing server is not hammered
DRAIN_S = 60.0        # at the end, requests in flight get this long to finish
START_MOVED_S = 5.0   # a container start time that moved more than this is a restart (uptime has 1 s steps)


class Log:
    """The JSONL log: created (never replaced), one line per write(2), appended only."""

    def __init__(self, path) -> None:
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        except FileExistsError:
            raise SparkstackError(f"{path} exists: a soak log is never appended to or replaced; "
                                  "give another --log") from None
        self.lock = threading.Lock()

    def write(self, record: dict, sync: bool = False) -> None:
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self.lock:
            if self.fd is None:
                return
            os.write(self.fd, line)
            if sync:
                os.fsync(self.fd)

    def close(self) -> None:
        with self.lock:
            if self.fd is not None:
                os.fsync(self.fd)
                os.close(self.fd)
                self.fd = None


@dataclass
class _Window:
    start: float
    requests: list = field(default_factory=list)
    deltas: list = field(default_factory=list)
    timings: list = field(default_factory=list)  # the server's timing of requests finished per scrape interval
    kv: list = field(default_factory=list)
    polls: int = 0
    healthy: int = 0
    flaps: int = 0
    restarts: int = 0


@dataclass(frozen=True)
class Outcome:
    summary: dict
    ended: str       # duration, cap, interrupted, dead, streams
    message: str     # when the soak failed (dead, every stream failed, nothing succeeded): the one line to end with


class Soak:
    def __init__(self, plan: SoakPlan, suite, api_key: str | None, on_window=None, clock=time.monotonic) -> None:
        self.plan, self.suite, self.api_key, self.clock = plan, suite, api_key, clock
        self.on_window = on_window or (lambda record: None)
        self.cond = threading.Condition()
        self.gate_open = True
        self.stopping = False
        self.abandoned = False
        self.issued = self.inflight = 0
        self.finished = self.ok = self.tokens = 0
        self.streams_alive = plan.concurrency
        self.stream_failures: list[str] = []
        self.draining = False
        self.drained: list[dict] = []  # requests that finished after the last window closed
        self.errors: Counter = Counter()
        self.pause = threading.Event()  # set at the end: wakes streams waiting out ERROR_PAUSE_S
        self.salt = uuid.uuid4().hex[:12]
        self.watcher = Endpoint(plan.url, api_key, timeout=min(5.0, max(1.0, plan.health_interval_s)))
        self.healthy = True
        self.flaps = 0
        self.down_since: float | None = None
        self.down_s = 0.0
        self.restarts: list[dict] = []
        self.counter_restarts_unchecked = 0
        self.container_started: float | None = None
        self.last_scrape = None
        self.windows: list[dict] = []
        self.log: Log | None = None
        self.model = plan.model

    # ---- the start: a healthy server, a model name, then the log
    def open(self) -> None:
        ok, detail = self.watcher.health()
        if not ok:
            where = "" if detail.startswith(self.plan.url) else f"{self.plan.url}/health: "  # connect errors name it
            raise SparkstackError(f"{where}{printable(mask_key(detail, self.api_key))}: no healthy server to soak")
        if self.model is None:
            names = self.watcher.models()
            if not names:
                raise SparkstackError(f"{self.plan.url}/v1/models lists no model; give --model")
            self.model = names[0]
        self.last_scrape = self._scrape()
        if self.plan.container:
            self.container_started = self._container_start()
        self.log = Log(self.plan.log)
        self.t0 = self.clock()
        self.window = _Window(0.0)
        self.log.write({"type": "start", "wall": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "model": self.model,
                        "salt": self.salt, "plan": self.plan.to_json()}, sync=True)

    def _t(self) -> float:
        return round(self.clock() - self.t0, 3)

    # ---- the request streams
    def _stream(self, number: int) -> None:
        """One stream of requests. Whatever one request raises is that request's error; should the stream
        itself fail (its log line cannot be written), it says so in one line and the supervisor counts it out."""
        ep = Endpoint(self.plan.url, self.api_key, timeout=self.plan.request_timeout_s)
        try:
            self._requests(number, ep)
        except Exception as exc:  # noqa: BLE001 - a stream ends with one line, never a thread traceback
            with self.cond:
                self.stream_failures.append(f"stream {number}: {type(exc).__name__}: {exc}")
        finally:
            ep.close()
            with self.cond:
                self.streams_alive -= 1
                self.cond.notify_all()

    def _requests(self, number: int, ep: Endpoint) -> None:
        p = self.plan
        cats = p.categories
        while True:
            with self.cond:
                while not self.stopping and not self.gate_open:
                    self.cond.wait()
                if self.stopping or self.issued >= p.max_requests:
                    return
                n = self.issued
                self.issued += 1
                self.inflight += 1
            cat = cats[n % len(cats)]
            record = {"type": "request", "n": n, "stream": number, "category": cat, "t_start": self._t()}
            try:
                body = self.suite.body(cat, n // len(cats), f"soak-{self.salt}-{n}", model=self.model,
                                       max_tokens=p.max_tokens, temperature=p.temperature, top_p=p.top_p)
                body["logprobs"] = True  # each sampled token's logprob: the sampling-integrity count
                fields = report.request_fields(ep.stream_chat(body), p.temperature)
            except EndpointError as exc:
                fields = {"error": exc.kind, "detail": mask_key(str(exc), self.api_key)}
            except Exception as exc:  # noqa: BLE001 - an odd answer is this request's error, not the stream's end
                fields = {"error": "internal", "detail": mask_key(f"{type(exc).__name__}: {exc}", self.api_key)}
            record = {**record, "t_end": self._t(), **fields}
            with self.cond:
                self.inflight -= 1
                if self.abandoned:
                    return
                if self.draining:
                    record["drained"] = True
                self.finished += 1
                if record["error"]:
                    self.errors[record["error"]] += 1
                else:
                    self.ok += 1
                    self.tokens += record["output_tokens"]
                (self.drained if self.draining else self.window.requests).append(record)
                self.log.write(record)
                self.cond.notify_all()
            if record["error"]:
                self.pause.wait(ERROR_PAUSE_S)

    # ---- the supervisor's tick: /health, /metrics, the gate
    def _scrape(self):
        try:
            return self.watcher.scrape()
        except SparkstackError:  # unreachable, or not Prometheus text: this tick has no metrics
            return None

    def _fold(self, scrape) -> None:
        kv = scrape.get(*metrics.KV_USAGE)
        if kv is not None:
            self.window.kv.append(kv)
        last, self.last_scrape = self.last_scrape, scrape
        if last is None:
            return
        back = metrics.went_back(last, scrape)
        if back:
            self._restart("counters went back: " + ", ".join(back[:3]) + (" ..." if len(back) > 3 else ""))
            self.counter_restarts_unchecked += 1
            return
        delta = metrics.spec_delta(last, scrape)
        if delta is not None and delta.drafts > 0:
            self.window.deltas.append(delta)
        server = metrics.server_timing(last, scrape)
        if server is not None:
            self.window.timings.append(server)

    def _restart(self, signal: str) -> None:
        event = {"type": "restart", "t": self._t(), "signal": signal}
        self.restarts.append({"t": event["t"], "signal": signal})
        self.window.restarts += 1
        self.log.write(event, sync=True)

    def _tick(self) -> None:
        ok, detail = self.watcher.health(timeout=self.watcher.timeout)
        scrape = self._scrape()
        if scrape is not None:
            self._fold(scrape)  # before the gate opens: the first scrape after a restart is still idle
        now = self.clock()
        self.window.polls += 1
        self.window.healthy += ok
        if ok == self.healthy:
            return
        self.healthy = ok
        with self.cond:
            self.gate_open = ok
            if ok:
                self.down_s += now - self.down_since
                self.down_since = None
            else:
                self.flaps += 1
                self.window.flaps += 1
                self.down_since = now
            # in_flight: requests that started before the gate closed and will still be logged
            self.log.write({"type": "health", "t": self._t(), "ok": ok, "detail": mask_key(detail, self.api_key),
                            "in_flight": self.inflight}, sync=True)
            self.cond.notify_all()

    def _container_start(self) -> float | None:
        """The head container's start time (epoch s) from launch's status; None when not running or unknown."""
        from sparkstack.deploy import runner_for
        from sparkstack.launch import apply as launch_apply

        d = self.plan.container.deployment
        try:
            rows, _ = launch_apply.status(d, {d.ranks[0].rank: runner_for(d.ranks[0], None)})
        except (SparkstackError, OSError):
            return None
        row = rows[0]
        # Docker's own start time, not now - uptime: that one is rounded to the second and moves with the clock.
        return row["started_at"] if row["state"] == "running" else None

    def _check_container(self) -> None:
        started = self._container_start()
        before, self.container_started = self.container_started, started or self.container_started
        if started is not None and before is not None and abs(started - before) > START_MOVED_S:
            if self.counter_restarts_unchecked:  # the same restart, seen twice
                self.log.write({"type": "restart", "t": self._t(), "signal": "container start time moved "
                                "(the restart the counters showed)", "counted": False}, sync=True)
            else:
                self._restart(f"container {self.plan.container.name} start time moved by {started - before:.0f} s")
        self.counter_restarts_unchecked = 0

    def _close_window(self, last: bool = False) -> None:
        """Close the open window. The `last` one ends the windows: requests finishing after it are drained ones,
        logged and counted but in no window, so the drain does not stretch the last window's rates."""
        if self.plan.container:
            self._check_container()
        now = self.clock() - self.t0
        with self.cond:
            w = self.window
            if last:
                self.draining = True
                if not (w.requests or w.polls or not self.windows):
                    return
            record = report.window_record(len(self.windows), w.start, now, w.requests, w.deltas, w.kv, w.polls,
                                          w.healthy, w.flaps, w.restarts, w.timings, self.plan.temperature)
            self.log.write(record, sync=True)
            self.windows.append(record)
            self.window = _Window(now)
        self.on_window(record)

    # ---- the whole soak
    def run(self) -> Outcome:
        p = self.plan
        streams = [threading.Thread(target=self._stream, args=(i,), daemon=True, name=f"soak-{i}")
                   for i in range(p.concurrency)]
        for s in streams:
            s.start()
        ended, detail, message = "duration", "", ""
        drain_s = 0.0
        try:
            next_tick, window_end, end_at = (self.t0 + p.health_interval_s, self.t0 + p.window_s,
                                             self.t0 + p.duration_s)
            while True:
                time.sleep(max(0.0, min(next_tick, end_at) - self.clock()))
                next_tick = max(next_tick + p.health_interval_s, self.clock())
                self._tick()
                now = self.clock()
                if self.down_since is not None and now - self.down_since >= p.dead_after_s:
                    ended, detail = "dead", f"/health down for {now - self.down_since:.0f} s"
                    message = (f"{p.url} has not been healthy for {p.dead_after_s:g} s (--dead-after): the server is "
                               f"down; the summary so far is above, the log is kept at {p.log}")
                    break
                if now >= end_at:
                    break
                if now >= window_end:
                    self._close_window()
                    window_end += p.window_s * max(1, int((now - window_end) // p.window_s) + 1)
                with self.cond:
                    if self.issued >= p.max_requests and self.inflight == 0:
                        ended, detail = "cap", f"all {p.max_requests:,} requests of the hard cap sent"
                        break
                    if not self.streams_alive:
                        ended, detail = "streams", self.stream_failures[0] if self.stream_failures else ""
                        message = (f"every request stream failed ({detail}); the summary so far is above, "
                                   f"the log is kept at {p.log}")
                        break
            self._close_window(last=True)
            drain_from = self.clock()
            self._drain()
            drain_s = self.clock() - drain_from
        except KeyboardInterrupt:
            ended, detail = "interrupted", interrupt.name()
            with self.cond:
                self.stopping = self.abandoned = True
                self.cond.notify_all()
        abandoned = self.inflight
        self.pause.set()
        if self.down_since is not None:
            self.down_s += self.clock() - self.down_since
        if not self.draining:
            self._close_window(last=True)
        summary = report.summarize(
            plan_doc=p.to_json(), model=self.model, ended=ended, end_detail=detail,
            elapsed_s=self.clock() - self.t0, windows=self.windows, requests=self.finished, errors=self.errors,
            tokens=self.tokens, issued=self.issued, abandoned=abandoned, flaps=self.flaps, down_s=self.down_s,
            restarts=self.restarts, drained=self.drained, drain_s=drain_s)
        if not message and ended != "interrupted" and not self.ok:
            message = (f"no request succeeded (errors by kind: {report.error_counts(summary['errors'])}); "
                       f"the log is kept at {p.log}")
        self.log.write({"type": "summary", **summary}, sync=True)
        self.log.close()
        self.watcher.close()
        return Outcome(summary, ended, message)

    def _drain(self) -> None:
        """Stop sending; give requests in flight DRAIN_S, or --timeout when shorter, to finish (they are logged),
        then abandon the rest."""
        deadline = self.clock() + min(DRAIN_S, self.plan.request_timeout_s)
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
            while self.inflight and self.clock() < deadline:
                self.cond.wait(timeout=min(1.0, deadline - self.clock()))
            self.abandoned = True


def run(plan: SoakPlan, suite, api_key: str | None, on_window=None) -> Outcome:
    """The soak, start to summary; `on_window(record)` is called as each window closes."""
    soak = Soak(plan, suite, api_key, on_window)
    soak.open()
    return soak.run()
