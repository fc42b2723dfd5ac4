"""Hostile registry answers: each gets one line and exit 1, never a traceback, and nothing is written."""

import json
import socket

import pytest

from registry_standin import Standin, fixture_repo

# fault -> a phrase the one line must carry
FAULTS = {
    "non-json": "not JSON",
    "wrong-digest-header": "Docker-Content-Digest",
    "wrong-body": "not the digest asked for",
    "huge-manifest": "cap",
    "redirect-loop": "redirect loop",
    "token-error": "answered 500",
    "token-garbage": "gave no token",
    "basic-auth": "Basic challenge",
    "deny": "access denied",
    "corrupt-blob": "refusing them",
    "hang": "timed out",
}


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    return fixture_repo(tmp_path_factory.mktemp("registry"))


def check_one_line(proc, phrase: str) -> None:
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sparkstack: error: "), proc.stderr
    assert phrase in lines[0], lines[0]


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_hostile_answer_to_pin_base(fixture, tmp_path, run_inproc, fault):
    repos, served = fixture
    pins = tmp_path / "pins.json"
    with Standin(repos) as standin:
        standin.faults.add(fault)
        standin.hang_s = 4
        proc = run_inproc("pin", "base", f"ghcr.io/{served.repo}:{served.tag}", "--pins", pins,
                       env={"SPARKSTACK_REGISTRY_MIRROR": standin.url, "SPARKSTACK_REGISTRY_TIMEOUT": "1"})
    check_one_line(proc, FAULTS[fault])
    assert not pins.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fault", ["corrupt-blob", "redirect-loop", "token-error", "deny", "hang"])
def test_hostile_answer_to_pin_fetch(fixture, tmp_path, run_inproc, fault):
    repos, served = fixture
    arm = served.platforms["linux/arm64"]
    pins = tmp_path / "pins.json"
    doc = {"reference": f"ghcr.io/{served.repo}:{served.tag}", "registry": "ghcr.io", "repository": served.repo,
           "resolved": {"digest": served.index, "mediaType": None, "size": None}, "platforms": {}}
    pins.write_text(json.dumps(doc))
    target = served.index if fault == "hang" else arm["layers"][0]  # the stand-in hangs on manifests
    if target != served.index:
        layer = served.layouts["linux/arm64"] / "blobs/sha256" / target.split(":")[1]
        desc = {"digest": target, "mediaType": "application/octet-stream", "size": layer.stat().st_size}
        doc["platforms"]["linux/arm64"] = {"manifest": dict(desc, digest=arm["manifest"]), "config": dict(desc, digest=arm["config"]),
                                           "layers": [desc]}
        pins.write_text(json.dumps(doc))
    out = tmp_path / "out"
    with Standin(repos) as standin:
        standin.faults.add(fault)
        standin.hang_s = 4
        proc = run_inproc("pin", "fetch", target, "--pins", pins, "--out", out,
                       env={"SPARKSTACK_REGISTRY_MIRROR": standin.url, "SPARKSTACK_REGISTRY_TIMEOUT": "1"})
    check_one_line(proc, FAULTS[fault])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pins.json"]  # nothing at --out, no partial file


def test_connection_refused(tmp_path, run_inproc):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    proc = run_inproc("pin", "base", "ghcr.io/a/b:c", "--pins", tmp_path / "pins.json",
                   env={"SPARKSTACK_REGISTRY_MIRROR": f"http://127.0.0.1:{port}"})
    check_one_line(proc, "Connection refused")


@pytest.mark.parametrize("mirror", ["ftp://example.invalid", "127.0.0.1:5000", "http://"])
def test_a_bad_mirror_url_is_one_line(tmp_path, run_inproc, mirror):
    proc = run_inproc("pin", "base", "ghcr.io/a/b:c", "--pins", tmp_path / "pins.json",
                   env={"SPARKSTACK_REGISTRY_MIRROR": mirror})
    check_one_line(proc, "SPARKSTACK_REGISTRY_MIRROR")


@pytest.mark.parametrize("ref", ["ghcr.io/UPPER/case:tag", "ghcr.io/a/b:bad tag", "ghcr.io/a/b@sha256:1234", "ghcr.io/:x"])
def test_a_bad_reference_is_a_usage_error(tmp_path, run_inproc, ref):
    proc = run_inproc("pin", "base", ref, "--pins", tmp_path / "pins.json")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("args, phrase", [
    (["--platform", "linux"], "os/arch"),
    (["--platform", "Linux/ARM64"], "os/arch"),
])
def test_a_bad_platform_is_a_usage_error(tmp_path, run_inproc, args, phrase):
    proc = run_inproc("pin", "base", "ghcr.io/a/b:c", "--pins", tmp_path / "pins.json", *args)
    assert proc.returncode == 2 and phrase in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("digest, code", [("sha256:xyz", 2), ("md5:" + "0" * 32, 2)])
def test_fetch_of_a_malformed_digest(tmp_path, run_inproc, digest, code):
    (tmp_path / "pins.json").write_text("{}")
    proc = run_inproc("pin", "fetch", digest, "--pins", tmp_path / "pins.json", "--out", tmp_path / "o")
    assert proc.returncode == code and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("content", ["", "{", '{"reference": 1}', "[]"])
def test_fetch_from_a_broken_pins_file(tmp_path, run_inproc, content):
    (tmp_path / "pins.json").write_text(content)
    proc = run_inproc("pin", "fetch", "sha256:" + "0" * 64, "--pins", tmp_path / "pins.json", "--out", tmp_path / "o")
    check_one_line(proc, "not a sparkstack pins file")
