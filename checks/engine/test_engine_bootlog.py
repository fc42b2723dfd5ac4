"""The real boot log of this session's vLLM server, parsed end to end by the boot timeline that `launch all` and
`launch status` use (launch.timeline.parse_rank over `docker logs --timestamps`-shaped lines).

vLLM 0.32 (CPU) prints, in this order: `Loading weights took 0.00 seconds`, `CPU KV cache size: 1,048,576
tokens, Maximum concurrency for 8,192 tokens per request: ...x` (one line, device first), `init engine (profile,
create kv cache, warmup model) took 38.54 s` (" s"), `Application startup complete.`; no `Model loading took`
and no graph capture (CPU, eager)."""

import re


from sparkstack.launch import timeline
import pytest

# The servers are booted once per worker: every test that uses them runs on one (docs/testing.md, the real-engine tier: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("vllm")


def _parse(server):
    boot = server.boots[0]
    return timeline.parse_rank(0, server.boot_log(0), boot["started"]), server.boot_log(0)


def test_the_timeline_reads_weights_and_api_ready_in_order(spec_server):
    t, _ = _parse(spec_server)
    phases = dict(t.phases)
    assert t.fatal is None
    assert phases["weights loaded"] is not None and phases["API ready"] is not None
    assert 0 <= phases["weights loaded"] <= phases["API ready"]


def test_the_timeline_reads_every_phase_0_32_prints(spec_server):
    t, log = _parse(spec_server)
    phases = dict(t.phases)
    printed = re.search(r"KV cache size: ([\d,]+) tokens", log)
    assert printed, "the server printed no KV cache size line"
    assert phases.get("KV profiled") is not None and phases.get("engine ready") is not None
    assert t.kv_tokens == int(printed.group(1).replace(",", ""))
    assert phases["weights loaded"] <= phases["KV profiled"] <= phases["engine ready"] <= phases["API ready"]
