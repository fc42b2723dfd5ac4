"""`image pull` given bad input or hostile registry answers: one line each, and nothing that looks like a layout."""

import json
import socket

import pytest

from clirun import one_error_line
from registry_standin import Standin, fixture_repo

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def check_one_line(proc, phrase: str, code: int = 1) -> str:
    line = one_error_line(proc, code)
    assert phrase in line, line
    return line


def desc(n: int, size: int = 10, media: str = "application/octet-stream") -> dict:
    return {"digest": "sha256:" + f"{n:x}" * 64, "mediaType": media, "size": size}


@pytest.fixture
def pins(tmp_path):
    """A pins file by hand (no registry is asked for these): linux/arm64 only."""
    path = tmp_path / "pins.json"
    path.write_text(json.dumps({
        "reference": "ghcr.io/a/b:c", "registry": "ghcr.io", "repository": "a/b",
        "resolved": desc(1, media="application/vnd.oci.image.index.v1+json"),
        "platforms": {"linux/arm64": {"manifest": desc(2, media=OCI_MANIFEST), "config": desc(3),
                                      "layers": [desc(4), desc(5)]}}}))
    return path


def pull(run_inproc, pins, out, *extra, env=None):
    return run_inproc("image", "pull", "--out", out, "--pins", pins, *extra, env=env)


@pytest.mark.parametrize("platform", ["arm64", "linux/ARM64", "linux/arm64/v8/x", "linux arm64"])
def test_a_bad_platform_is_a_usage_error(pins, tmp_path, run_inproc, platform):
    proc = pull(run_inproc, pins, tmp_path / "out", "--platform", platform)
    check_one_line(proc, "--platform", code=2)
    assert not (tmp_path / "out").exists()


def test_a_platform_the_pins_lack_names_pin_base(pins, tmp_path, run_inproc):
    proc = pull(run_inproc, pins, tmp_path / "out", "--platform", "linux/amd64")
    line = check_one_line(proc, "pins no linux/amd64 image")
    assert "pinned: linux/arm64" in line
    assert f"sparkstack pin base ghcr.io/a/b:c --pins {pins} --platform linux/arm64 --platform linux/amd64`" in line
    assert not (tmp_path / "out").exists()


def test_out_that_is_a_file_is_refused_and_kept(pins, tmp_path, run_inproc):
    out = tmp_path / "out"
    out.write_text("mine")
    check_one_line(pull(run_inproc, pins, out), "not a directory")
    assert out.read_text() == "mine"


def test_out_that_someone_else_filled_is_refused_and_kept(pins, tmp_path, run_inproc):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    check_one_line(pull(run_inproc, pins, out), "was not written by sparkstack")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_a_blob_of_the_wrong_size_in_out_is_refused(pins, tmp_path, run_inproc):
    out = tmp_path / "out"
    (out / ".sparkstack").mkdir(parents=True)
    (out / ".sparkstack/output.json").write_text(json.dumps({"written_by": "sparkstack image pull"}))
    (out / "blobs/sha256").mkdir(parents=True)
    (out / "blobs/sha256" / ("4" * 64)).write_bytes(b"short")
    check_one_line(pull(run_inproc, pins, out, "--dry-run"), "not the pinned 10")
    assert (out / "blobs/sha256" / ("4" * 64)).read_bytes() == b"short"


@pytest.mark.parametrize("content", ["", "{}", "not json", '{"reference": 1}'])
def test_a_pins_file_that_is_not_one(tmp_path, run_inproc, content):
    bad = tmp_path / "pins.json"
    bad.write_text(content)
    check_one_line(pull(run_inproc, bad, tmp_path / "out"), "not a sparkstack pins file")


def test_no_pins_file(tmp_path, run_inproc):
    check_one_line(pull(run_inproc, tmp_path / "none.json", tmp_path / "out"), "no such pins file")


def test_an_unreachable_registry_leaves_no_layout(pins, tmp_path, run_inproc):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    out = tmp_path / "out"
    check_one_line(pull(run_inproc, pins, out, env={"SPARKSTACK_REGISTRY_MIRROR": f"http://127.0.0.1:{port}"}),
                   "Connection refused")
    assert not (out / "index.json").exists() and not (out / "oci-layout").exists()
    assert not list(out.glob("blobs/sha256/*"))


# fault -> a phrase the one line must carry
FAULTS = {"corrupt-blob": "refusing them", "redirect-loop": "redirect loop", "token-error": "answered 500",
          "deny": "access denied", "wrong-body": "hash to", "basic-auth": "Basic challenge"}


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    return fixture_repo(tmp_path_factory.mktemp("registry"))


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_hostile_answer_to_image_pull(fixture, tmp_path, run_inproc, fault):
    repos, served = fixture
    pins = tmp_path / "pins.json"
    out = tmp_path / "out"
    with Standin(repos) as standin:
        env = {"SPARKSTACK_REGISTRY_MIRROR": standin.url, "SPARKSTACK_REGISTRY_TIMEOUT": "2"}
        run_inproc("pin", "base", f"ghcr.io/{served.repo}:{served.tag}", "--pins", pins, env=env, check=0)
        standin.faults.add(fault)
        proc = run_inproc("image", "pull", "--out", out, "--pins", pins, env=env)
    check_one_line(proc, FAULTS[fault])
    assert not (out / "index.json").exists() and not (out / "oci-layout").exists()
    assert not list(out.glob("blobs/sha256/*.partial"))


def test_pins_that_disagree_with_the_manifest_stop_before_any_layer(fixture, tmp_path, run_inproc):
    """A pins file edited by hand (a layer dropped): the manifest, fetched by its pinned digest, says otherwise."""
    repos, served = fixture
    pins = tmp_path / "pins.json"
    out = tmp_path / "out"
    with Standin(repos) as standin:
        env = {"SPARKSTACK_REGISTRY_MIRROR": standin.url}
        run_inproc("pin", "base", f"ghcr.io/{served.repo}:{served.tag}", "--pins", pins, env=env, check=0)
        doc = json.loads(pins.read_text())
        doc["platforms"]["linux/arm64"]["layers"].pop(0)
        pins.write_text(json.dumps(doc))
        proc = run_inproc("image", "pull", "--out", out, "--pins", pins, env=env)
        cdn = standin.requests("cdn")
    check_one_line(proc, "are not the ones manifest")
    assert not (out / "index.json").exists()
    assert not any(layer in r["path"] for r in cdn for layer in served.platforms["linux/arm64"]["layers"])
