"""`sparkstack soak` through the real CLI against the in-process stand-in engine.

Counts are made deterministic by driving the engine from the test between phases: the soak logs a `health`
record (with the requests still in flight) the moment it closes its gate, so the test knows when nothing more
will be sent, and the stand-in fails requests by their number (fail_every). Every exact figure comes from what
the stand-ins were given or counted; times get consistency checks only.
"""

import json
import os
import signal
import subprocess

import pytest
import standins
from clirun import sparkstack_cmd, start
from inprocess_engine import Behaviour, Engine, serving, wait_for
from sparkstack.bench import suite as bench_suite
from sparkstack.endpoint.client import Endpoint
from sparkstack.endpoint.metrics import SpecDelta
from sparkstack.errors import UsageError
from sparkstack.soak import report
from sparkstack.soak import run as soak_run
from sparkstack.soak.plan import plan_soak, container_watch, parse_duration

WAIT_S = 60  # generous: a bound on how long a phase may take, never a measured figure


def log_records(path):
    """Every complete line of the log (a line being written may not have its newline yet)."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def of_type(records, kind):
    return [r for r in records if r["type"] == kind]


def soak(url, log, *extra):
    return start(sparkstack_cmd() + ["soak", url, "--log", str(log), *extra], stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True)


def wait_until_drained(log, downs):
    """After the `downs`-th fall of /health: every request in flight at that moment has been logged."""
    def drained():
        records = log_records(log)
        health = [i for i, r in enumerate(records) if r["type"] == "health" and not r["ok"]]
        if len(health) < downs:
            return False
        at = health[downs - 1]
        before = len(of_type(records[:at], "request"))
        return len(of_type(records, "request")) == before + records[at]["in_flight"]
    wait_for(f"health down #{downs} and its requests in flight", drained)


# pattern (2, 1) for 3 cycles: the prefill's token + 3 x (3 + 2) = 16 tokens per request, whatever the prompt
PATTERN = {"accept_pattern": (2, 1), "cycles": 3, "step_delay": 0.1, "fail_every": 3}
TOKENS_PER_REQUEST = 1 + 3 * ((2 + 1) + (1 + 1))
CAP = 30


def test_failures_flaps_and_one_restart_are_counted_exactly(tmp_path):
    log = tmp_path / "soak.jsonl"
    a = Engine(Behaviour(**PATTERN)).start()
    port = a.server.server_address[1]
    b = None
    proc = soak(a.url, log, "--duration", "10m", "--window", "1s", "--health-interval", "0.1", "--concurrency", "2",
                "--max-requests", str(CAP), "--json")
    try:
        wait_for("a few requests on engine A", lambda: a.c["requests"] >= 3)
        a.unhealthy = True                      # flap 1: /health falls, then comes back
        wait_until_drained(log, 1)
        a.unhealthy = False
        wait_for("health back", lambda: [r for r in of_type(log_records(log), "health") if r["ok"]])
        a.unhealthy = True                      # the engine goes unhealthy, dies, and a new one comes up
        wait_until_drained(log, 2)
        wait_for("engine A idle", lambda: a.running == 0)
        a.stop()
        b = Engine(Behaviour(**PATTERN)).start(port=port)
        out, err = proc.communicate(timeout=WAIT_S)
    finally:
        proc.kill()
        a.stop()
        if b:
            b.stop()
    assert proc.returncode == 0, err
    summary = json.loads(out)
    served_a, served_b = a.c["requests"], b.c["requests"]
    assert served_a + served_b == CAP and served_b > 0, (served_a, served_b)  # B served after the restart
    failed = served_a // 3 + served_b // 3   # each engine fails its own every third request
    assert summary["errors"] == {"http_500": failed}
    assert summary["requests"] == {"issued": CAP, "finished": CAP, "ok": CAP - failed, "abandoned_in_flight": 0}
    assert summary["tokens_served"] == (CAP - failed) * TOKENS_PER_REQUEST
    assert summary["health"]["flaps"] == 2 and summary["health"]["down_s"] > 0
    assert summary["restarts"]["count"] == 1 and "counters went back" in summary["restarts"]["signals"][0]["signal"]
    assert summary["ended"] == "cap"

    records = log_records(log)
    assert len(records) == len(log.read_text().splitlines())  # every line whole JSON
    requests, windows = of_type(records, "request"), of_type(records, "window")
    assert sorted(r["n"] for r in requests) == list(range(CAP))
    assert sum(w["requests"] for w in windows) == CAP
    assert sum(w["output_tokens"] for w in windows) == summary["tokens_served"]
    assert sum(w["restarts"] for w in windows) == 1 and sum(w["health"]["flaps"] for w in windows) == 2
    assert [r["ok"] for r in of_type(records, "health")] == [False, True, False, True]
    assert of_type(records, "summary")[0]["errors"] == summary["errors"]
    # spec decode: every step accepts 2 or 1 of 4, so any window's acceptance length lies in [2, 3]
    lengths = [w["acceptance_length"] for w in windows if w["acceptance_length"] is not None]
    assert lengths and all(2 <= x <= 3 for x in lengths)
    for r in requests:
        if r["error"] is None:
            assert r["output_tokens"] == TOKENS_PER_REQUEST and r["t_start"] <= r["t_end"]
            assert r["ttft_s"] <= r["e2e_s"]


# Ctrl-C, `kill` and a closed terminal stop a soak alike; the exit code is 128 + the signal's number.
STOPS = [pytest.param(signal.SIGINT, 130, "", id="ctrl-c"), pytest.param(signal.SIGTERM, 143, " by SIGTERM", id="term"),
         pytest.param(signal.SIGHUP, 129, " by SIGHUP", id="hup")]


@pytest.mark.parametrize("sig,code,by", STOPS)
def test_ctrl_c_prints_the_summary_so_far_and_keeps_the_log(tmp_path, sig, code, by):
    log = tmp_path / "soak.jsonl"
    with serving(step_delay=0.05) as engine:
        proc = soak(engine.url, log, "--duration", "10m", "--window", "1s", "--health-interval", "0.2",
                    "--concurrency", "2")
        try:
            wait_for("five finished requests", lambda: len(of_type(log_records(log), "request")) >= 5)
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=WAIT_S)
        finally:
            proc.kill()
    assert proc.returncode == code, err
    assert "interrupted" in out and "tokens served" in out and "errors by kind: none" in out
    assert err.strip().splitlines()[-1].startswith(f"sparkstack: interrupted{by}: the summary so far is above")
    assert "Traceback" not in err
    records = [json.loads(line) for line in log.read_text().splitlines()]  # intact: every line parses
    assert records[0]["type"] == "start" and records[-1]["type"] == "summary"
    summary = records[-1]
    assert summary["ended"] == "interrupted"
    finished = of_type(records, "request")
    assert summary["requests"]["finished"] == len(finished) >= 5
    assert summary["requests"]["issued"] == len(finished) + summary["requests"]["abandoned_in_flight"]
    assert sum(w["requests"] for w in of_type(records, "window")) == len(finished)


def test_a_dead_server_is_one_line_and_no_log(tmp_path):
    with serving() as engine:
        url = engine.url
    log = tmp_path / "soak.jsonl"
    proc = subprocess.run(sparkstack_cmd() + ["soak", url, "--duration", "10s", "--log", str(log)],
                          capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [(f"sparkstack: error: {url}/health: cannot connect (ConnectionError): "
                                         "no healthy server to soak")]
    assert not log.exists()


def test_a_server_that_dies_and_stays_down_ends_the_soak_with_one_line(tmp_path):
    log = tmp_path / "soak.jsonl"
    engine = Engine(Behaviour(step_delay=0.05)).start()
    proc = soak(engine.url, log, "--duration", "10m", "--window", "1s", "--health-interval", "0.1",
                "--dead-after", "1s", "--json")
    try:
        wait_for("three finished requests", lambda: len(of_type(log_records(log), "request")) >= 3)
        engine.unhealthy = True
        wait_until_drained(log, 1)
        engine.stop()
        out, err = proc.communicate(timeout=WAIT_S)
    finally:
        proc.kill()
        engine.stop()
    assert proc.returncode == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("sparkstack: error: ") and "has not been healthy for 1 s" in last and str(log) in last
    summary = json.loads(out)
    assert summary["ended"] == "dead" and summary["errors"] == {}
    assert summary["requests"]["finished"] == engine.c["requests"] == summary["requests"]["issued"]
    assert log_records(log)[-1]["type"] == "summary"


def test_an_unhealthy_server_is_not_soaked(tmp_path):
    log = tmp_path / "soak.jsonl"
    with serving() as engine:
        engine.unhealthy = True
        url = engine.url
        proc = subprocess.run(sparkstack_cmd() + ["soak", engine.url, "--duration", "5s", "--log", str(log)],
                              capture_output=True, text=True, timeout=WAIT_S, check=False)
        assert engine.c["requests"] == 0
    assert proc.returncode == 1 and not log.exists()
    assert proc.stderr.splitlines() == [f"sparkstack: error: {url}/health: HTTP 503: no healthy server to soak"]


def test_an_existing_log_is_never_appended_to(tmp_path):
    log = tmp_path / "soak.jsonl"
    log.write_text("mine\n")
    with serving() as engine:
        proc = subprocess.run(sparkstack_cmd() + ["soak", engine.url, "--duration", "5s", "--log", str(log)],
                              capture_output=True, text=True, timeout=WAIT_S, check=False)
        assert engine.c["requests"] == 0
    assert proc.returncode == 1 and "exists" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert log.read_text() == "mine\n"


def test_dry_run_sends_nothing_and_writes_no_log(tmp_path):
    log = tmp_path / "soak.jsonl"
    with serving() as engine:
        proc = subprocess.run(sparkstack_cmd() + ["soak", engine.url, "--duration", "2h", "--concurrency", "3",
                                                  "--log", str(log), "--dry-run", "--json"],
                              capture_output=True, text=True, timeout=WAIT_S, check=False)
        assert engine.c["requests"] == 0
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)["plan"]
    assert plan["max_requests"] == 2 * 3 * 7200 and plan["duration_s"] == 7200 and plan["window_s"] == 60
    assert not log.exists()


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("30m", 1800), ("2h", 7200), ("1h30m", 5400),
                                          ("0.5h", 1800), (" 2h ", 7200)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["90", "", "h", "2h2h", "1d", "-5s", "0s", "8d", "200h", "1e3s", "inf", "5 m",
                                  "1M", "2H", "\uff11m", "\u0661m"])  # units lower-case; digits ASCII only
def test_nonsense_durations_are_refused(text):
    with pytest.raises(UsageError):
        parse_duration(text)


def _window(index, t_start, t_end, drafts, accepted, tokens, spread):
    deltas = [SpecDelta(drafts / 2, drafts * 2, accepted / 2, (), None)] * 2 if drafts else []
    requests = [{"error": None, "ttft_s": 0.1, "tpot_s": 0.04, "e2e_s": 1.0, "output_tokens": tokens,
                 "tok_s": 25.0 * (1 + spread / 2)}, {"error": None, "ttft_s": 0.3, "tpot_s": 0.05, "e2e_s": 2.0,
                                                      "output_tokens": 0, "tok_s": 25.0 * (1 - spread / 2)},
                {"error": "http_500"}]
    return report.window_record(index, t_start, t_end, requests, deltas, [0.25, 0.5], 10, 9, 1, 0)


def test_a_window_record_from_known_requests():
    w = _window(0, 0.0, 60.0, drafts=100, accepted=250, tokens=600, spread=0.2)
    assert w["requests"] == 3 and w["ok"] == 2 and w["errors"] == {"http_500": 1}
    assert w["ttft_s"] == {"p50": 0.2, "p90": 0.28, "p99": 0.298}
    assert w["tok_s"] == 10.0 and w["acceptance_length"] == 3.5 and w["acceptance_spread"] == 0.0
    assert w["stream_tok_s"] == {"mean": 25.0, "spread": 0.2, "source": "chunks"}
    assert w["kv_usage"] == {"last": 0.5, "max": 0.5} and w["health"] == {"polls": 10, "healthy": 9, "flaps": 1}


def test_the_trend_is_first_versus_last_hour_past_two_hours():
    # 3 hours of 30-minute windows: acceptance falls from 3.0 to 2.0, tok/s from 20 to 10
    windows = [_window(i, i * 1800.0, (i + 1) * 1800.0, drafts=100, accepted=200 if i < 2 else (150 if i < 4 else 100),
                       tokens=36000 if i < 2 else (27000 if i < 4 else 18000), spread=0.1 * (i + 1)) for i in range(6)]
    t = report.trend(windows)
    assert t["by"] == "hour"
    assert t["first"]["windows"] == [0, 1] and t["last"]["windows"] == [4, 5]
    assert t["first"]["acceptance_length"] == 3.0 and t["last"]["acceptance_length"] == 2.0
    assert t["first"]["tok_s"] == 20.0 and t["last"]["tok_s"] == 10.0
    assert t["first"]["stream_tok_s_spread"] == pytest.approx(0.15) and t["last"]["stream_tok_s_spread"] == pytest.approx(0.55)
    short = report.trend(windows[:3])
    assert short["by"] == "window" and short["first"]["windows"] == [0] and short["last"]["windows"] == [2]


def test_a_sigint_inherited_as_ignored_stays_ignored_and_sigterm_still_stops_the_soak(tmp_path):
    """Started as `nohup ... &` starts it (SIGINT and SIGHUP ignored): those two change nothing, SIGTERM stops it."""
    def as_nohup_and():
        for sig in (signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)

    log = tmp_path / "soak.jsonl"
    with serving(step_delay=0.05) as engine:
        proc = subprocess.Popen(sparkstack_cmd() + ["soak", engine.url, "--log", str(log), "--duration", "10m",
                                                    "--window", "1s", "--health-interval", "0.2", "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_nohup_and)
        try:
            wait_for("three finished requests", lambda: len(of_type(log_records(log), "request")) >= 3)
            proc.send_signal(signal.SIGINT)
            proc.send_signal(signal.SIGHUP)
            after = len(of_type(log_records(log), "request"))
            # a soak that took either signal would end here; this one goes on serving requests
            wait_for("three more finished requests", lambda: len(of_type(log_records(log), "request")) >= after + 3)
            assert proc.poll() is None
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=WAIT_S)
        finally:
            proc.kill()
    assert proc.returncode == 143, err
    assert json.loads(out)["ended"] == "interrupted" and "Traceback" not in err
    assert of_type(log_records(log), "summary")[0]["end_detail"] == "SIGTERM"


def test_a_container_start_time_that_moved_is_a_restart(tmp_path):
    """With --recipe and the URL at the recipe's API port here, launch status (the docker stand-in) is asked
    once per window; the test moves the container's start time by an hour while the engine's counters go on."""
    bin_dir, started = tmp_path / "bin", tmp_path / "started-at"
    standins.install(bin_dir)
    started.write_text("2026-11-29T00:00:00.000000000Z\n")
    log = tmp_path / "soak.jsonl"
    with serving(step_delay=0.02) as engine:
        env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", RECORD_LOG=str(tmp_path / "calls.jsonl"),
                   STANDIN_STARTED_AT_FILE=str(started), API_PORT=str(engine.server.server_address[1]),
                   HF_HOME=str(tmp_path / "hf"), SPARKSTACK_RECIPES="")
        proc = start(sparkstack_cmd() + ["soak", engine.url, "--log", str(log), "--duration", "10m",
                                         "--window", "1s", "--health-interval", "0.2", "--recipe",
                                         "glm53-flash-dflash2-nvfp4", "--json"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            wait_for("a first window", lambda: of_type(log_records(log), "window"))
            started.write_text("2026-11-29T01:00:00.000000000Z\n")
            wait_for("the restart", lambda: of_type(log_records(log), "restart"))
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=WAIT_S)
        finally:
            proc.kill()
    assert proc.returncode == 130, err
    summary = json.loads(out)
    assert summary["restarts"]["count"] == 1 and summary["errors"] == {}
    assert summary["restarts"]["signals"][0]["signal"] == "container glm53-tony-rank0 start time moved by 3600 s"
    calls = standins.recorded(tmp_path / "calls.jsonl")
    assert calls and {tuple(c[:2]) for c in calls} == {("docker", "inspect")}  # asks, never acts


def test_the_container_is_watched_only_at_the_recipe_port_on_this_host(monkeypatch):
    from sparkstack.deploy import plan_deployment
    from sparkstack.recipe import load_recipe

    monkeypatch.setenv("API_PORT", "18000")
    lp = plan_deployment(load_recipe("glm53-flash-dflash2-nvfp4"), dict(os.environ, API_PORT="18000"))
    watch, note = container_watch("http://127.0.0.1:18000", lp)
    assert watch.name == "glm53-tony-rank0" and [r.rank for r in watch.deployment.ranks] == [0]
    watch, note = container_watch("http://127.0.0.1:18001", lp)
    assert watch is None and "not the recipe's API port 18000" in note
    watch, note = container_watch("http://10.0.0.1:18000", lp)
    assert watch is None


def test_the_key_comes_from_the_named_variable_and_reaches_every_request(tmp_path):
    with serving(api_key="sekrit-key") as engine:
        env = dict(os.environ, SOAK_KEY="sekrit-key")
        proc = subprocess.run(sparkstack_cmd() + ["soak", engine.url, "--duration", "30s", "--max-requests", "3",
                                                  "--health-interval", "0.1", "--api-key-env", "SOAK_KEY",
                                                  "--log", str(tmp_path / "soak.jsonl"), "--json"],
                              capture_output=True, text=True, timeout=WAIT_S, check=False, env=env)
        seen = [(path, auth) for _, path, auth in engine.requests_seen if path.startswith("/v1/")]
        refused = subprocess.run(sparkstack_cmd() + ["soak", engine.url, "--duration", "30s", "--api-key-env",
                                                     "sekrit-key!", "--log", str(tmp_path / "other.jsonl")],
                                 capture_output=True, text=True, timeout=WAIT_S, check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["requests"]["ok"] == 3 and "sekrit" not in proc.stdout + proc.stderr
    assert [p for p, _ in seen].count("/v1/chat/completions") == 3 and {a for _, a in seen} == {"Bearer sekrit-key"}
    assert refused.returncode == 2 and "sekrit" not in refused.stderr and "NAME of an environment variable" in refused.stderr


def _plan(url, log, **given):
    settings = {"duration_s": 60.0, "concurrency": 2, "categories": ("code",), "window_s": 60.0,
                "max_requests": None, "log": log, "health_interval_s": 0.1, "dead_after_s": 60.0, "max_tokens": 16,
                "temperature": 1.0, "top_p": 0.95, "model": None, "request_timeout_s": 30.0}
    return plan_soak(url, **{**settings, **given})


def test_an_unexpected_exception_is_that_requests_internal_error_and_the_streams_go_on(tmp_path, monkeypatch):
    """Every other request raises what the client never should (the review's OverflowError of an index 1e999):
    it is one `internal` error with one line of detail, and both streams go on to the cap."""
    plain, calls = Endpoint.stream_chat, []

    def odd(self, body):
        calls.append(1)
        if len(calls) % 2 == 0:
            raise OverflowError("int too large to convert to float\nsecond line")
        return plain(self, body)

    monkeypatch.setattr(Endpoint, "stream_chat", odd)
    with serving(step_delay=0.001) as engine:
        outcome = soak_run.run(_plan(engine.url, tmp_path / "soak.jsonl", max_requests=8), bench_suite.load(), None)
    s = outcome.summary
    assert s["ended"] == "cap" and outcome.message == ""
    assert s["errors"] == {"internal": 4} and s["requests"] == {"issued": 8, "finished": 8, "ok": 4,
                                                                "abandoned_in_flight": 0}
    internal = [r for r in of_type(log_records(tmp_path / "soak.jsonl"), "request") if r["error"]]
    assert [r["detail"] for r in internal] == ["OverflowError: int too large to convert to float\nsecond line"] * 4


def test_streams_that_all_die_end_the_soak_with_one_line(tmp_path, monkeypatch):
    """A stream dies only when it cannot log (here: every request line fails to write); with none left the soak
    ends at once, not at its duration, and says why."""
    plain = soak_run.Log.write

    def write(self, record, sync=False):
        if record["type"] == "request":
            raise OSError(28, "No space left on device")
        plain(self, record, sync)

    monkeypatch.setattr(soak_run.Log, "write", write)
    with serving(step_delay=0.001) as engine:
        outcome = soak_run.run(_plan(engine.url, tmp_path / "soak.jsonl", duration_s=3600.0), bench_suite.load(),
                               None)
    assert outcome.ended == "streams" and outcome.summary["elapsed_s"] < 3600
    assert outcome.message.startswith("every request stream failed (stream ")
    assert "OSError: [Errno 28] No space left on device" in outcome.message and str(tmp_path) in outcome.message
    assert "ended: every request stream failed" in report.summary_lines(outcome.summary)[0]


def test_a_soak_where_nothing_succeeded_exits_1(tmp_path):
    with serving(fail_every=1) as engine:
        proc = subprocess.run(sparkstack_cmd() + ["soak", engine.url, "--duration", "10m", "--max-requests", "4",
                                                  "--health-interval", "0.1", "--log", str(tmp_path / "s.jsonl")],
                              capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert proc.returncode == 1, proc.stderr
    assert "errors by kind: http_500 4" in proc.stdout
    assert proc.stderr.splitlines()[-1].startswith("sparkstack: error: no request succeeded (errors by kind: "
                                                   "http_500 4)")


def test_the_drain_is_outside_every_window(tmp_path):
    """Requests still running at the end (each takes at least 4 steps of 1 s; the soak lasts 1 s) finish in the
    drain: logged and counted, but in no window, so the last window ends at the duration, not the drain's end."""
    log = tmp_path / "soak.jsonl"
    with serving(step_delay=1.0, accept_pattern=(2, 1), cycles=2) as engine:
        proc = subprocess.run(sparkstack_cmd() + ["soak", engine.url, "--duration", "1s", "--concurrency", "2",
                                                  "--health-interval", "0.1", "--log", str(log), "--json"],
                              capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    records = log_records(log)
    windows = of_type(records, "window")
    drained = [r for r in of_type(records, "request") if r.get("drained")]
    assert s["drained"]["requests"] == len(drained) == s["requests"]["finished"] == s["requests"]["issued"] >= 1
    assert s["drained"]["ok"] == len(drained) and s["drained"]["output_tokens"] == s["tokens_served"]
    assert sum(w["requests"] for w in windows) == 0 and sum(w["output_tokens"] for w in windows) == 0
    assert windows[-1]["t_end"] < s["elapsed_s"] and s["drained"]["seconds"] > 0


def test_a_key_the_server_echoes_is_masked_in_the_log_and_the_output(tmp_path):
    log = tmp_path / "soak.jsonl"
    with serving(api_key="sk-SECRET-123", fail_every=2, echo_auth=True) as engine:
        proc = subprocess.run(sparkstack_cmd() + ["soak", engine.url, "--duration", "10m", "--max-requests", "4",
                                                  "--health-interval", "0.1", "--log", str(log)],
                              capture_output=True, text=True, timeout=WAIT_S, check=False,
                              env=dict(os.environ, VLLM_API_KEY="sk-SECRET-123"))
    assert proc.returncode == 0, proc.stderr
    assert "SECRET" not in log.read_text() + proc.stdout + proc.stderr
    failed = [r for r in of_type(log_records(log), "request") if r["error"]]
    assert len(failed) == 2 and all(r["detail"].endswith("bad key Bearer ***") for r in failed)


@pytest.mark.parametrize("args,says", [(["--top-p", "0"], "must be in (0, 1]"),
                                       (["--duration", "1M"], "is not a duration"),
                                       (["--duration", "\uff11m"], "is not a duration")])
def test_soak_options_are_refused_as_bench_refuses_them(tmp_path, args, says):
    argv = ["soak", "http://127.0.0.1:9", "--duration", "1m", "--log", str(tmp_path / "s.jsonl"), "--dry-run", *args]
    proc = subprocess.run(sparkstack_cmd() + argv, capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr


def test_categories_split_on_commas_as_in_bench(tmp_path):
    proc = subprocess.run(sparkstack_cmd() + ["soak", "http://127.0.0.1:9", "--duration", "1m", "--category",
                                              "code,json", "--category", "prose", "--dry-run", "--json"],
                          capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["plan"]["categories"] == ["code", "json", "prose"]


def test_server_text_reaches_the_terminal_escaped(tmp_path):
    """A model id carrying an OSC escape (it could retitle or hijack the terminal) is shown escaped."""
    with serving(model="evil\x1b]0;pwned\x07") as engine:
        proc = subprocess.run(sparkstack_cmd() + ["soak", engine.url, "--duration", "10m", "--max-requests", "2",
                                                  "--health-interval", "0.1", "--log", str(tmp_path / "s.jsonl")],
                              capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr and "(evil\\x1b]0;pwned\\x07)" in proc.stdout
