"""`sparkstack verify` against the in-process stand-in engine (checks/lab/standin_engine.py).

Every check passes against the default stand-in; each fault mode the stand-in is given fails (required) or warns
(warn-only) exactly the checks it breaks. Figures are derived from what the stand-in was given: its acceptance
pattern, its prompt-token rule (len // 4), its words. Times are never asserted.
"""

import io
import json
import os
import re
import subprocess
import time

import pytest
from clirun import sparkstack_cmd
from inprocess_engine import Behaviour, serving
import click
from sparkstack.cli import main as cli_main
from sparkstack.verify.run import plan_verify, run_verify, verdict
from sparkstack.verify.checks import CHECKS, IMAGE_PNG, LONG_PROMPT, SAMPLING_ANSWERS, SPEC_PROMPT, TOOL_ARGS, TOOL_NAME

NAMES = [c.name for c in CHECKS]
REQUIRED = {c.name for c in CHECKS if c.required}
KEY = "sk-standin-9f3c1e77"


def verify(url, key=None, model=None, timeout=30.0):
    plan = plan_verify(url, model, "VLLM_API_KEY", {"VLLM_API_KEY": key or ""}, timeout)
    return run_verify(plan, key)


def statuses(results):
    return {r.check: r.status for r in results}


def cli(*args, env=None):
    full = {**os.environ, "VLLM_API_KEY": "", **(env or {})}
    return subprocess.run(sparkstack_cmd() + ["verify", *args], capture_output=True, text=True, env=full, timeout=120,
                          check=False)


def test_the_checks_are_the_ones_asked_for():
    assert NAMES == ["health", "models", "chat", "stream-usage", "tool-call", "reasoning", "spec-decode", "sampling",
                     "image", "fffd", "prefix-cache"]
    assert {c.name for c in CHECKS if not c.required} == {"image", "fffd", "prefix-cache"}


def test_every_check_passes_against_the_default_standin():
    pattern, cycles = Behaviour.accept_pattern, Behaviour.cycles
    with serving() as engine:
        results = verify(engine.url)
    by_name = {r.check: r for r in results}
    assert statuses(results) == dict.fromkeys(NAMES, "pass"), [r.line() for r in results]
    assert verdict(results) is None
    # One streamed request runs the pattern `cycles` times: one draft per step, as vLLM's spec-decode counters count.
    drafts = len(pattern) * cycles
    length = 1 + sum(pattern) / len(pattern)
    rates = "/".join(f"{sum(a > i for a in pattern) / len(pattern):.2f}" for i in range(Behaviour.spec_tokens))
    assert by_name["spec-decode"].detail == f"acceptance length {length:.2f} over {drafts} drafts, per position {rates}"
    assert by_name["tool-call"].detail.startswith(f"{TOOL_NAME}({json.dumps(TOOL_ARGS)})")
    assert by_name["models"].detail.startswith("asking standin ")
    # The first send of the long prompt is new, the second hits all of it (the stand-in counts len // 4 tokens).
    tokens = len(LONG_PROMPT) // 4
    assert by_name["prefix-cache"].detail.endswith(f"+{tokens} hit tokens of +{2 * tokens} queried")
    assert by_name["reasoning"].detail.startswith("no reasoning in this answer")



def test_spec_decode_asks_greedily_and_sampling_at_the_serving_temperature():
    with serving() as engine:
        plan = plan_verify(engine.url, None, "VLLM_API_KEY", {}, 30.0, 1.0)
        statuses(run_verify(plan, None))
        streamed = [b for b in engine.chat_bodies if b.get("stream")]
        with_logprobs = [b for b in engine.chat_bodies if b.get("logprobs")]
    spec = [b for b in streamed if b["messages"][-1]["content"] == SPEC_PROMPT]
    assert len(spec) == 1 and spec[0]["temperature"] == 0, spec
    assert len(with_logprobs) == 1 and with_logprobs[0]["temperature"] == 1.0, with_logprobs


def test_sampling_reads_every_answer_and_fails_on_one_corrupted_of_eight():
    """The real pair's fault corrupts some answers and spares others: the check asks for several at once, so one
    corrupted answer among clean ones still fails it, and the detail says how many answers were hit."""
    with serving(corrupt_every=1, corrupt_answer=5) as engine:
        results = verify(engine.url)
    sampling = {r.check: r for r in results}["sampling"]
    assert sampling.status == "fail", sampling.line()
    n = SAMPLING_ANSWERS
    bad, total = map(int, re.match(rf"(\d+) of (\d+) sampled tokens in {n} answers at temperature 1 have logprob "
                                   "below", sampling.detail).groups())
    assert bad > 0 and bad * n == total, sampling.detail  # every token of the one corrupted answer, and no other
    assert "(in 1 of the answers; lowest -113.0)" in sampling.detail, sampling.detail
    with serving(corrupt_every=1, corrupt_answer=n) as engine:  # an answer the check does not ask for
        results = verify(engine.url)
    assert {r.check: r.status for r in results}["sampling"] == "pass"


def test_sampling_asks_one_answer_at_temperature_0():
    """vLLM refuses "n" > 1 under greedy sampling (HTTP 400, as the stand-in does): at temperature 0 the check
    asks one answer, which is every answer there."""
    with serving() as engine:
        plan = plan_verify(engine.url, None, "VLLM_API_KEY", {}, 30.0, 0.0)
        sampling = {r.check: r for r in run_verify(plan, None)}["sampling"]
        asked = [b.get("n") for b in engine.chat_bodies if b.get("logprobs")]
    assert sampling.status == "pass" and "in 1 answer at temperature 0," in sampling.detail, sampling.line()
    assert asked == [1]


def test_sampling_asks_one_answer_below_vllms_greedy_line():
    with serving() as engine:  # the stand-in refuses n > 1 below 1e-5, as vLLM does
        plan = plan_verify(engine.url, None, "VLLM_API_KEY", {}, 30.0, 0.000001)
        sampling = {r.check: r for r in run_verify(plan, None)}["sampling"]
    assert sampling.status == "pass" and "in 1 answer at temperature 1e-06," in sampling.detail, sampling.line()


def test_fewer_answers_than_asked_is_no_verdict():
    """A server that ignores "n" answers once: the check cannot judge what it was built to catch, so it fails."""
    with serving(most_answers=1) as engine:
        sampling = {r.check: r for r in verify(engine.url)}["sampling"]
    assert sampling.status == "fail" and sampling.detail.startswith(
        f"1 of the {SAMPLING_ANSWERS} answer(s) asked came back with logprobs"), sampling.line()

# fault mode -> the checks it must break, and a word each detail must carry; every other check passes
FAULTS = [
    ({"tool_fault": "leak"}, {"tool-call": "markup leaked into content"}),
    ({"tool_fault": "args"}, {"tool-call": '{"unexpected": true}, not'}),
    ({"reasoning_tokens": 6, "reasoning_fault": "merge"}, {"reasoning": "<think> markup in content"}),
    ({"no_usage": True}, {"stream-usage": "no usage chunk"}),
    ({"accept_pattern": (0,)}, {"spec-decode": f"acceptance length 1.00 over {Behaviour.cycles} drafts: every draft rejected (vLLM #53030)"}),
    # one accepted token in 63 drafts (21 steps a pass, 3 passes): collapsed, but not every draft rejected
    ({"accept_pattern": (0,) * 20 + (1,)}, {"spec-decode": f"acceptance length 1.05 over {21 * Behaviour.cycles} "
                                                           "drafts: nearly every draft rejected (vLLM #53030)"}),
    ({"metrics": "no-spec"}, {"spec-decode": "no spec-decode counters"}),
    ({"metrics": "none"}, {"spec-decode": "no /metrics", "prefix-cache": "no /metrics"}),
    ({"no_mm": True}, {"image": "chat_template_mm.jinja"}),
    ({"fffd": True}, {"fffd": "3 U+FFFD in 3 of 3 passes"}),
    ({"prefix_cache": False}, {"prefix-cache": "raised no vllm:prefix_cache_hits_total"}),
]


@pytest.mark.parametrize("fields,broken", FAULTS, ids=[",".join(f"{k}={v}" for k, v in f.items()) for f, _ in FAULTS])
def test_each_fault_breaks_exactly_its_own_checks(fields, broken):
    with serving(**fields) as engine:
        results = verify(engine.url)
    by_name = {r.check: r for r in results}
    expected = {name: ("fail" if name in REQUIRED else "warn") if name in broken else "pass" for name in NAMES}
    assert statuses(results) == expected, [r.line() for r in results]
    for name, words in broken.items():
        assert words in by_name[name].detail, by_name[name].detail
    assert (verdict(results) is None) == (not set(broken) & REQUIRED)


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_reasoning_in_either_field_is_kept_apart(field):
    with serving(reasoning_tokens=6, reasoning_field=field) as engine:
        results = verify(engine.url)
    assert statuses(results) == dict.fromkeys(NAMES, "pass"), [r.line() for r in results]
    detail = {r.check: r.detail for r in results}["reasoning"]
    # the prefill's token, then a step of 4 accepted + 1: six words of reasoning, each " " + word
    assert detail.startswith(f"{len(' alpha bravo charlie delta echo foxtrot')} chars of reasoning in `{field}`")


def test_a_model_that_is_not_served_fails_models():
    with serving() as engine:
        results = verify(engine.url, model="other/model")
        asked = [path for _, path, _ in engine.requests_seen]
    assert statuses(results)["models"] == "fail" and "'other/model' is not served" in results[1].detail
    assert "/v1/chat/completions" in asked  # --model is the user's: the checks still ask it
    with serving(model="org/served") as engine:
        assert statuses(verify(engine.url, model="org/served")) == dict.fromkeys(NAMES, "pass")


def test_the_png_is_a_real_image():
    from matplotlib import image

    pixels = image.imread(io.BytesIO(IMAGE_PNG), format="png")
    assert pixels.shape == (64, 64, 3)
    assert [round(float(v) * 255) for v in pixels[17, 42]] == [220, 30, 30]


# ---------------------------------------------------------------- the command


def test_cli_lines_exit_codes_and_json():
    with serving() as engine:
        ok = cli(engine.url)
        as_json = cli(engine.url, "--json")
    assert ok.returncode == 0 and ok.stderr == ""
    assert [line.split(":")[0] for line in ok.stdout.splitlines()] == [f"pass  {n}" for n in NAMES]
    doc = json.loads(as_json.stdout)
    assert list(doc) == ["checks"] and [list(c) for c in doc["checks"]] == [["check", "status", "detail"]] * len(NAMES)
    assert [c["status"] for c in doc["checks"]] == ["pass"] * len(NAMES)

    with serving(no_mm=True) as engine:  # warn-only: still exit 0
        warned = cli(engine.url)
    assert warned.returncode == 0 and "warn  image: " in warned.stdout
    with serving(tool_fault="leak") as engine:
        failed = cli(engine.url)
        failed_json = cli(engine.url, "--json")
    assert failed.returncode == 1 and "fail  tool-call: " in failed.stdout
    assert failed.stderr == "sparkstack: error: verify: 1 required check(s) failed: tool-call\n"
    assert failed_json.returncode == 1 and json.loads(failed_json.stdout)["checks"][4]["status"] == "fail"


@pytest.mark.parametrize("env_name", [None, "MY_ENDPOINT_KEY"])
def test_the_key_reaches_the_server_from_the_environment_and_is_never_shown(env_name):
    with serving(api_key=KEY) as engine:
        args = [engine.url] + (["--api-key-env", env_name] if env_name else [])
        proc = cli(*args, env={env_name or "VLLM_API_KEY": KEY})
        seen = list(engine.requests_seen)
        dry = cli(*args, "--dry-run", "--json", env={env_name or "VLLM_API_KEY": KEY})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert KEY not in proc.stdout + proc.stderr + dry.stdout + dry.stderr and KEY not in " ".join(proc.args)
    v1 = [auth for _, path, auth in seen if path.startswith("/v1/")]
    assert v1 and set(v1) == {f"Bearer {KEY}"}
    assert json.loads(dry.stdout)["api_key_set"] is True
    verify_cmd = cli_main.get_command(click.Context(cli_main), "verify")
    assert not [p.name for p in verify_cmd.params if "key" in p.name and p.name != "api_key_env"]  # no key option


def test_without_the_key_the_server_refuses_and_the_line_says_where_the_key_comes_from():
    with serving(api_key=KEY) as engine:
        url = engine.url
        proc = cli(url)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 1 and lines[0].startswith("pass  health")  # /health needs no key, as in vLLM
    assert lines[1] == f"fail  models: {url}/v1/models: HTTP 401: Unauthorized (the key is read from $VLLM_API_KEY)"


def test_a_key_the_server_echoes_is_masked():
    """A hostile or careless server may put what it was sent into an error message."""
    with serving(model=KEY) as engine:  # the stand-in names its model in answers and in /v1/models
        results = verify(engine.url, key=KEY)
    text = "\n".join(r.line() for r in results)
    assert KEY not in text and "asking *** " in text


def assert_clear(proc):
    """One line per check, exit 1 with one error line, never a traceback."""
    lines = proc.stdout.splitlines()
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    assert [line.split(":")[0].split()[-1] for line in lines] == NAMES
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("sparkstack: error: verify: ")
    return {line.split(":")[0].split()[-1]: line for line in lines}


def test_a_dead_server_fails_every_check_fast_with_one_line_each():
    with serving() as engine:
        url = engine.url
    lines = assert_clear(cli(url, "--timeout", "60"))
    assert lines["health"] == f"fail  health: {url}/health: cannot connect (ConnectionError)"
    assert lines["models"] == f"fail  models: {url}/v1/models: cannot connect (ConnectionError)"
    for name in NAMES[2:]:
        status = "fail" if name in REQUIRED else "warn"
        assert lines[name] == f"{status}  {name}: not run: no connection to {url} (see models)"


def test_a_hanging_server_is_bounded_by_the_timeout():
    with serving(hang=True) as engine:
        proc = cli(engine.url, "--timeout", "2")
    lines = assert_clear(proc)
    assert lines["health"].startswith("pass") and lines["models"].startswith("pass")
    assert re.search(r"chat: no answer in \d+(\.\d)? s$", lines["chat"]), lines["chat"]  # tenths at most
    for name in NAMES[3:]:
        assert lines[name].endswith(f"{name}: not run: the --timeout of 2 s ran out"), lines[name]


def test_http_500s_are_one_line_each():
    with serving(fail_every=1) as engine:
        lines = assert_clear(cli(engine.url))
    for name in ("chat", "stream-usage", "tool-call", "reasoning", "fffd", "prefix-cache"):
        assert "HTTP 500: stand-in failure, as asked" in lines[name], lines[name]
    assert lines["image"].endswith("; image parts need chat_template_mm.jinja in the weights dir")
    assert lines["spec-decode"].startswith("fail  spec-decode: chat: HTTP 500")


def test_a_malformed_stream_is_one_line_per_streamed_check():
    with serving(malformed=True) as engine:
        lines = assert_clear(cli(engine.url))
    for name in ("stream-usage", "tool-call", "reasoning", "spec-decode"):
        assert f"fail  {name}: chat: a stream event is not a chat chunk: " in lines[name]
    assert lines["chat"].startswith("pass") and lines["image"].startswith("pass")  # not streamed


def test_dry_run_sends_nothing():
    with serving() as engine:
        url = engine.url
        text = cli(url, "--dry-run")
        doc = json.loads(cli(url, "--dry-run", "--json").stdout)
        assert engine.requests_seen == []
    assert text.returncode == 0 and len(text.stdout.splitlines()) == 1 + len(NAMES)
    assert text.stdout.splitlines()[1] == "required  health: GET /health answers 200"
    assert [(c["check"], c["required"]) for c in doc["checks"]] == [(c.name, c.required) for c in CHECKS]
    assert doc["url"] == url and doc["model"] is None and doc["api_key_set"] is False


def test_server_text_in_a_check_line_cannot_drive_the_terminal():
    with serving(model="evil\x1b[2Jmodel") as engine:
        results = verify(engine.url)
    line = next(r.line() for r in results if r.check == "models")
    assert "\x1b" not in line and "asking evil\\x1b[2Jmodel" in line


def test_a_sliver_of_the_timeout_left_runs_no_check():
    """After a check hung to the deadline, a few ms may be left, more or fewer by the machine's load: the next
    check is then not run (it failed 'no answer in 0 s' under load), whatever the sliver."""
    from sparkstack.endpoint.client import Endpoint
    from sparkstack.verify.checks import MIN_CHECK_S, OutOfTime, Session

    session = Session(Endpoint("http://127.0.0.1:9"), "m", timeout_s=2)
    for left in (0.0, 0.01, 0.09, MIN_CHECK_S - 0.01):
        session.deadline = time.monotonic() + left
        with pytest.raises(OutOfTime, match="the --timeout of 2 s ran out"):
            session.endpoint()
    session.deadline = time.monotonic() + 1.5
    assert session.endpoint().timeout == 1.5
