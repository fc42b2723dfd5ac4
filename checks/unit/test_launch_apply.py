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


class DockerAnswers:
    """One rank's docker as it answers stop and status: `containers` maps a name to (state, its
    org.sparkstack.rank label, "" for none); `gone_before_rm` names a container removed by someone else between
    the look and the `rm -f` (docker then says it has no such container)."""

    def __init__(self, label: str, containers: dict[str, tuple[str, str]], gone_before_rm: str = "",
                 unreadable: bool = False) -> None:
        self.label, self.containers = label, dict(containers)
        self.gone_before_rm, self.unreadable = gone_before_rm, unreadable
        self.removed: list[str] = []

    def docker(self, *args):
        return ["docker", *args]

    def by_hand(self, argv):
        return " ".join(argv)

    def run(self, argv, timeout=None, env=None):
        assert argv[0] == "docker", argv
        return self.run_docker(*argv[1:], timeout=timeout)

    def run_docker(self, *args, timeout=None, env=None):
        name = args[-1]
        no_such = subprocess.CompletedProcess(args, 1, "", f"Error response from daemon: No such container: {name}\n")
        if args[0] == "inspect":
            if name not in self.containers:
                return subprocess.CompletedProcess(args, 1, "", f"Error: No such object: {name}\n")
            if self.unreadable:  # exit 0, but not the fields asked for (a template docker could not fill)
                return subprocess.CompletedProcess(args, 0, "<no value>\n", "")
            state, label = self.containers[name]
            fmt = args[args.index("--format") + 1]
            said = f"{state} {label or '<no value>'}" if "Labels" in fmt else \
                f"{state} 2026-12-01T10:00:00.000000000Z sha256:{'a' * 64}"
            return subprocess.CompletedProcess(args, 0, said + "\n", "")
        if args[:2] == ("rm", "-f"):
            if name == self.gone_before_rm or name not in self.containers:
                return no_such
            del self.containers[name]
            self.removed.append(name)
            return subprocess.CompletedProcess(args, 0, name + "\n", "")
        raise AssertionError(f"not asked of docker by stop or status: {args}")


def _plan():
    from sparkstack.launch.plan import plan_launch_from_recipe
    from sparkstack.recipe import load_recipe

    return plan_launch_from_recipe(load_recipe("glm53-flash-dflash2-nvfp4"), {})


def test_stop_says_removed_for_the_container_it_removed_and_not_there_for_none():
    """docs/commands/launch.md: each rank's line says `removed`, `not there` (its docker answered that it has no
    such container) or `could not reach`; neither of the first two is a failure."""
    from sparkstack.launch.apply import stop

    plan = _plan()
    head, worker = (r.name for r in plan.ranks)
    runners = {0: DockerAnswers("local", {head: ("exited", "0")}), 1: DockerAnswers("user@worker-node", {})}
    said: list[str] = []
    assert stop(plan, runners, said.append) == []
    assert said == [f"rank 0 on local: {head} removed", f"rank 1 on user@worker-node: {worker} not there"]
    assert runners[0].removed == [head] and runners[1].removed == []


def test_stop_of_a_container_gone_before_its_rm_says_not_there():
    """Found at the look, gone when `docker rm -f` runs (another stop, `--rm`): docker answers it has no such
    container, which is `not there`, never `removed`."""
    from sparkstack.launch.apply import stop

    plan = _plan()
    worker = plan.ranks[1].name
    runners = {0: DockerAnswers("local", {}), 1: DockerAnswers("user@worker-node", {worker: ("running", "1")},
                                                               gone_before_rm=worker)}
    said: list[str] = []
    assert stop(plan, runners, said.append, ranks=(1,)) == []
    assert said == [f"rank 1 on user@worker-node: {worker} not there"]


def test_status_calls_an_answer_it_cannot_read_not_reached_never_not_there(tmp_path, monkeypatch):
    """status shows docker's state, `not there` (docker answered it has no such container), or `could not reach`:
    a docker that answered with something other than the fields asked for told nothing of the rank."""
    from sparkstack.launch.apply import status

    monkeypatch.setenv("SPARKSTACK_STATE_DIR", str(tmp_path / "state"))
    plan = _plan()
    head, worker = (r.name for r in plan.ranks)
    rows, _ = status(plan, {0: DockerAnswers("local", {head: ("exited", "0")}),
                            1: DockerAnswers("user@worker-node", {})})
    assert [row["state"] for row in rows] == ["exited", "not there"]
    rows, _ = status(plan, {0: DockerAnswers("local", {head: ("exited", "0")}, unreadable=True),
                            1: DockerAnswers("user@worker-node", {worker: ("exited", "1")}, unreadable=True)})
    assert all(row["state"].startswith("could not reach: ") for row in rows), rows


def test_stop_refused_by_a_reachable_docker_says_refused_not_unreachable():
    """A docker that answers and will not remove the container (here: a removal already in progress) was reached:
    the line says docker refused, gives the command to run by hand, and the stop fails."""
    from sparkstack.launch.apply import stop

    class Refusing(DockerAnswers):
        def run_docker(self, *args, timeout=None, env=None):
            if args[:2] == ("rm", "-f"):
                return subprocess.CompletedProcess(args, 1, "", "Error response from daemon: removal of container "
                                                                 f"{args[-1]} is already in progress\n")
            return super().run_docker(*args, timeout=timeout, env=env)

    plan = _plan()
    head, worker = (r.name for r in plan.ranks)
    runners = {0: Refusing("local", {head: ("running", "0")}), 1: DockerAnswers("user@worker-node", {})}
    said: list[str] = []
    failures = stop(plan, runners, said.append)
    assert said[0] == (f"rank 0 on local: {head} not removed: docker refused: Error response from daemon: removal of "
                       f"container {head} is already in progress")
    assert said[1] == f"  stop it by hand: docker rm -f {head}" and "could not reach" not in " ".join(said)
    assert len(failures) == 1 and failures[0].startswith(f"rank 0 on local: docker refused to remove {head}")
