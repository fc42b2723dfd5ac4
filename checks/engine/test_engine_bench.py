"""bench against a real vLLM 0.32, judged by what sparkstack did not compute: the test's own /metrics deltas
around each cell (exact), `vllm bench serve` on the same server with the same prompts and settings (peer), and the
server's own timing histograms (per-stream figures)."""

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import requests

from sparkstack.bench import plan as bench_plan
from sparkstack.endpoint import metrics
import pytest

# The servers are booted once per worker: every test that uses them runs on one (docs/testing.md, the real-engine tier: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("vllm")

HERE = Path(__file__).parent
MAX_TOKENS = 128
ROUNDS = 2
CATEGORY = "prose"
ONE_ROUND: dict[int, dict] = {}  # the one-round cells of the exact test, by concurrency: figures for the table


def _scrape(url):
    return metrics.parse(requests.get(url + "/metrics", timeout=10).text, 0.0)


def _bench(run_cli, url, concurrency, rounds=ROUNDS):
    proc = run_cli("bench", url, "--json", "--concurrency", str(concurrency), "--rounds", str(rounds),
                   "--category", CATEGORY, "--max-tokens", str(MAX_TOKENS), "--temperature", "0")
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, json.loads(proc.stdout)


def _bench_cell(run_cli, url, concurrency, rounds=ROUNDS):
    proc, doc = _bench(run_cli, url, concurrency, rounds)
    return proc, doc["cells"][0]


def _peer(vllm_py, server, concurrency, tmp_path, run_salt):
    """`vllm bench serve` with bench's very prompts (bench's own plan, with the run's salt its report gives), at the
    same settings. The same text matters: random digits in a salt are n-grams the digit cycle can match, and
    prompts salted apart moved acceptance by one or two rejected drafts per run, by luck (4.63 against 4.96 once)."""
    plan = dataclasses.replace(bench_plan.plan_bench(server.url, concurrency=(concurrency,), rounds=ROUNDS,
                                                    categories=(CATEGORY,)), salt=run_salt)
    (block,) = plan.blocks
    n = concurrency * ROUNDS
    data = tmp_path / f"peer-{concurrency}.jsonl"
    data.write_text("".join(json.dumps({"prompt": plan.body(block, 0, i // concurrency, i % concurrency)
                                        ["messages"][0]["content"]}) + "\n" for i in range(n)))
    out = tmp_path / f"peer-{concurrency}.json"
    argv = [vllm_py, str(HERE / "peer_bench.py"), str(out), "--backend", "openai-chat", "--base-url", server.url,
            "--endpoint", "/v1/chat/completions", "--model", server.name, "--tokenizer", str(server.model),
            "--dataset-name", "custom", "--dataset-path", str(data), "--skip-chat-template",
            "--custom-output-len", str(MAX_TOKENS), "--num-prompts", str(n), "--max-concurrency", str(concurrency),
            "--temperature", "0", "--top-p", "0.95", "--disable-shuffle", "--num-warmups", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50",
            # bench asks every request for logprobs (the sampling-integrity count): the peer sends the same body
            "--extra-body", json.dumps({"logprobs": True})]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_bench_counters_are_the_tests_own_metrics_deltas(run_cli, spec_server):
    """One round per cell: no spread, so no noisy rerun, and the cell covers exactly what the test's scrapes do."""
    for concurrency in (1, 2):
        before = _scrape(spec_server.url)
        proc, cell = _bench_cell(run_cli, spec_server.url, concurrency, rounds=1)
        after = _scrape(spec_server.url)
        assert proc.returncode == 0 and cell["flags"] == [], proc.stderr
        mine = metrics.spec_delta(before, after)
        assert (cell["drafts"], cell["draft_tokens"], cell["accepted_tokens"]) == (mine.drafts, mine.draft_tokens,
                                                                                    mine.accepted)
        assert cell["acceptance_length"] == 1 + mine.accepted / mine.drafts > 4.5  # ngram follows the digit cycle
        assert cell["per_position"] == list(mine.per_position)
        ONE_ROUND[concurrency] = cell
        # per-stream figures held against the server's decode clock
        server = metrics.server_timing(before, after)
        assert cell["server_timing"]["requests"] == server.requests == concurrency
        assert cell["server_timing"]["decode_s"] == server.decode_s
        if not cell["timing_notes"]:
            assert 0.5 <= cell["per_stream_tok_s"] / server.stream_tok_s <= 2


def test_bench_beside_vllm_bench_serve(run_cli, vllm_py, spec_server, tmp_path, record_property):
    rows = []
    for concurrency in (1, 2):
        before = _scrape(spec_server.url)
        proc, doc = _bench(run_cli, spec_server.url, concurrency)
        cell = doc["cells"][0]
        after = _scrape(spec_server.url)
        mine = metrics.spec_delta(before, after)  # both attempts when the block was rerun: rates, not counts
        server = metrics.server_timing(before, after)
        if cell["flags"]:  # on a loaded box rounds can be noisy: then every result figure is withheld
            assert set(cell["flags"]) <= {"noisy"} and proc.returncode == 1, cell["flags"]
            assert cell["acceptance_length"] is None and cell["output_tok_s"] is None
        # peer: vLLM's own benchmark on the same server, same prompts, settings and concurrency
        peer_before = _scrape(spec_server.url)
        peer = _peer(vllm_py, spec_server, concurrency, tmp_path, doc["salt"])
        peer_server = metrics.server_timing(peer_before, _scrape(spec_server.url))
        rounds = [r["output_tok_s"] for r in cell["rounds"]]
        ours_len = 1 + mine.accepted / mine.drafts
        pairs = {
            "output tok/s (rounds)": ("/".join(f"{r:.1f}" for r in rounds), peer["output_throughput"]),
            "TTFT p50 ms (first content / first chunk)": (_ms(cell["ttft_content_p50_s"]), peer["p50_ttft_ms"]),
            "TPOT p50 ms": (_ms(cell["tpot_p50_s"]), peer["p50_tpot_ms"]),
            "ITL p50 ms (per chunk / per token)": (_ms(cell["itl_p50_s"]), peer["p50_itl_ms"]),
            "acceptance length": (round(ours_len, 3), peer["spec_decode_acceptance_length"]),
            "per position": (list(mine.per_position), peer.get("spec_decode_per_position_acceptance_rates")),
            "server stream tok/s (decode histogram)": (round(server.stream_tok_s, 1), None),
        }
        one = ONE_ROUND.get(concurrency)
        if one:  # one round: never noisy, so its figures stand where a two-round cell's were withheld
            pairs |= {"one round: output tok/s": (round(one["output_tok_s"], 1), peer["output_throughput"]),
                      "one round: TTFT p50 ms (first content / first chunk)": (_ms(one["ttft_content_p50_s"]),
                                                                               peer["p50_ttft_ms"]),
                      "one round: TTFT p50 ms, first chunk": (_ms(one["ttft_first_chunk_p50_s"]), peer["p50_ttft_ms"]),
                      "one round: TPOT p50 ms": (_ms(one["tpot_p50_s"]), peer["p50_tpot_ms"]),
                      "one round: ITL p50 ms (per chunk / per token)": (_ms(one["itl_p50_s"]), peer["p50_itl_ms"]),
                      "one round: tok/s per stream (chunks / server)": (_round(one["per_stream_tok_s"]),
                                                                         _round(one["server_timing"]["stream_tok_s"]))}
        rows += [f"c={concurrency} | {name} | {ours} | {theirs if not isinstance(theirs, float) else round(theirs, 3)}"
                 for name, (ours, theirs) in pairs.items()]
        # Throughput is shown, not judged: the peer runs a minute later on a shared 2-core box whose speed swings
        # several-fold with other sessions' load (bench rounds 166-202 tok/s, the peer 28.7 a minute later at a
        # load average of 12). Even normalised, each run's aggregate tok/s over the server's own per-stream decode
        # rate in that run, it is a ratio of two runs of a handful of requests: at c=2 it read 1.96 against 1.45
        # once and 0.82 against 1.92 in another clean-clone CI, with no code change. Bench's own rates are held to
        # the server's clock within one run in the exact test.
        if one:
            ours_streams = one["output_tok_s"] / one["server_timing"]["stream_tok_s"]
            peer_streams = peer["output_throughput"] / peer_server.stream_tok_s
            rows.append(f"c={concurrency} | one round: tok/s over the server's per-stream tok/s | "
                        f"{ours_streams:.3f} | {peer_streams:.3f}")
        # the same prompts at temperature 0: the same drafts and the same rejections, so the same acceptance
        assert abs(ours_len - peer["spec_decode_acceptance_length"]) <= 1e-9, pairs
        theirs_pos = peer.get("spec_decode_per_position_acceptance_rates")
        if theirs_pos is not None:
            assert all(abs(a - b) <= 1e-9 for a, b in zip(mine.per_position, theirs_pos)), pairs
        # TPOT is shown, not judged: raw, a run a minute later on this shared box read 10.5 ms against bench's
        # 2.6 ms; over the server's own mean TPOT in each run, a median of four requests against their mean read
        # 0.35 against 0.91 when one request stalled. Bench's per-stream rate meets the server's clock in the exact test.
        if cell["tpot_p50_s"] is not None and server.tpot_mean_s and peer_server.tpot_mean_s:
            ours_tpot = cell["tpot_p50_s"] / server.tpot_mean_s
            peer_tpot = peer["p50_tpot_ms"] / 1000 / peer_server.tpot_mean_s
            rows.append(f"c={concurrency} | TPOT p50 over the server's mean TPOT | {ours_tpot:.3f} | {peer_tpot:.3f}")
    table = "\n".join(["cell | figure | sparkstack bench | vllm bench serve", *rows])
    record_property("side_by_side", table)
    report = os.environ.get("SPARKSTACK_ENGINE_REPORT")
    if report:
        Path(report).write_text(table + "\n")


def _ms(seconds):
    return None if seconds is None else round(seconds * 1000, 3)


def _round(value):
    return None if value is None else round(value, 1)


def test_coalesced_chunks_give_no_itl_that_is_not_one(run_cli, plain_server):
    """The plain server runs with --stream-interval 8: a chunk carries 8 tokens, so chunk gaps are 8 engine steps.
    bench withholds its ITL percentiles and says the server's mean; tok/s per stream stands on the server's clock."""
    before = _scrape(plain_server.url)
    proc, cell = _bench_cell(run_cli, plain_server.url, 1, rounds=1)
    after = _scrape(plain_server.url)
    server = metrics.server_timing(before, after)
    assert cell["server_timing"]["requests"] == server.requests == 1
    notes = " ".join(cell["timing_notes"])
    assert "ITL percentiles withheld" in notes, cell
    assert cell["itl_p50_s"] is None
    assert cell["server_timing"]["itl_mean_s"] == server.itl_mean_s
    # no drafter on this server: the cell is flagged no_spec_metrics (its results withheld), not a result
    assert "no_spec_metrics" in cell["flags"] and proc.returncode == 1
