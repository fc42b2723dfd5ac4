"""`sparkstack bench` through the real CLI against the in-process stand-in engine.

Exact figures (drafts, acceptance length, per-position rates) are derived here from the acceptance pattern the
stand-in is given, by vLLM's definitions (checks/lab/standin_engine.py advances its counters by them); times get
consistency checks only. Faults appear only where the stand-in is told to cause them.
"""

import json
import re

import matplotlib.image
import pytest
from inprocess_engine import serving
from sparkstack.bench.batch import Batch, Outcome
from sparkstack.bench.plan import Block, plan_bench
from sparkstack.bench.report import make_cell
from sparkstack.endpoint import metrics
from sparkstack.endpoint.client import StreamResult

SPEC_TOKENS = 4
# Rounds are noisy when they spread by over 10%. Tests that must not be noisy run one round (no spread), or few
# long steps: a busy machine delays each chunk's wakeup, not each second, so long steps keep the spread small.
STEADY = 0.6  # long steps: a loaded machine's jitter (tens of ms a request) stays well under the 10% noisy line


def expected_spec(pattern, spec_tokens=SPEC_TOKENS):
    """Acceptance length and per-position rates of a pattern: each step is one draft; position i counts the drafts
    with at least i + 1 tokens accepted, as vLLM's per-position counter does."""
    length = 1 + sum(pattern) / len(pattern)
    rates = [sum(1 for a in pattern if a > i) / len(pattern) for i in range(spec_tokens)]
    return length, rates


def bench_json(run_cli, url, *args):
    proc = run_cli("bench", url, "--json", *args)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, (json.loads(proc.stdout) if proc.stdout.strip() else None)


def test_the_pattern_gives_its_acceptance_length_and_rates_exactly(run_cli):
    pattern, cycles = (4, 2, 1, 0), 3
    length, rates = expected_spec(pattern)
    assert (length, rates) == (2.75, [0.75, 0.5, 0.25, 0.25])  # the worked example, by hand
    with serving(accept_pattern=pattern, cycles=cycles, step_delay=0.002) as engine:
        proc, doc = bench_json(run_cli, engine.url, "--concurrency", "1,3", "--rounds", "1",
                               "--category", "code", "--category", "count")
        sent = engine.c["requests"]
    assert proc.returncode == 0, proc.stderr
    assert [(c["concurrency"], c["category"]) for c in doc["cells"]] == [(1, "code"), (1, "count"), (3, "code"),
                                                                         (3, "count")]
    rounds = 1
    assert sent == rounds * (1 + 3) * 2
    # exactly the contract of issue 13, which other tools read; "salt" since: the run's salt, so that the exact
    # prompts can be sent again (the real-engine tier sends them through `vllm bench serve`)
    assert list(doc) == ["suite_version", "settings", "salt", "cells"]
    assert re.fullmatch(r"[0-9a-f]{8}", doc["salt"])
    assert list(doc["settings"]) == ["url", "model", "concurrency", "rounds", "max_tokens", "temperature", "top_p",
                                     "categories"]
    for cell in doc["cells"]:
        assert list(cell) == ["concurrency", "category", "output_tok_s", "per_stream_tok_s", "ttft_first_chunk_p50_s",
                              "ttft_content_p50_s", "ttft_content_p95_s", "itl_p50_s", "itl_p95_s", "itl_p99_s",
                              "tpot_p50_s", "errors", "drafts", "draft_tokens", "accepted_tokens",
                              "acceptance_length", "per_position", "steps_per_s", "rounds", "server_timing",
                                  "timing_notes", "sampled_tokens", "implausible_tokens", "flags"]
        assert all(list(r) == ["output_tok_s", "acceptance_length", "steps_per_s"] for r in cell["rounds"])
    for cell in doc["cells"]:
        requests = cell["concurrency"] * rounds
        assert cell["flags"] == [] and cell["errors"] == 0
        assert cell["drafts"] == requests * len(pattern) * cycles
        assert cell["draft_tokens"] == cell["drafts"] * SPEC_TOKENS
        assert cell["accepted_tokens"] == requests * sum(pattern) * cycles
        assert cell["acceptance_length"] == length
        assert cell["per_position"] == rates
        assert [r["acceptance_length"] for r in cell["rounds"]] == [length] * rounds
        # tokens after the first = drafts x acceptance length, so per-stream tok/s = steps/s x acceptance length
        assert cell["per_stream_tok_s"] == pytest.approx(cell["steps_per_s"] * length, rel=1e-9)


def test_settings_default_to_the_served_sampling_and_every_report_prints_them(run_cli):
    proc = run_cli("bench", "http://127.0.0.1:9", "--dry-run", "--json", check=0)
    s = json.loads(proc.stdout)["settings"]
    assert (s["concurrency"], s["rounds"], s["temperature"], s["top_p"]) == ([1, 2, 3, 4, 5, 6], 3, 1.0, 0.95)
    assert s["categories"] == ["code", "json", "prose", "tool-args", "count"]
    with serving(cycles=1) as engine:
        proc = run_cli("bench", engine.url, "--concurrency", "2", "--rounds", "1", "--category", "json")
    assert proc.returncode == 0, proc.stderr
    assert "temperature 1.0 · top_p 0.95" in proc.stdout and "rounds 1" in proc.stdout
    assert "model standin" in proc.stdout and "concurrency 2" in proc.stdout


def test_every_request_is_salted_and_carries_the_sampling_settings():
    plan = plan_bench("http://127.0.0.1:9", concurrency=(1, 3), rounds=2, temperature=0.7, top_p=0.9, model="m")
    bodies = [plan.body(b, attempt, r, s) for b in plan.blocks for attempt in (0, 1) for r in range(b.rounds)
              for s in range(b.concurrency)]
    assert len(bodies) == 2 * plan.requests
    firsts = [b["messages"][0]["content"] for b in bodies]
    assert len(set(firsts)) == len(firsts)  # no two requests share a prefix the cache could serve
    assert all(b["temperature"] == 0.7 and b["top_p"] == 0.9 and b["model"] == "m" for b in bodies)
    assert all(b["stream_options"] == {"include_usage": True} for b in bodies)
    # the run's salt opens every prompt, and the plan says it
    assert plan.to_json()["salt"] == plan.salt and all(f.startswith(f"[{plan.salt}-") for f in firsts)


def test_the_figures_follow_their_definitions():
    """Synthetic streams with known times: two rounds of one stream each."""
    def scrape(drafts, accepted, pos, at):
        text = (f"vllm:spec_decode_num_drafts_total {drafts}\nvllm:spec_decode_num_draft_tokens_total {drafts * 4}\n"
                f"vllm:spec_decode_num_accepted_tokens_total {accepted}\n"
                + "".join(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {v}\n'
                          for i, v in enumerate(pos)))
        return metrics.parse(text, at)

    def stream(first_chunk, times, tokens):
        return StreamResult(first_chunk, times[0], times[-1], tuple(times), "x", "", None, (), "stop",
                            {"completion_tokens": tokens}, len(times) + 1)

    s0, s1, s2 = scrape(0, 0, (0, 0, 0, 0), 0), scrape(2, 6, (2, 2, 1, 1), 1), scrape(6, 10, (5, 3, 1, 1), 2)
    b1 = Batch((Outcome(stream(0.01, [0.05, 0.15, 0.25], 9)),), 0.5, s0, s1)
    b2 = Batch((Outcome(stream(0.02, [0.1, 0.2, 0.3, 0.5], 11)), Outcome(None, "http_500", "boom")), 1.0, s1, s2)
    cell = make_cell(Block(2, "code", 2), [b1, b2], []).to_json()
    assert cell["output_tok_s"] == pytest.approx((9 + 11) / 1.5)
    assert cell["per_stream_tok_s"] == pytest.approx((8 + 10) / (0.2 + 0.4))
    assert cell["steps_per_s"] == pytest.approx(6 / 0.6)
    assert cell["acceptance_length"] == pytest.approx(1 + 10 / 6)
    assert cell["per_position"] == pytest.approx([5 / 6, 3 / 6, 1 / 6, 1 / 6])
    assert cell["ttft_first_chunk_p50_s"] == pytest.approx(0.015) and cell["ttft_content_p50_s"] == pytest.approx(0.075)
    assert cell["itl_p50_s"] == pytest.approx(0.1) and cell["itl_p99_s"] == pytest.approx(0.196)
    assert cell["tpot_p50_s"] == pytest.approx((0.2 / 8 + 0.4 / 10) / 2)
    assert cell["errors"] == 1 and cell["flags"] == []
    assert cell["rounds"] == [pytest.approx({"output_tok_s": 18, "acceptance_length": 4, "steps_per_s": 10}),
                              pytest.approx({"output_tok_s": 11, "acceptance_length": 2, "steps_per_s": 10})]


def test_time_figures_are_consistent(run_cli):
    role_delay = 0.1
    with serving(role_delay=role_delay, step_delay=0.01, accept_pattern=(3, 1, 0), cycles=2) as engine:
        proc, doc = bench_json(run_cli, engine.url, "--concurrency", "1,3", "--rounds", "1", "--category", "prose")
    assert proc.returncode == 0, proc.stderr
    for c in doc["cells"]:
        # the role-only chunk comes role_delay before the first token
        assert c["ttft_content_p50_s"] >= c["ttft_first_chunk_p50_s"] + role_delay / 2
        assert c["ttft_content_p50_s"] <= c["ttft_content_p95_s"]
        assert c["itl_p50_s"] <= c["itl_p95_s"] <= c["itl_p99_s"]
        assert c["rounds"][0]["output_tok_s"] == pytest.approx(c["output_tok_s"])  # one round: the block's
        length, _ = expected_spec((3, 1, 0))
        assert c["per_stream_tok_s"] == pytest.approx(c["steps_per_s"] * length, rel=1e-9)
        # a stream's decode rate is above its whole-request rate (which includes time to first token)
        assert c["output_tok_s"] < c["concurrency"] * c["per_stream_tok_s"]


def test_all_drafts_rejected_is_flagged_not_reported(run_cli):
    with serving(accept_pattern=(0,), cycles=4) as engine:
        proc, doc = bench_json(run_cli, engine.url, "--concurrency", "2", "--rounds", "1", "--category", "code")
        human = run_cli("bench", engine.url, "--concurrency", "1", "--rounds", "1", "--category", "code")
    assert proc.returncode == 1
    (cell,) = doc["cells"]
    assert cell["flags"] == ["spec_decode_collapse"]
    assert cell["drafts"] == 2 * 4 and cell["accepted_tokens"] == 0  # the evidence stays
    assert cell["acceptance_length"] is None and cell["output_tok_s"] is None and cell["steps_per_s"] is None
    assert cell["per_position"] is None
    assert proc.stderr.strip().splitlines()[-1].startswith("sparkstack: error: 1 of 1 cells flagged (spec_decode_collapse)")
    assert human.returncode == 1 and "vLLM #53030" in human.stdout and "2.75" not in human.stdout


@pytest.mark.parametrize("mode", ["no-spec", "none"])
def test_a_server_without_spec_counters_is_flagged(run_cli, mode):
    with serving(metrics=mode) as engine:
        proc, doc = bench_json(run_cli, engine.url, "--concurrency", "1", "--rounds", "1", "--category", "count")
    assert proc.returncode == 1
    (cell,) = doc["cells"]
    assert cell["flags"] == ["no_spec_metrics"] and cell["drafts"] is None and cell["acceptance_length"] is None
    if mode == "none":
        assert "/metrics: not found" in proc.stderr
    assert "no_spec_metrics" in proc.stderr.strip().splitlines()[-1]


def test_a_busy_server_is_refused_without_force_and_flagged_with_it(run_cli):
    with serving(busy=2) as engine:
        proc = run_cli("bench", engine.url, "--concurrency", "1", "--rounds", "1", "--category", "code")
        assert engine.c["requests"] == 0
        forced, doc = bench_json(run_cli, engine.url, "--concurrency", "1,2", "--rounds", "1", "--category", "code",
                                 "--force")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "server busy: 2 requests running" in proc.stderr and "--force" in proc.stderr
    assert forced.returncode == 1
    assert [c["flags"] for c in doc["cells"]] == [["server_busy"], ["server_busy"]]
    assert all(c["output_tok_s"] is None for c in doc["cells"])


PATTERN = (2, 1)  # two steps a request


def _one_block(run_cli, **fields):
    with serving(accept_pattern=PATTERN, cycles=1, **fields) as engine:
        proc, doc = bench_json(run_cli, engine.url, "--concurrency", "1", "--rounds", "3", "--category", "count")
        return proc, doc["cells"][0], engine.c["requests"]


def test_injected_spread_is_rerun_once_then_flagged_noisy(run_cli):
    # a burst per round: step delays alternate 5 ms / 250 ms on the first run and on the rerun
    proc, cell, sent = _one_block(run_cli, delay_sequence=(0.005, STEADY))
    assert sent == 2 * 3  # the block ran twice
    assert cell["flags"] == ["noisy"] and proc.returncode == 1 and cell["output_tok_s"] is None
    tok = [r["output_tok_s"] for r in cell["rounds"]]
    assert (max(tok) - min(tok)) / (sum(tok) / 3) > 0.10


def test_a_rerun_that_is_steady_clears_the_noise(run_cli):
    proc, cell, sent = _one_block(run_cli, delay_sequence=(0.005, STEADY, 0.005, STEADY, STEADY, STEADY))
    assert sent == 2 * 3 and cell["flags"] == [] and proc.returncode == 0, proc.stderr


def test_no_noisy_flag_without_injected_spread(run_cli):
    proc, cell, _ = _one_block(run_cli, step_delay=STEADY)
    assert cell["flags"] == [] and proc.returncode == 0, (proc.stderr, cell["rounds"])
    assert [r["acceptance_length"] for r in cell["rounds"]] == [expected_spec(PATTERN)[0]] * 3


def test_the_plot_is_a_png(run_cli, tmp_path):
    out = tmp_path / "bench.png"
    with serving(cycles=1) as engine:
        for _ in range(2):  # the second run replaces the plot the first wrote
            proc = run_cli("bench", engine.url, "--concurrency", "1,2", "--rounds", "1", "--category", "code,json",
                           "--plot", out)
            assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = matplotlib.image.imread(out)
    assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 600
    assert pixels.std() > 0.05  # not a blank canvas
    assert [p.name for p in tmp_path.iterdir()] == ["bench.png"]  # no temp file left


def test_the_dry_run_prints_the_plan_and_sends_nothing(run_cli):
    with serving() as engine:
        proc = run_cli("bench", engine.url, "--dry-run", "--json", "--concurrency", "1,3", "--rounds", "2",
                       "--category", "code", "--category", "tool-args", check=0)
        text = run_cli("bench", engine.url, "--dry-run", check=0)
        assert engine.c["requests"] == 0
    doc = json.loads(proc.stdout)
    assert [(b["concurrency"], b["category"], b["requests"]) for b in doc["blocks"]] == [
        (1, "code", 2), (1, "tool-args", 2), (3, "code", 6), (3, "tool-args", 6)]
    assert doc["requests"] == 16 and doc["suite_version"] == "1"
    assert "30 blocks, 315 requests" in text.stdout and "temperature 1.0 · top_p 0.95" in text.stdout
    # nothing at all is asked of the server: a dead URL plans the same
    assert run_cli("bench", "http://127.0.0.1:9", "--dry-run", check=0).stdout.splitlines()[2:] == \
        text.stdout.splitlines()[2:]


def test_the_standin_reads_its_modes_from_the_environment():
    """The stand-in as a process (the bench sample in docs/commands/bench.md) takes its Behaviour from STANDIN_* variables."""
    from inprocess_engine import Behaviour

    b = Behaviour.from_env({"STANDIN_ACCEPT_PATTERN": "4,4,3", "STANDIN_CYCLES": "2", "STANDIN_STEP_DELAY": "0.02",
                            "STANDIN_DELAY_SEQUENCE": "0.1,0.2", "STANDIN_NO_USAGE": "1",
                            "STANDIN_STEP_DELAY_PER_REQUEST": "0.004", "STANDIN_COUNTERS": '{"drafts": 7}'})
    assert (b.accept_pattern, b.cycles, b.step_delay, b.delay_sequence) == ((4, 4, 3), 2, 0.02, (0.1, 0.2))
    assert (b.no_usage, b.step_delay_per_request, b.counters) == (True, 0.004, (("drafts", 7),))


def test_without_a_usage_chunk_the_token_rates_are_withheld_and_the_note_says_why(run_cli):
    pattern = (2, 1)
    with serving(no_usage=True, accept_pattern=pattern, cycles=1) as engine:
        proc, doc = bench_json(run_cli, engine.url, "--concurrency", "2", "--rounds", "1", "--category", "code")
    assert proc.returncode == 0, proc.stderr
    (cell,) = doc["cells"]
    assert cell["flags"] == []  # not one of the contract's four faults
    assert (cell["output_tok_s"], cell["per_stream_tok_s"], cell["tpot_p50_s"]) == (None, None, None)
    assert cell["rounds"][0]["output_tok_s"] is None
    assert cell["acceptance_length"] == expected_spec(pattern)[0]  # from /metrics: still a figure
    assert "c=2 code: no_usage: 2 of 2 streams sent no usage chunk" in proc.stderr


def test_tpot_is_null_for_a_stream_of_one_text_chunk():
    one = StreamResult(0.01, 0.05, 0.06, (0.05,), "all of it", "", None, (), "stop", {"completion_tokens": 40}, 2)
    figures = make_cell(Block(1, "code", 1), [Batch((Outcome(one),), 0.1, None, None)], []).figures
    assert figures["tpot_p50_s"] is None
    assert figures["output_tok_s"] == pytest.approx(40 / 0.1)


def test_non_finite_figures_are_null_in_the_json():
    """A counter near the float limit makes steps/s infinite; JSON has no Infinity, so it is withheld as null."""
    from sparkstack.bench.report import Report

    def scrape(drafts, accepted, at):
        return metrics.parse(f"vllm:spec_decode_num_drafts_total {drafts}\nvllm:spec_decode_num_draft_tokens_total "
                             f"{drafts}\nvllm:spec_decode_num_accepted_tokens_total {accepted}\n", at)

    s = StreamResult(0.01, 0.05, 0.15, (0.05, 0.15), "xy", "", None, (), "stop", {"completion_tokens": 2}, 3)
    batch = Batch((Outcome(s),), 0.2, scrape(0, 0, 0), scrape(1e308, 1e308, 1))
    plan = plan_bench("http://127.0.0.1:9", concurrency=(1,), rounds=1, categories=("code",), model="m")
    doc = Report("1", plan.settings, (make_cell(plan.blocks[0], [batch], []),)).to_json()
    text = json.dumps(doc, allow_nan=False)  # raises on NaN or Infinity
    cell = json.loads(text)["cells"][0]
    assert cell["steps_per_s"] is None and cell["rounds"][0]["steps_per_s"] is None
    assert cell["acceptance_length"] == 2.0  # 1 + 1e308 / 1e308: finite, so kept
