"""A real restart: the real server killed in the middle of a soak and started again on the same port. soak counts
exactly one restart, from vLLM's own counters going back to zero, with the downtime, and loses no record; top,
reading all along, shows the gap (no figures) and then the new counters."""

import json
import signal
import subprocess
import time

from clirun import sparkstack_cmd, start
import pytest

# The servers are booted once per worker: every test that uses them runs on one (docs/testing.md, the real-engine tier: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("vllm")

BOUND_S = 900.0  # bounds on phases of the test, never measured figures


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _wait(what, predicate, bound=BOUND_S):
    t0 = time.monotonic()
    while time.monotonic() - t0 < bound:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def _top_samples(path):
    """top's JSON lines so far (click flushes each); a line it is still writing is not one yet."""
    samples = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            samples.append(json.loads(line))
        except ValueError:
            break
    return samples


def _figures(sample):
    return sample.get("state") == "ok" and sample.get("running") is not None


def test_soak_and_top_across_a_real_restart(plain_server, tmp_path):
    log = tmp_path / "soak.jsonl"
    top_out = tmp_path / "top.jsonl"
    soak = start(sparkstack_cmd() + ["soak", plain_server.url, "--duration", "30m", "--concurrency", "1",
                                     "--window", "20s", "--log", str(log), "--health-interval", "0.5",
                                     "--dead-after", "15m", "--max-tokens", "32", "--temperature", "0",
                                     "--timeout", "30", "--json"],
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    top = start(sparkstack_cmd() + ["top", plain_server.url, "--json", "--interval", "0.5"],
                stdout=open(top_out, "w"), stderr=subprocess.PIPE, text=True)
    try:
        _wait("three requests before the kill", lambda: sum(r["type"] == "request" for r in _lines(log)) >= 3)
        # top must have read the old counters before the kill, or there is nothing for the new ones to go back from
        # (under load its first read came after the kill once: it saw the gap, then counters it had no past for)
        _wait("top's first figures", lambda: any(map(_figures, _top_samples(top_out))), bound=120)
        plain_server.kill()
        _wait("soak sees /health down", lambda: any(r["type"] == "health" and not r["ok"] for r in _lines(log)))
        plain_server.start().wait_healthy()
        after_restart = lambda: [r for r in _lines(log) if r["type"] == "restart"]  # noqa: E731
        _wait("the restart in the log", after_restart)
        _wait("two requests served after the restart",
              lambda: sum(r["type"] == "request" and r["error"] is None
                          and r["t_start"] > after_restart()[0]["t"] for r in _lines(log)) >= 2)
        _wait("top's figures after the restart",  # top reads on its own clock: its read after the restart, too
              lambda: (lambda t: bool(t) and _figures(t[-1]) and any(x["state"] != "ok" for x in t))(_top_samples(top_out)),
              bound=120)
        soak.send_signal(signal.SIGINT)
        out, err = soak.communicate(timeout=120)
        top.send_signal(signal.SIGINT)  # top's way to quit: its lines so far are flushed
        top.wait(timeout=60)
    finally:
        for p in (soak, top):
            if p.poll() is None:
                p.kill()
            p.wait(timeout=60)
    summary = json.loads(out)
    records = _lines(log)
    requests_logged = [r for r in records if r["type"] == "request"]
    assert summary["restarts"]["count"] == 1, summary["restarts"]
    assert "counters went back" in summary["restarts"]["signals"][0]["signal"]
    assert summary["health"]["flaps"] == 1 and summary["health"]["down_s"] > 0
    # no record lost: every request that finished is in the log, numbered without a gap
    assert len(requests_logged) == summary["requests"]["finished"]
    assert sorted(r["n"] for r in requests_logged) == list(range(len(requests_logged)))
    # top: figures while the server was up, nothing while it was down, then the new counters
    samples = [json.loads(x) for x in top_out.read_text().splitlines() if x.strip()]
    states = [s.get("restarts_seen") for s in samples]
    assert states[-1] == 1, samples[-3:]
    gap = [i for i, s in enumerate(samples) if s["state"] != "ok"]
    assert gap, "top never showed the gap"
    assert all(samples[i]["running"] is None and samples[i]["generation_tokens"]["per_s"] is None for i in gap)
    assert states[gap[0] - 1] == 0 and samples[gap[0] - 1]["running"] is not None  # before: the old counters
    later = samples[gap[-1] + 1:]
    assert later and all(s["state"] == "ok" and s["restarts_seen"] == 1 for s in later)
