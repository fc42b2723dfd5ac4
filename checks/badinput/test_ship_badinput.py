"""`sparkstack ship` with bad command lines, bad inputs and hostile answers from a host: one line each, no traceback."""

import json
import os
import subprocess
from pathlib import Path

import pytest

import hostfix
import shipfix
from clirun import one_error_line, sparkstack_cmd

# A "host" whose ssh prints this instead of running the helper: what a compromised or broken host could say.
HOSTILE = {
    "not-json": 'echo "hello there"',
    "not-an-object": "echo '[1, 2]'",
    "wrong-protocol": """echo '{"ok": true, "protocol": 99}'""",
    "bad-partial": """echo '{"ok": true, "protocol": 1, "blobs": {"x": {"state": "partial", "have": -5}}}'""",
    "bad-room": """echo '{"ok": true, "protocol": 1, "free": {"hub": {"bytes": "lots"}}}'""",
    "error-reply": r"""printf '%s\n' '{"ok": false, "error": "disk on fire\nsecond line"}'""",
    "silent": "true",
}


@pytest.fixture
def hostile_ship_world(tmp_path):
    head = tmp_path / "head"
    hostfix.write_hub(head / ".cache/huggingface")
    targets = {"w1": {"home": str(tmp_path / "w1")}}
    (tmp_path / "w1").mkdir()
    shipfix.install(tmp_path / "bin")
    for name, script in HOSTILE.items():
        fake = tmp_path / f"fake-{name}"
        fake.write_text(f"#!/bin/sh\n{script}\n")  # answers at once, without reading what it was sent
        fake.chmod(0o755)
        targets[name] = {"home": str(tmp_path / "w1"), "path": f"{tmp_path / 'hostile' / name}:{os.environ['PATH']}"}
        (tmp_path / "hostile" / name).mkdir(parents=True)
        (tmp_path / "hostile" / name / "python3").symlink_to(fake)
    env = shipfix.env_for(tmp_path / "bin", head, targets, tmp_path / "calls.jsonl")
    return {"tmp": tmp_path, "env": env}


def ship(w, *args) -> subprocess.CompletedProcess:
    proc = subprocess.run(sparkstack_cmd() + ["ship", *map(str, args)], capture_output=True, text=True, env=w["env"],
                          timeout=60)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.mark.parametrize("args", [
    ["-oProxyCommand=touch /tmp/pwned", "--no-image"],
    ["--streams", "0", "w1"],
    ["--streams", "many", "w1"],
    ["--via", "carrier-pigeon", "w1"],
    ["--image", "x", "--no-image", "w1"],
    ["--model", "models--a--b", "--no-weights", "w1"],
    ["w1", "--via", "fabric", "--no-image"],  # a plain ssh target has no fabric address
])
def test_bad_command_lines_exit_2(hostile_ship_world, args):
    one_error_line(ship(hostile_ship_world, *args), 2)


def test_an_option_looking_host_never_reaches_ssh(hostile_ship_world):
    ship(hostile_ship_world, "--", "-oProxyCommand=touch /tmp/pwned", "--no-image")
    assert not Path(hostile_ship_world["env"]["FAKE_LOG"]).exists()


@pytest.mark.parametrize("args, says", [
    (["w1", "--image", "/no/such/layout"], "--image /no/such/layout: neither an OCI layout"),
    (["w1", "--image", "sha256:" + "0" * 64], "nor an image in the head's sparkstack store"),
    (["w1", "--no-image", "--model", "models--no--such"], "no such cache entry"),
    (["w1", "--no-image", "--model", "../../etc"], "not a model cache entry name"),
    (["w1", "--no-image", "--model", "models--a--b/../../x"], "not a"),
    (["w1"], "IMAGE (what launch would run) glm53-dflash2-tony:v1"),  # the default image is nowhere here
])
def test_bad_inputs_give_one_line(hostile_ship_world, args, says):
    assert says in one_error_line(ship(hostile_ship_world, *args), 1)


def test_a_snapshot_file_that_is_no_link_cannot_be_shipped_by_content(hostile_ship_world):
    hub = Path(hostile_ship_world["env"]["HOME"]) / ".cache/huggingface/hub" / hostfix.DRAFT_CACHE
    (snap,) = (hub / "snapshots").iterdir()
    target = (snap / "config.json").resolve()
    (snap / "config.json").unlink()
    (snap / "config.json").write_bytes(target.read_bytes())
    assert "not a link into" in one_error_line(ship(hostile_ship_world, "w1", "--no-image"), 1)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_or_broken_host_answers_give_one_line(hostile_ship_world, name):
    line = one_error_line(ship(hostile_ship_world, name, "--no-image", "--json"), 1)
    assert line.startswith(f"sparkstack: error: {name}: ")
    if name == "error-reply":
        assert line.endswith("disk on fire second line")


def test_unknown_host_gives_sshs_own_line(hostile_ship_world):
    line = one_error_line(ship(hostile_ship_world, "nowhere", "--no-image"), 1)
    assert line == "sparkstack: error: nowhere: ssh: Could not resolve hostname nowhere: Name or service not known"


def test_dry_run_json_with_a_failing_host_still_prints_the_plan(hostile_ship_world):
    proc = ship(hostile_ship_world, "w1", "silent", "--no-image", "--dry-run", "--json")
    one_error_line(proc, 1)
    hosts = {h["host"]: h for h in json.loads(proc.stdout)["hosts"]}
    assert hosts["w1"]["error"] is None and hosts["silent"]["error"]
