"""`sparkstack top` against the in-process stand-in engine: exact figures from counters the test sets and from
the activity it drives between top's two reads; missing metrics as n/a; the live screen read back from tmux."""

import io
import json
import math
import os
import shlex
import signal
import subprocess
import threading

import pytest
from clirun import need, sparkstack_cmd, start
from inprocess_engine import serving, wait_for
from sparkstack.endpoint import metrics
from sparkstack.endpoint.client import Endpoint
from sparkstack.top.sample import History
from sparkstack.top.view import screen, sparkline

WAIT_S = 60
PROMPT = "the same prompt, sent twice: the second time every token of it is a prefix-cache hit"
BODY = {"model": "standin", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4096,
        "stream_options": {"include_usage": True}}


def top(*args, **kw):
    return subprocess.run(sparkstack_cmd() + ["top", *args], capture_output=True, text=True, timeout=WAIT_S, check=False, **kw)


def test_once_json_reports_the_activity_driven_between_its_two_reads():
    counters = (("preemptions", 7), ("prefix_queries", 1000), ("prefix_hits", 250), ("generation_tokens", 5000),
                ("drafts", 40), ("draft_tokens", 120), ("accepted", 90))
    with serving(counters=counters, busy=16, accept_pattern=(3, 1), cycles=2, spec_tokens=3) as engine:
        first_read, driven, reads = threading.Event(), threading.Event(), []
        plain = engine.metrics_text

        def metrics_text():  # the first read answers at once; the second waits until the test has driven
            reads.append(1)
            if len(reads) == 2:
                driven.wait(WAIT_S)
            text = plain()
            first_read.set()
            return text

        engine.metrics_text = metrics_text
        proc = subprocess.Popen(sparkstack_cmd() + ["top", engine.url, "--once", "--json", "--interval", "1"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert first_read.wait(WAIT_S)
            ep = Endpoint(engine.url)
            for _ in range(2):
                ep.stream_chat(BODY)
            with engine.lock:
                engine.c["preemptions"] += 2
            wait_for("the stand-in idle", lambda: engine.running == 0)
            driven.set()
            out, err = proc.communicate(timeout=WAIT_S)
        finally:
            proc.kill()
    assert proc.returncode == 0, err
    doc = json.loads(out)
    assert len(reads) == 2 and "two reads of /metrics 1 s apart" in doc["note"]
    # each request: 4 steps accepting 3,1,3,1 of 3 -> 4 drafts, 8 accepted; 1 + (4 + 2) * 2 = 13 tokens
    prompt_tokens = len(PROMPT) // 4
    assert doc["running"] == 16 and doc["waiting"] == 0 and doc["kv_cache_usage"] == 16 / 64
    assert doc["drafts_delta"] == 8 and doc["acceptance_length"] == 1 + 16 / 8
    assert doc["per_position"] == [1.0, 0.5, 0.5]
    gen = doc["generation_tokens"]
    assert gen["delta"] == 26 and gen["over_s"] >= 1 and gen["per_s"] == pytest.approx(26 / gen["over_s"], rel=1e-3)
    assert doc["prefix_cache"]["queries_delta"] == 2 * prompt_tokens and doc["prefix_cache"]["hit_rate"] == 0.5
    assert doc["preemptions"] == {"total": 9, "delta": 2, "over_s": doc["acceptance_over_s"]}
    assert doc["restarts_seen"] == 0 and doc["state"] == "ok" and doc["kv_pool_tokens"] is None


def test_missing_spec_metrics_are_na_never_a_crash():
    with serving(metrics="no-spec") as engine:
        proc = top(engine.url, "--once", "--json", "--interval", "0.2")
        screen = top(engine.url, "--once", "--interval", "0.2", env=dict(os.environ, COLUMNS="120"))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["acceptance_length"] is None and doc["per_position"] is None and doc["drafts_delta"] is None
    assert doc["running"] == 0 and doc["preemptions"]["total"] == 0
    assert screen.returncode == 0 and "Traceback" not in screen.stderr
    row = next(line for line in screen.stdout.splitlines() if "acceptance length" in line)
    assert "n/a" in row


def test_no_metrics_endpoint_gives_a_sample_of_na():
    with serving(metrics="none") as engine:
        proc = top(engine.url, "--once", "--json", "--interval", "0.2")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert "not found (404)" in doc["state"]
    assert doc["running"] is None and doc["kv_cache_usage"] is None and doc["prefix_cache"]["hit_rate"] is None


def test_a_dead_server_is_one_line():
    with serving() as engine:
        url = engine.url
    proc = top(url, "--once", "--interval", "0.2")
    assert proc.returncode == 1 and proc.stderr.splitlines() == [
        f"sparkstack: error: {url}/metrics: cannot connect (ConnectionError)"]


def test_the_recipe_gives_the_kv_pool_in_tokens():
    with serving(busy=32) as engine:
        proc = top(engine.url, "--once", "--json", "--interval", "0.2", "--recipe", "glm53-flash-dflash2-nvfp4")
    doc = json.loads(proc.stdout)
    # the shipped recipe's 10,247,694,336 B pin measured 989,727 tokens on GB10 (its [kv] point)
    assert doc["kv_pool_tokens"] == 989_727 and doc["kv_cache_usage"] == 0.5


def _scrape(at, generation, drafts, accepted):
    text = (f"vllm:generation_tokens_total {generation}\nvllm:spec_decode_num_drafts_total {drafts}\n"
            f"vllm:spec_decode_num_accepted_tokens_total {accepted}\n")
    return metrics.parse(text, at)


def test_history_keeps_a_minute_and_starts_over_after_a_restart():
    h = History(minute_s=60)
    for i in range(40):  # every 2 s for 80 s: 10 tokens, 1 draft, 2 accepted per read
        h.add(_scrape(2.0 * i, 10 * i, i, 2 * i))
    s = h.sample()
    assert s.generation_tokens_delta == 10 and s.interval_s == 2 and s.generation_tok_s == 5
    assert s.minute_s == 60 and s.drafts_delta == 30 and s.acceptance_length == 3
    assert len(h.series()["acceptance_length"]) == 30
    h.add(_scrape(80.0, 3, 1, 1))  # counters went back: a new engine
    s = h.sample()
    assert h.restarts_seen == 1 and s.restarts_seen == 1 and s.interval_s is None and s.acceptance_length is None
    h.add(_scrape(82.0, 13, 2, 3))
    assert h.sample().generation_tokens_delta == 10 and h.sample().acceptance_length == 3


def test_sparkline():
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([None, 0.0, 1.0], lo=0, hi=1) == " ▁█"
    assert sparkline([]) == "" and sparkline([None]) == ""
    assert sparkline([5, 5]) == "▄▄" and sparkline([0, 0]) == "▁▁"
    assert len(sparkline(list(range(100)))) == 30


def test_the_live_screen_in_a_terminal(tmp_path):
    """tmux runs `top` in a real terminal; the captured screen must show every field with live figures."""
    tmux = need("tmux")
    sock = f"sparkstack-test-{os.getpid()}"

    def tm(*args):
        return subprocess.run([tmux, "-L", sock, *args], capture_output=True, text=True, timeout=WAIT_S, check=False)

    # every step accepts 2 of 4: acceptance length exactly 3 and per-position rates 1, 1, 0, 0 in any interval
    with serving(accept_pattern=(2,), cycles=20, step_delay=0.005, busy=8, counters=(("preemptions", 3),)) as engine:
        stop = threading.Event()

        def traffic():
            ep = Endpoint(engine.url)
            while not stop.is_set():
                ep.stream_chat(BODY)

        driver = threading.Thread(target=traffic, daemon=True)
        driver.start()
        url = engine.url
        command = shlex.join(["env", f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}", *sparkstack_cmd(), "top",
                              engine.url, "--interval", "0.3"])
        try:
            assert tm("new-session", "-d", "-s", "top", "-x", "110", "-y", "30", command).returncode == 0
            tm("set-option", "-t", "top", "remain-on-exit", "on")

            def screen():  # once five intervals are in the sparklines
                text = tm("capture-pane", "-p", "-t", "top").stdout
                spark = [line.split("│")[4].strip() for line in text.splitlines()
                         if "acceptance length" in line and line.count("│") >= 5]
                return text if spark and len(spark[0]) >= 5 and "position 4" in text else None

            text = wait_for("the live screen with figures", screen)
            (tmp_path / "top-screen.txt").write_text(text)
            print(text)
            tm("send-keys", "-t", "top", "C-c")
            wait_for("top to quit", lambda: tm("display", "-p", "-t", "top", "#{pane_dead}").stdout.strip() == "1")
            # exit status, or the signal when the process died of one (a loaded machine can deliver Ctrl-C
            # while Python is still starting a read: the default SIGINT death is also a quiet quit)
            # tmux 3.3a sometimes records neither status nor signal for a dead pane: then only "quit, no traceback"
            # can be checked
            status = tm("display", "-p", "-t", "top",
                        "#{pane_dead_status}#{?pane_dead_signal,sig#{pane_dead_signal},}").stdout.strip() or "unknown"
            after = tm("capture-pane", "-p", "-t", "top").stdout
        finally:
            stop.set()
            tm("kill-server")
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in text.splitlines() if line.count("│") >= 5}
    assert f"sparkstack top  {url}  every 0.3 s" in text
    for name in ("requests running", "requests waiting", "generation tok/s", "acceptance length", "KV cache usage",
                 "prefix-cache hit rate", "preemptions", "position 1", "position 4"):
        assert name in rows, (name, text)
    assert rows["acceptance length"][0] == "3.000"
    assert [rows[f"position {i}"][0] for i in range(1, 5)] == ["1.00", "1.00", "0.00", "0.00"]
    assert rows["preemptions"][0] == "3" and rows["preemptions"][1].startswith("+0 in ")
    assert rows["requests waiting"][0] == "0" and int(rows["requests running"][0]) in (8, 9)
    assert float(rows["generation tok/s"][0]) > 0 and rows["KV cache usage"][0].endswith("%")
    # sparklines of the last minute: length 3 on the 1..5 scale is the middle block; rates 1 and 0 the ends
    assert set(rows["acceptance length"][2]) == {"▅"}
    assert [set(rows[f"position {i}"][2]) for i in range(1, 5)] == [{"█"}, {"█"}, {"▁"}, {"▁"}]
    assert status in ("0", "130", "sig2", "unknown") and "Traceback" not in after, (status, after)


def test_nan_and_inf_figures_are_na_on_screen_in_json_and_in_the_kv_pool():
    h = History()
    for at, odd in ((0.0, math.nan), (2.0, math.inf)):
        h.add(metrics.Scrape(at, {metrics.KV_USAGE[0]: odd, metrics.RUNNING: odd, metrics.GENERATION_TOKENS: odd,
                                  metrics.PREEMPTIONS: 3.0}, {}))
    doc = h.sample().to_json()
    json.dumps(doc, allow_nan=False)  # no NaN or Infinity in --json
    assert doc["kv_cache_usage"] is None and doc["running"] is None and doc["generation_tokens"]["per_s"] is None
    assert doc["preemptions"]["total"] == 3
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=160).print(screen("http://x", 2.0, h, "ok", 1000, ""))
    rows = {line.split("│")[1].strip(): line for line in out.getvalue().splitlines() if line.count("│") >= 5}
    assert "n/a" in rows["KV cache usage"] and "pool 1,000 tokens" in rows["KV cache usage"]
    assert "nan" not in out.getvalue().lower() and "inf" not in out.getvalue().lower()


@pytest.mark.parametrize("mode,says", [("http500", "/metrics: HTTP 500"),
                                       ("garbage", "/metrics is not Prometheus text exposition")])
def test_once_with_a_failing_metrics_endpoint_is_a_state_and_na(mode, says):
    """A server that answers /metrics with an error or with garbage is reachable: --once shows the state and
    n/a figures and exits 0 (as for a server without /metrics); only a server that does not answer exits 1."""
    with serving(metrics=mode) as engine:
        url = engine.url
        proc = top(engine.url, "--once", "--json", "--interval", "0.2")
        shown = top(engine.url, "--once", "--interval", "0.2", env=dict(os.environ, COLUMNS="200"))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["state"].startswith(f"{url}{says}")
    assert doc["state"].endswith(": every figure is n/a") and doc["running"] is None
    assert shown.returncode == 0 and says in shown.stdout and "Traceback" not in shown.stderr


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)], ids=["term", "hup"])
def test_follow_stopped_by_a_signal_flushes_its_lines_and_says_which(sig, code):
    """Ctrl-C quits top (exit 0); `kill` or a hangup stops it as well, with 128 + the signal's number."""
    with serving(busy=16) as engine:
        proc = start(sparkstack_cmd() + ["top", engine.url, "--json", "--interval", "0.1"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = proc.stdout.readline()
            assert json.loads(first)["state"] == "ok"
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=WAIT_S)
        finally:
            proc.kill()
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert all(json.loads(line)["url"] == engine.url for line in out.splitlines())  # every line flushed whole


def test_follow_json_lines_have_null_figures_while_unreachable():
    with serving(busy=16) as engine:
        proc = subprocess.Popen(sparkstack_cmd() + ["top", engine.url, "--json", "--interval", "0.1"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = json.loads(proc.stdout.readline())
            assert first["state"] == "ok" and first["running"] == 16
            engine.stop()
            while True:  # lines until a read fails
                doc = json.loads(proc.stdout.readline())
                if doc["state"] != "ok":
                    break
        finally:
            proc.kill()
            proc.communicate()
    assert doc["state"].startswith("unreachable: ")
    assert doc["running"] is None and doc["kv_cache_usage"] is None and doc["preemptions"]["total"] is None
