"""`pin base` and `pin fetch` against the registry stand-in (checks/registry_standin.py), and skopeo against it.

Expected digests come from the fixture's own bytes (imagefix.write_base and the stand-in hash
what they serve), never from sparkstack's output. The real ghcr.io cannot be reached here:
every request goes to the stand-in through SPARKSTACK_REGISTRY_MIRROR.
"""

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import requests

import imagefix as fx
from clirun import need, one_error_line
from registry_standin import OCI_INDEX, OCI_MANIFEST, Standin, fixture_repo

# The published digest of ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8 (docs/commands/pin.md).
KNOWN_DIGEST = "sha256:d77d375c742fc54f436dec5108b440f58f021bc6600052bf0e8fe5840357e78f"
CHECKOUT = Path(__file__).resolve().parents[2]




def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture
def reg(tmp_path):
    repos, served = fixture_repo(tmp_path / "fixture")
    with Standin(repos) as standin:
        yield {"standin": standin, "served": served, "tmp": tmp_path, "ref": f"ghcr.io/{served.repo}:{served.tag}",
               "env": {"SPARKSTACK_REGISTRY_MIRROR": standin.url}, "pins": tmp_path / "pins.json"}


def pin(run_cli, r, *args, check=None, env=None):
    return run_cli("pin", "base", *args, env={**r["env"], **(env or {})}, check=check)


def fetch(run_cli, r, digest, out, pins=None, check=None):
    return run_cli("pin", "fetch", digest, "--pins", pins or r["pins"], "--out", out, env=r["env"], check=check)


def blob_size(layout: Path, digest: str) -> int:
    return (layout / "blobs/sha256" / digest.split(":")[1]).stat().st_size


def test_tag_resolves_to_the_index_and_each_platform(reg, run_cli):
    s = reg["served"]
    pin(run_cli, reg, reg["ref"], "--platform", "linux/arm64", "--platform", "linux/amd64", "--pins", reg["pins"], check=0)
    doc = json.loads(reg["pins"].read_text())
    assert list(doc) == ["reference", "registry", "repository", "resolved", "platforms"]
    assert doc["reference"] == reg["ref"] and doc["registry"] == "ghcr.io" and doc["repository"] == s.repo
    assert doc["resolved"] == {"digest": s.index, "mediaType": OCI_INDEX, "size": s.index_size}
    assert list(doc["platforms"]) == ["linux/arm64", "linux/amd64"]
    for name, p in doc["platforms"].items():
        want, layout = s.platforms[name], s.layouts[name]
        assert p["manifest"] == {"digest": want["manifest"], "mediaType": OCI_MANIFEST, "size": want["manifest_size"]}
        assert p["config"]["digest"] == want["config"] and p["config"]["size"] == blob_size(layout, want["config"])
        assert [l["digest"] for l in p["layers"]] == want["layers"]
        assert [l["size"] for l in p["layers"]] == [blob_size(layout, d) for d in want["layers"]]
        assert [l["mediaType"] for l in p["layers"]] == [
            "application/vnd.oci.image.layer.v1.tar+gzip", "application/vnd.oci.image.layer.v1.tar+gzip",
            "application/vnd.oci.image.layer.v1.tar"]


def test_default_platform_is_linux_arm64_and_a_rerun_is_up_to_date(reg, run_cli):
    pin(run_cli, reg, reg["ref"], "--pins", reg["pins"], check=0)
    doc = json.loads(reg["pins"].read_text())
    assert list(doc["platforms"]) == ["linux/arm64"]  # the index says arm64/v8: linux/arm64 matches it
    before = reg["pins"].stat().st_mtime_ns
    again = pin(run_cli, reg, reg["ref"], "--pins", reg["pins"], check=0)
    assert again.stdout.startswith("up to date")
    assert reg["pins"].stat().st_mtime_ns == before


def test_a_digest_naming_a_single_manifest_reads_its_platform_from_the_config(reg, run_cli):
    s = reg["served"]
    amd = s.platforms["linux/amd64"]
    ref = f"ghcr.io/{s.repo}@{amd['manifest']}"
    pin(run_cli, reg, ref, "--platform", "linux/amd64", "--pins", reg["pins"], check=0)
    doc = json.loads(reg["pins"].read_text())
    assert doc["resolved"] == {"digest": amd["manifest"], "mediaType": OCI_MANIFEST, "size": amd["manifest_size"]}
    assert doc["platforms"]["linux/amd64"]["config"]["digest"] == amd["config"]
    # Its config says amd64, so the default platform (arm64) is not in it: one line, nothing written.
    reg["pins"].unlink()
    proc = pin(run_cli, reg, ref, "--pins", reg["pins"], check=1)
    line = one_error_line(proc)
    assert "single linux/amd64 image" in line and "linux/arm64" in line
    assert not reg["pins"].exists()


def test_a_missing_platform_is_one_line_naming_what_there_is(reg, run_cli):
    proc = pin(run_cli, reg, reg["ref"], "--platform", "linux/arm64", "--platform", "linux/s390x",
               "--pins", reg["pins"], check=1)
    line = one_error_line(proc)
    assert "no linux/s390x image" in line and "linux/amd64" in line and "linux/arm64/v8" in line
    assert not reg["pins"].exists()


def _moved_index(tmp: Path, served) -> tuple[bytes, str, Path]:
    """A new index under the same tag: arm64 rebuilt (other filler bytes), amd64 as it was."""
    layout = tmp / "layout-arm64-new"
    facts = fx.write_base(layout, layers=fx.default_layers(filler_bytes=1000), arch="arm64")
    man = (layout / "blobs/sha256" / facts["manifest"].split(":")[1]).read_bytes()
    amd = served.platforms["linux/amd64"]
    index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": facts["manifest"], "size": len(man),
         "platform": {"os": "linux", "architecture": "arm64"}},
        {"mediaType": OCI_MANIFEST, "digest": amd["manifest"], "size": amd["manifest_size"],
         "platform": {"os": "linux", "architecture": "amd64"}}]}).encode()
    return index, facts["manifest"], layout


def test_check_exits_1_naming_what_moved(reg, run_cli):
    s = reg["served"]
    pin(run_cli, reg, reg["ref"], "--platform", "linux/arm64", "--platform", "linux/amd64", "--pins", reg["pins"], check=0)
    ok = pin(run_cli, reg, reg["ref"], "--check", "--pins", reg["pins"], check=0)
    assert ok.stdout.startswith("up to date")
    before = reg["pins"].read_bytes()

    index, new_arm, layout = _moved_index(reg["tmp"], s)
    repo = reg["standin"].repos[s.repo]
    repo.add_layout(layout)
    repo.add_manifest(index, OCI_INDEX, s.tag)  # the tag now names the new index

    proc = pin(run_cli, reg, "--check", "--pins", reg["pins"], check=1)  # REF and platforms from the file
    line = one_error_line(proc)
    assert f"resolved {s.index} -> {sha(index)}" in line
    assert f"linux/arm64 manifest {s.platforms['linux/arm64']['manifest']} -> {new_arm}" in line
    assert "linux/amd64" not in line  # amd64 did not move
    assert reg["pins"].read_bytes() == before  # --check writes nothing
    # Without --check the file follows the tag.
    pin(run_cli, reg, "--pins", reg["pins"], check=0)
    assert json.loads(reg["pins"].read_text())["resolved"]["digest"] == sha(index)


def test_dry_run_prints_the_pins_and_writes_nothing(reg, run_cli):
    proc = pin(run_cli, reg, reg["ref"], "--pins", reg["pins"], "--dry-run", "--json", check=0)
    doc = json.loads(proc.stdout)
    assert doc["pins"]["resolved"]["digest"] == reg["served"].index and doc["written"] is False
    assert not reg["pins"].exists()


def test_the_anonymous_token_may_be_called_access_token(reg, run_cli):
    reg["standin"].faults.add("access-token-only")
    pin(run_cli, reg, reg["ref"], "--pins", reg["pins"], check=0)
    assert json.loads(reg["pins"].read_text())["resolved"]["digest"] == reg["served"].index


def test_authorization_never_reaches_the_blob_host(reg, run_cli):
    standin, s = reg["standin"], reg["served"]
    # The stand-in's CDN really refuses a request that carries Authorization (so this test can fail).
    blob = s.platforms["linux/arm64"]["layers"][0]
    assert requests.get(f"{standin.cdn_url}/blob/{s.repo}/{blob}", headers={"Authorization": "Bearer x"}).status_code == 400
    standin.log.clear()
    pin(run_cli, reg, reg["ref"], "--pins", reg["pins"], check=0)
    fetch(run_cli, reg, blob, reg["tmp"] / "layer", check=0)
    cdn = standin.requests("cdn")
    assert len(cdn) == 2  # the config (pin base) and the layer (pin fetch), each through the redirect
    assert all("authorization" not in r["headers"] for r in cdn)
    blob_hits = [r for r in standin.requests("registry") if "/blobs/" in r["path"]]
    assert blob_hits and all(r["headers"].get("authorization", "").startswith("Bearer ") for r in blob_hits[-1:])


def test_pins_file_is_found_from_the_working_directory_upward(reg, run_cli, tmp_path):
    root = tmp_path / "checkout"
    for d in ("python/sparkstack", "overlays", "recipes", "nix", "deep/er"):
        (root / d).mkdir(parents=True)
    env = dict(os.environ, **reg["env"])
    from clirun import sparkstack_cmd

    proc = subprocess.run(sparkstack_cmd() + ["pin", "base", reg["ref"]], cwd=root / "deep/er", env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((root / "nix/pins.json").read_text())["resolved"]["digest"] == reg["served"].index


def test_the_committed_pins_file_holds_the_known_digest_unresolved():
    doc = json.loads((CHECKOUT / "nix/pins.json").read_text())
    assert doc == {"reference": "ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8", "registry": "ghcr.io",
                   "repository": "tonyd2wild/vllm-glm53-flash",
                   "resolved": {"digest": KNOWN_DIGEST, "mediaType": None, "size": None}, "platforms": {}}


def test_pin_base_resolves_a_committed_shape_file_in_place(reg, run_cli):
    shutil.copy(CHECKOUT / "nix/pins.json", reg["pins"])
    proc = pin(run_cli, reg, "--pins", reg["pins"], check=0)  # REF from the file
    assert f"resolved {KNOWN_DIGEST} -> {reg['served'].index}" in proc.stdout
    doc = json.loads(reg["pins"].read_text())
    assert doc["resolved"]["mediaType"] == OCI_INDEX and list(doc["platforms"]) == ["linux/arm64"]


@pytest.mark.parametrize("content", [b"not json at all\n", b'{"hello": "world"}\n', b"[1, 2]\n",
                                     b'{"reference": "x", "registry": "y", "repository": "z", "resolved": {}, "platforms": {}}'])
def test_a_file_that_is_not_a_pins_file_is_never_replaced(reg, run_cli, content):
    reg["pins"].write_bytes(content)
    proc = pin(run_cli, reg, reg["ref"], "--pins", reg["pins"], check=1)
    assert "not a sparkstack pins file" in one_error_line(proc)
    assert reg["pins"].read_bytes() == content
    assert reg["standin"].log == []  # refused before asking the registry anything


# ---------------------------------------------------------------- pin fetch


@pytest.fixture
def pinned(reg, run_cli):
    pin(run_cli, reg, reg["ref"], "--platform", "linux/arm64", "--platform", "linux/amd64", "--pins", reg["pins"], check=0)
    return reg


def test_fetch_writes_each_kind_of_pinned_object_verified(pinned, run_cli):
    s, out = pinned["served"], pinned["tmp"] / "out"
    out.mkdir()
    arm, layout = s.platforms["linux/arm64"], s.layouts["linux/arm64"]
    index_bytes = pinned["standin"].repos[s.repo].manifests[s.index][0]
    wanted = {s.index: index_bytes, arm["manifest"]: None, arm["config"]: None, arm["layers"][0]: None,
              arm["layers"][2]: None}
    for digest, data in wanted.items():
        dest = out / digest.split(":")[1]
        fetch(run_cli, pinned, digest, dest, check=0)
        expected = data if data is not None else (layout / "blobs/sha256" / digest.split(":")[1]).read_bytes()
        assert dest.read_bytes() == expected
        assert oct(dest.stat().st_mode & 0o777) == "0o644"
    assert sorted(p.name for p in out.iterdir()) == sorted(d.split(":")[1] for d in wanted)  # no temp files left


def test_fetch_of_a_corrupt_blob_is_refused_and_leaves_nothing(pinned, run_cli):
    digest = pinned["served"].platforms["linux/arm64"]["layers"][0]
    pinned["standin"].faults.add("corrupt-blob")
    out_dir = pinned["tmp"] / "fetched"
    out_dir.mkdir()
    proc = fetch(run_cli, pinned, digest, out_dir / "layer", check=1)
    line = one_error_line(proc)
    assert digest in line and "refusing" in line
    assert list(out_dir.iterdir()) == []  # neither --out nor a partial file


def test_fetch_refuses_a_digest_the_pins_do_not_name(pinned, run_cli):
    pinned["standin"].log.clear()
    stranger = sha(b"not pinned")
    proc = fetch(run_cli, pinned, stranger, pinned["tmp"] / "x", check=1)
    assert stranger in one_error_line(proc) and "not named in" in proc.stderr
    assert not (pinned["tmp"] / "x").exists() and pinned["standin"].log == []


def test_fetch_twice_is_up_to_date_and_never_replaces_other_bytes(pinned, run_cli):
    digest = pinned["served"].platforms["linux/arm64"]["config"]
    dest = pinned["tmp"] / "cfg"
    fetch(run_cli, pinned, digest, dest, check=0)
    pinned["standin"].log.clear()
    assert fetch(run_cli, pinned, digest, dest, check=0).stdout.startswith("up to date")
    assert pinned["standin"].log == []
    dest.write_bytes(b"someone else's file")
    proc = fetch(run_cli, pinned, digest, dest, check=1)
    assert "refusing to replace" in one_error_line(proc)
    assert dest.read_bytes() == b"someone else's file"


def test_fetch_refuses_more_bytes_than_pinned(pinned, run_cli):
    doc = json.loads(pinned["pins"].read_text())
    layer = doc["platforms"]["linux/arm64"]["layers"][1]
    layer["size"] -= 10  # the pins say fewer bytes than the registry sends
    pinned["pins"].write_text(json.dumps(doc))
    dest = pinned["tmp"] / "layer"
    proc = fetch(run_cli, pinned, layer["digest"], dest, check=1)
    assert "pinned size" in one_error_line(proc)
    assert not dest.exists()


def test_fetch_works_from_the_committed_unresolved_shape(reg, run_cli):
    """The resolved entry has no mediaType yet: fetch asks for any manifest type and still checks the digest."""
    s = reg["served"]
    doc = json.loads((CHECKOUT / "nix/pins.json").read_text())
    doc.update(reference=reg["ref"], repository=s.repo)
    doc["resolved"]["digest"] = s.index
    reg["pins"].write_text(json.dumps(doc))
    fetch(run_cli, reg, s.index, reg["tmp"] / "index", check=0)
    assert sha((reg["tmp"] / "index").read_bytes()) == s.index


# ---------------------------------------------------------------- a real client agrees with us


def test_skopeo_reads_the_standin_and_agrees_with_our_pins(pinned, run_cli):
    skopeo = need("skopeo")
    s, standin = pinned["served"], pinned["standin"]
    doc = json.loads(pinned["pins"].read_text())
    src = f"docker://{standin.host}/{s.repo}:{s.tag}"

    def copy(dest: Path, *flags: str) -> dict:
        # The fixture's last layer is plain tar, which skopeo would compress for an oci: destination;
        # --preserve-digests makes it fail rather than rewrite anything.
        proc = subprocess.run([skopeo, "copy", "--src-tls-verify=false", "--preserve-digests",
                               "--dest-oci-accept-uncompressed-layers", *flags, src, f"oci:{dest}:{s.tag}"],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return json.loads((dest / "index.json").read_text())

    everything = copy(pinned["tmp"] / "sk-all", "--all")
    assert everything["manifests"][0]["digest"] == doc["resolved"]["digest"]  # the index, byte for byte
    for arch in ("arm64", "amd64"):
        one = copy(pinned["tmp"] / f"sk-{arch}", "--override-arch", arch)
        p = doc["platforms"][f"linux/{arch}"]
        assert one["manifests"][0]["digest"] == p["manifest"]["digest"]
        manifest = json.loads((pinned["tmp"] / f"sk-{arch}/blobs/sha256" / p["manifest"]["digest"].split(":")[1]).read_text())
        assert manifest["config"]["digest"] == p["config"]["digest"]
        assert [l["digest"] for l in manifest["layers"]] == [l["digest"] for l in p["layers"]]
    # skopeo took its blobs from the CDN, which refuses Authorization: it sent none either.
    assert standin.requests("cdn") and all("authorization" not in r["headers"] for r in standin.requests("cdn"))
