"""The endpoint client and metrics against the in-process stand-in engine.

Exact figures come from the acceptance pattern the stand-in is given (checks/lab/standin_engine.py says how it
advances vLLM's counters); times get consistency checks only.
"""

import time

import pytest

from inprocess_engine import serving
from sparkstack.endpoint import metrics
from sparkstack.endpoint.client import Endpoint, EndpointError, base_url
from sparkstack.errors import UsageError

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
                                 "http://h:1/?q=1"])
def test_bad_urls_are_usage_errors(url):
    with pytest.raises(UsageError):
        base_url(url)


def test_urls_are_normalised():
    assert base_url("http://h:8000/v1/") == "http://h:8000" == base_url("http://h:8000")
