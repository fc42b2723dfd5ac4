"""launch apply against recording stand-ins: a head that is healthy but streams garbage fails with one clear line."""

import json
import os
import subprocess

import hostfix
import pytest
import standins
from clirun import sparkstack_cmd
from headfix import free_port, serve


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_a_head_whose_first_tokens_are_reasoning_has_answered(tmp_path, field):
    """GLM thinks first: vLLM's reasoning parser streams those tokens as `reasoning` (older: `reasoning_content`),
    and a launch asking for 8 tokens may see no `content` at all. That is still a first token."""
    port = free_port()
    chunk = json.dumps({"choices": [{"delta": {field: "Let me"}}]}).encode()
    server = serve(port, b"data: " + chunk + b"\n\ndata: [DONE]\n\n")
    standins.install(tmp_path / "bin")
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", RECORD_LOG=str(tmp_path / "calls.jsonl"),
               HF_HOME=str(hostfix.write_hub(tmp_path / "hf")), API_PORT=str(port),
               SPARKSTACK_STATE_DIR=str(tmp_path / "state"))
    try:
        proc = subprocess.run(sparkstack_cmd() + ["launch", "0", "--json", "--host-root",
                                                  str(hostfix.write_host(tmp_path / "root")),
                                                  "--health-interval", "0", "--health-attempts", "3"],
                              capture_output=True, text=True, env=env, timeout=120)
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["boot"]["ttft_s"] is not None


@pytest.mark.parametrize("stream", [b'data: {"error": 1}\n\n', b"data: not json\n\n", b'data: {"choices": []}\n\n',
                                    b'data: {"choices": [{"delta": "x"}]}\n\n', b"data: " + b"[" * 100000 + b"\n\n"])
def test_a_healthy_head_streaming_garbage_fails_with_one_line(tmp_path, stream):
    port = free_port()
    server = serve(port, stream)
    standins.install(tmp_path / "bin")
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", RECORD_LOG=str(tmp_path / "calls.jsonl"),
               HF_HOME=str(hostfix.write_hub(tmp_path / "hf")), API_PORT=str(port),
               SPARKSTACK_STATE_DIR=str(tmp_path / "state"))
    try:
        proc = subprocess.run(sparkstack_cmd() + ["launch", "0", "--host-root", str(hostfix.write_host(tmp_path / "root")),
                                                  "--health-interval", "0", "--health-attempts", "3"],
                              capture_output=True, text=True, env=env, timeout=120)
    finally:
        server.shutdown()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sparkstack: error: ") and "no first token" in last and len(last) < 400
    started = [json.loads(l) for l in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert any(c[0] == "docker" and "run" in c for c in started)  # the failure came after the start, from the stream


def test_the_design_cards_order_keeps_both_ranks_in_one_run_record(tmp_path, monkeypatch):
    """`launch 1`, then `launch 0`: the same plan, so one run id; the record the second writes keeps the worker the
    first started (a record without it would lose what rank 1 ran)."""
    import json

    from sparkstack.launch.apply import write_record
    from sparkstack.launch.plan import plan_launch_from_recipe
    from sparkstack.recipe import load_recipe

    monkeypatch.setenv("SPARKSTACK_STATE_DIR", str(tmp_path / "state"))
    plan = plan_launch_from_recipe(load_recipe("glm53-flash-dflash2-nvfp4"), {})
    image = "sha256:" + "c" * 64
    first = write_record(plan, image, None, {1: ["docker", "run", "worker-argv"]})
    second = write_record(plan, image, None, {0: ["docker", "run", "head-argv"]})
    assert first == second
    ranks = json.loads(second.read_text())["ranks"]
    assert [(r["rank"], r["docker_run"][-1]) for r in ranks] == [(0, "head-argv"), (1, "worker-argv")]
    # a rank started again replaces its own entry, and only that one
    write_record(plan, image, None, {1: ["docker", "run", "worker-again"]})
    assert [r["docker_run"][-1] for r in json.loads(second.read_text())["ranks"]] == ["head-argv", "worker-again"]
