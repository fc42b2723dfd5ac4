"""The unsafe-tar corpus and other bad image inputs: one clear line, exit 1, nothing written."""

import json
from pathlib import Path

import pytest

import imagefix as fx
import synth

VLLM = fx.VLLM
KV = f"{VLLM}/v1/core/kv_cache_utils.py"


def _with_top_layer(entries):
    return fx.default_layers() + [("gzip", entries)]


CORPUS = {
    "member climbs out with ..": (_with_top_layer([("../escape.py", "file", "x")]), "climbs out"),
    "member climbs out mid-path": (_with_top_layer([("usr/../../etc/evil", "file", "x")]), "climbs out"),
    "link resolves outside the root": (
        _with_top_layer([(f"{VLLM}/v1/core", "symlink", "../../../../../../../../../../outside")]), "outside the image root"),
    "hardlink target outside the root": (
        _with_top_layer([(KV, "hardlink", "../../../../../../../../etc/passwd")]), "climbs out"),
    "device node at an extracted path": (_with_top_layer([(KV, "char", None)]), "device node"),
    "fifo at an extracted path": (_with_top_layer([(KV, "fifo", None)]), "fifo node"),
    "symlink loop": (_with_top_layer([(f"{VLLM}/v1/core", "symlink", "core2"), (f"{VLLM}/v1/core2", "symlink", "core")]),
                     "too many symlinks"),
}


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKSTACK_CACHE_DIR", str(tmp_path / "cache"))
    src = fx.write_overlay_source(tmp_path / "src")
    overlay = fx.write_overlay(tmp_path / "overlay", pinned_from=src / "overlay-dflash2")
    return tmp_path, src, overlay


def _refused(proc, expect):
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith("sparkstack: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert expect in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_unsafe_base_is_refused(world, run_cli, case):
    tmp, src, overlay = world
    layers, expect = CORPUS[case]
    fx.write_base(tmp / "base", layers=layers)
    before = synth.tree_digest(tmp / "base")
    proc = run_cli("image", "build", "--base", tmp / "base", "--overlay", overlay, "--overlay-src", src, "--out", tmp / "out")
    _refused(proc, expect)
    assert not (tmp / "out").exists() and not list(tmp.glob(".sparkstack-*"))
    assert synth.tree_digest(tmp / "base") == before


def _tamper_layer(base: Path, digests: dict) -> None:
    blob = base / "blobs/sha256" / digests["layers"][1].split(":")[1]
    data = bytearray(blob.read_bytes())
    data[-10] ^= 0x55
    blob.write_bytes(bytes(data))


def _wrong_diff_id(base: Path, digests: dict) -> None:
    """Rewrite the config with a wrong diff_id, and the manifest and index to match, so only the diff_id lies."""
    import hashlib

    def put(data: bytes) -> str:
        d = hashlib.sha256(data).hexdigest()
        (base / "blobs/sha256" / d).write_bytes(data)
        return "sha256:" + d

    cfg = json.loads((base / "blobs/sha256" / digests["config"].split(":")[1]).read_text())
    cfg["rootfs"]["diff_ids"][0] = "sha256:" + "0" * 64
    cfg_bytes = json.dumps(cfg).encode()
    man = json.loads((base / "blobs/sha256" / digests["manifest"].split(":")[1]).read_text())
    man["config"] = dict(man["config"], digest=put(cfg_bytes), size=len(cfg_bytes))
    man_bytes = json.dumps(man).encode()
    index = json.loads((base / "index.json").read_text())
    index["manifests"][0].update(digest=put(man_bytes), size=len(man_bytes))
    (base / "index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("case, expect", [("tampered layer", "does not match its digest"), ("wrong diff_id", "diffid mismatch")])
def test_corrupt_base_is_refused(world, run_cli, case, expect):
    tmp, src, overlay = world
    digests = fx.write_base(tmp / "base")
    (_tamper_layer if case == "tampered layer" else _wrong_diff_id)(tmp / "base", digests)
    proc = run_cli("image", "build", "--base", tmp / "base", "--overlay", overlay, "--overlay-src", src, "--out", tmp / "out")
    _refused(proc, expect)
    assert not (tmp / "out").exists()
    _refused(run_cli("image", "verify", tmp / "base"), expect)


@pytest.mark.parametrize("what", ["missing", "empty dir", "not a tar", "bad index"])
def test_not_an_image(world, run_cli, what):
    tmp, src, overlay = world
    base = tmp / "base"
    if what == "empty dir":
        base.mkdir()
    elif what == "not a tar":
        base = tmp / "base.tar"
        base.write_text("hello")
    elif what == "bad index":
        fx.write_base(base)
        (base / "index.json").write_text("{nope")
    proc = run_cli("image", "build", "--base", base, "--overlay", overlay, "--overlay-src", src, "--out", tmp / "out")
    _refused(proc, "")
    assert not (tmp / "out").exists()


@pytest.mark.parametrize("edit, expect", [
    (lambda t: t.replace('name = "dflash2-fixture"', 'name = "dflash2-fixture"\ncolour = "blue"'), "unknown key 'colour'"),
    (lambda t: t.replace('args = ["{vllm}"]', 'args = ["{vllm}"]\nshell = true'), "unknown key 'shell'"),
    (lambda t: t.replace(fx.REV, "main"), "full 40-hex commit"),
    (lambda t: t.replace('dest = "model_executor/models/qwen3_dflash2.py"', 'dest = "../../../../etc/x"'), "relative path inside"),
    (lambda t: t + "\n[[[", "not valid TOML"),
])
def test_bad_overlay_toml(world, run_cli, edit, expect):
    tmp, src, overlay = world
    fx.write_base(tmp / "base")
    toml = overlay / "overlay.toml"
    toml.write_text(edit(toml.read_text()))
    proc = run_cli("image", "build", "--base", tmp / "base", "--overlay", overlay, "--overlay-src", src, "--out", tmp / "out")
    _refused(proc, expect)


def test_step_placeholder_cannot_escape_the_vllm_root(world, run_cli):
    tmp, src, overlay = world
    fx.write_base(tmp / "base")
    toml = overlay / "overlay.toml"
    toml.write_text(toml.read_text().replace("{file:v1/core/kv_cache_utils.py}", "{file:../../../../../etc/passwd}"))
    proc = run_cli("image", "build", "--base", tmp / "base", "--overlay", overlay, "--overlay-src", src, "--out", tmp / "out")
    _refused(proc, "relative path inside")
