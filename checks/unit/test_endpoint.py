"""The endpoint client and metrics against the in-process stand-in engine.

Exact figures come from the acceptance pattern the stand-in is given (checks/lab/standin_engine.py says how it
advances vLLM's counters); times get consistency checks only.
"""

import contextlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from inprocess_engine import serving
from sparkstack.endpoint import client, metrics
from sparkstack.endpoint.client import Endpoint, EndpointError, base_url
from sparkstack.errors import SparkstackError, UsageError

BODY = {"model": "standin", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4096,
        "stream_options": {"include_usage": True}}


def test_spec_delta_follows_the_pattern_exactly():
    # pattern 3,1 per request, 2 cycles: 4 drafts, 8 accepted; position 0 accepted on every draft, 1 and 2 on half
    with serving(accept_pattern=(3, 1), cycles=2, spec_tokens=3) as engine:
        ep = Endpoint(engine.url)
        before = ep.scrape()
        for _ in range(2):
            ep.stream_chat(BODY)
        delta = metrics.spec_delta(before, ep.scrape())
    assert (delta.drafts, delta.draft_tokens, delta.accepted) == (8, 24, 16)
    assert delta.acceptance_length == 1 + 16 / 8
    assert delta.per_position == (1.0, 0.5, 0.5)
    assert not delta.collapsed


def test_all_drafts_rejected_is_a_collapse():
    with serving(accept_pattern=(0,), cycles=5) as engine:
        ep = Endpoint(engine.url)
        before = ep.scrape()
        ep.stream_chat(BODY)
        delta = metrics.spec_delta(before, ep.scrape())
    assert delta.drafts == 5 and delta.acceptance_length == 1.0 and delta.collapsed


def test_stream_timing_and_usage():
    with serving(role_delay=0.2, accept_pattern=(1,), cycles=4) as engine:
        r = Endpoint(engine.url).stream_chat(BODY)
    # prefill's token, then 4 steps of 2 tokens
    assert r.usage["completion_tokens"] == 1 + 4 * 2 == r.output_tokens
    assert r.first_chunk_s <= r.first_token_s - 0.2 + 0.05  # the role-only chunk came well before any token
    assert len(r.token_times_s) == 5 and list(r.token_times_s) == sorted(r.token_times_s)
    assert r.decode_s == pytest.approx(sum(r.itls_s)) and r.tpot_s == pytest.approx(r.decode_s / 8)
    assert r.finish_reason == "stop" and r.content.split()[:2] == ["alpha", "bravo"]


def test_no_spec_counters_and_no_metrics():
    with serving(metrics="no-spec") as engine:
        scrape = Endpoint(engine.url).scrape()
        assert scrape is not None and not metrics.has_spec(scrape) and metrics.spec_delta(scrape, scrape) is None
    with serving(metrics="none") as engine:
        assert Endpoint(engine.url).scrape() is None


@pytest.mark.parametrize("fields,kind", [({"fail_every": 1}, "http_500"), ({"malformed": True}, "malformed"),
                                         ({"hang": True}, "timeout")])
def test_failures_are_one_error_with_a_kind(fields, kind):
    with serving(**fields) as engine:
        with pytest.raises(EndpointError) as err:
            Endpoint(engine.url, timeout=1).stream_chat(BODY)
    assert err.value.kind == kind and "\n" not in str(err.value)


def test_a_dead_server_is_unhealthy_and_a_connect_error():
    with serving() as engine:
        url = engine.url
    ep = Endpoint(url, timeout=2)
    assert ep.health()[0] is False
    with pytest.raises(EndpointError) as err:
        ep.stream_chat(BODY)
    assert err.value.kind == "connect"


def test_restart_shows_as_counters_going_back():
    with serving() as engine:
        ep = Endpoint(engine.url)
        ep.stream_chat(BODY)
        before = ep.scrape()
    time.sleep(0)
    with serving() as engine:
        after = Endpoint(engine.url).scrape()
    assert metrics.DRAFTS in metrics.went_back(before, after)


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "ftp://h", "http://", "http://h:99999", "http://u:p@h:1",
                                 "http://h:1/?q=1", "http://[::1"])
def test_bad_urls_are_usage_errors(url):
    with pytest.raises(UsageError):
        base_url(url)


def test_urls_are_normalised():
    assert base_url("http://h:8000/v1/") == "http://h:8000" == base_url("http://h:8000")


# ---- hostile servers: what the stand-in engine cannot do, written as raw HTTP


class _Raw(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        self.server.script(self)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.script(self)


@contextlib.contextmanager
def hostile(script):
    """A server whose every request is answered by `script(handler)` writing raw bytes to handler.wfile."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Raw)
    server.daemon_threads = True
    server.script = script
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _head(h, ctype="text/event-stream", extra=b""):
    h.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: " + ctype.encode() + b"\r\n" + extra + b"\r\n")
    h.wfile.flush()


ROLE = b'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}\n\n'


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _stall_chunked(h):
    _head(h, extra=b"Transfer-Encoding: chunked\r\n")
    h.wfile.write(_chunk(ROLE))
    h.wfile.flush()
    time.sleep(3)


def _stall_plain(h):
    _head(h, extra=b"Connection: close\r\n")
    h.wfile.write(ROLE)
    h.wfile.flush()
    time.sleep(3)


def _cut_short(h):
    _head(h, extra=b"Content-Length: 5000\r\n")
    h.wfile.write(ROLE)
    h.wfile.flush()


def _keepalive_drip(h):
    _head(h, extra=b"Transfer-Encoding: chunked\r\n")
    h.wfile.write(_chunk(ROLE))
    for _ in range(40):
        h.wfile.write(_chunk(b": keepalive\n\n"))
        h.wfile.flush()
        time.sleep(0.1)


def _huge_tool_index(h):
    _head(h, extra=b"Connection: close\r\n")
    h.wfile.write(b'data: {"choices": [{"delta": {"tool_calls": [{"index": 1e999}]}}]}\n\ndata: [DONE]\n\n')


def _html(h):
    _head(h, ctype="text/html", extra=b"Connection: close\r\n")
    h.wfile.write(b"<html>log in</html>")


def _redirect(h):
    h.wfile.write(b"HTTP/1.1 302 Found\r\nLocation: http://elsewhere.invalid/\r\nContent-Length: 0\r\n"
                  b"Connection: close\r\n\r\n")


@pytest.mark.parametrize("script,kind", [(_stall_chunked, "timeout"), (_stall_plain, "timeout"),
                                         (_cut_short, "stream_cut"), (_keepalive_drip, "timeout"),
                                         (_huge_tool_index, "malformed"), (_html, "malformed"),
                                         (_redirect, "http_302")])
def test_hostile_streams_are_one_error_of_their_kind(script, kind):
    with hostile(script) as url:
        t0 = time.monotonic()
        with pytest.raises(EndpointError) as err:
            Endpoint(url, timeout=1).stream_chat(BODY)
    assert err.value.kind == kind and "\n" not in str(err.value), str(err.value)
    assert time.monotonic() - t0 < 3.5  # bounded by the 1 s silence limit, not by the server (4 s of comments)
    if script is _html:
        assert "text/html" in str(err.value)


def test_a_redirect_is_not_followed_for_health_or_metrics():
    with hostile(_redirect) as url:
        ep = Endpoint(url, api_key="sk-x")
        ok, detail = ep.health()
        assert not ok and "not followed" in detail
        with pytest.raises(EndpointError, match="redirect"):
            ep.scrape()


def test_metrics_refuse_hostile_positions_and_drop_non_finite_values():
    big = 'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="30000000"} 1\n'
    with pytest.raises(SparkstackError, match="position label"):
        metrics.parse(big, 0.0)
    scrape = metrics.parse("vllm:spec_decode_num_drafts_total NaN\nvllm:num_requests_running +Inf\n"
                           'vllm:kv_cache_usage_perc{engine="0"} 0.6\nvllm:kv_cache_usage_perc{engine="1"} 0.5\n', 0.0)
    assert metrics.DRAFTS not in scrape.values and metrics.RUNNING not in scrape.values
    assert scrape.get(*metrics.KV_USAGE) == 0.6  # the fullest engine, not 110%


def test_server_text_is_escaped_for_the_terminal():
    assert client.printable("m\x1b]0;title\x07 ok") == "m\\x1b]0;title\\x07 ok"


def test_negative_or_boolean_usage_is_not_trusted():
    base = dict(first_chunk_s=0.0, first_token_s=0.1, end_s=1.0, token_times_s=(0.1, 0.2, 0.3), content="",
                reasoning="", reasoning_field=None, tool_calls=(), finish_reason="stop", chunks=4)
    assert client.StreamResult(usage={"completion_tokens": -1000}, **base).output_tokens == 3
    assert client.StreamResult(usage={"completion_tokens": True}, **base).output_tokens == 3
    assert client.StreamResult(usage={"completion_tokens": 7}, **base).output_tokens == 7
