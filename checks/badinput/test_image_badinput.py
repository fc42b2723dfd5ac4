"""The unsafe-tar corpus and other bad image inputs: one clear line, exit 1, nothing written."""

import json
from pathlib import Path

import pytest

import imagefix as fx
import synth
from clirun import one_error_line, run_in_process

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
def overlay_world(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKSTACK_CACHE_DIR", str(tmp_path / "cache"))
    src = fx.write_overlay_source(tmp_path / "src")
    overlay = fx.write_overlay(tmp_path / "overlay", pinned_from=src / "overlay-dflash2")
    return tmp_path, src, overlay


def _refused(proc, expect):
    assert expect in one_error_line(proc)


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_unsafe_base_is_refused(overlay_world, run_inproc, case):
    tmp, src, overlay = overlay_world
    layers, expect = CORPUS[case]
    fx.write_base(tmp / "base", layers=layers)
    before = synth.tree_digest(tmp / "base")
    proc = run_inproc("image", "build", "--base", tmp / "base", "--overlay", overlay, "--overlay-src", src, "--out", tmp / "out")
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
def test_corrupt_base_is_refused(overlay_world, run_inproc, case, expect):
    tmp, src, overlay = overlay_world
    digests = fx.write_base(tmp / "base")
    (_tamper_layer if case == "tampered layer" else _wrong_diff_id)(tmp / "base", digests)
    proc = run_inproc("image", "build", "--base", tmp / "base", "--overlay", overlay, "--overlay-src", src, "--out", tmp / "out")
    _refused(proc, expect)
    assert not (tmp / "out").exists()
    _refused(run_inproc("image", "verify", tmp / "base"), expect)


@pytest.mark.parametrize("what", ["missing", "empty dir", "not a tar", "bad index"])
def test_not_an_image(overlay_world, run_inproc, what):
    tmp, src, overlay = overlay_world
    base = tmp / "base"
    if what == "empty dir":
        base.mkdir()
    elif what == "not a tar":
        base = tmp / "base.tar"
        base.write_text("hello")
    elif what == "bad index":
        fx.write_base(base)
        (base / "index.json").write_text("{nope")
    proc = run_inproc("image", "build", "--base", base, "--overlay", overlay, "--overlay-src", src, "--out", tmp / "out")
    _refused(proc, "")
    assert not (tmp / "out").exists()


@pytest.mark.parametrize("edit, expect", [
    (lambda t: t.replace('name = "dflash2-fixture"', 'name = "dflash2-fixture"\ncolour = "blue"'), "unknown key 'colour'"),
    (lambda t: t.replace('args = ["{vllm}"]', 'args = ["{vllm}"]\nshell = true'), "unknown key 'shell'"),
    (lambda t: t.replace(fx.REV, "main"), "full 40-hex commit"),
    (lambda t: t.replace('dest = "model_executor/models/qwen3_dflash2.py"', 'dest = "../../../../etc/x"'), "relative path inside"),
    (lambda t: t + "\n[[[", "not valid TOML"),
])
def test_bad_overlay_toml(overlay_world, run_inproc, edit, expect):
    tmp, src, overlay = overlay_world
    fx.write_base(tmp / "base")
    toml = overlay / "overlay.toml"
    toml.write_text(edit(toml.read_text()))
    proc = run_inproc("image", "build", "--base", tmp / "base", "--overlay", overlay, "--overlay-src", src, "--out", tmp / "out")
    _refused(proc, expect)


def test_step_placeholder_cannot_escape_the_vllm_root(overlay_world, run_inproc):
    tmp, src, overlay = overlay_world
    fx.write_base(tmp / "base")
    toml = overlay / "overlay.toml"
    toml.write_text(toml.read_text().replace("{file:v1/core/kv_cache_utils.py}", "{file:../../../../../etc/passwd}"))
    proc = run_inproc("image", "build", "--base", tmp / "base", "--overlay", overlay, "--overlay-src", src, "--out", tmp / "out")
    _refused(proc, "relative path inside")


# ================================================================ hostile bases: every class gets one line
#
# Each case below drives the real CLI (`image build` and, where it reads the same input, `image verify`)
# and asserts: exit 1, exactly one stderr line, no traceback, the named file/key/value in that line,
# and no --out written. In process (clirun.run_in_process: the real entry point, without an interpreter's start per
# case); its timeout catches a hang as a failure, as a child's did.

import hashlib
import io
import os
import re

import zstandard

HANG_S = 40


def _cli(*args, timeout=HANG_S):
    return run_in_process(args, timeout=timeout)


def _one_line(proc, tmp: Path, *fragments) -> str:
    """Exactly one `sparkstack: error:` line holding every fragment; returns it with tmp shown as <tmp>."""
    line = one_error_line(proc).replace(str(tmp), "<tmp>")  # so a fragment never matches the test's own dir name
    for f in fragments:
        assert f in line, f"{f!r} not in: {line}"
    return line


def _build_refused(tmp, base, src, overlay, *fragments, timeout=HANG_S):
    proc = _cli("image", "build", "--base", base, "--overlay", overlay, "--overlay-src", src, "--out", tmp / "out",
                timeout=timeout)
    line = _one_line(proc, tmp, *fragments)
    assert not (tmp / "out").exists() and not list(tmp.glob(".sparkstack-*")) and not list(tmp.glob(".out*"))
    return line


def _verify_refused(tmp, image, *fragments, timeout=HANG_S):
    return _one_line(_cli("image", "verify", image, timeout=timeout), tmp, *fragments)


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _drop(doc: dict, key: str):
    del doc[key]
    return doc


def _layer(i, **change):
    def edit(m):
        m["layers"][i].update(change)
        return m
    return edit


def _layer_drop(i, key):
    def edit(m):
        del m["layers"][i][key]
        return m
    return edit


def _entry(**change):
    def edit(idx):
        idx["manifests"][0].update(change)
        return idx
    return edit


def _json_tail(doc: dict, extra: str) -> bytes:
    """The document's JSON with raw `extra` members spliced in before its closing brace."""
    return (json.dumps(doc)[:-1] + ", " + extra + "}").encode()


def _upper_hex(d: str) -> str:
    return "sha256:" + d.split(":")[1].upper()


def _config_runtime(value):
    def edit(c):
        c["config"] = value
        return c
    return edit


def _config_label(value):
    def edit(c):
        c["config"]["Labels"]["x"] = value
        return c
    return edit


# name -> (restack kwargs, or a function (base, digests) doing the damage; fragments; can verify read it?)
DOCUMENTS = {
    "manifest without config": (dict(manifest=lambda m: _drop(m, "config")), ("manifest", "config", "missing")),
    "manifest is a JSON list": (dict(manifest=lambda m: [m]), ("manifest", "object")),
    "manifest blob is not JSON": (dict(manifest=lambda m: b"{nope"), ("manifest", "not JSON")),
    "manifest is not UTF-8": (dict(manifest=lambda m: _json_tail(m, '"annotations": {"x": "\xff"}').replace(
        b"\xc3\xbf", b"\xff")), ("manifest", "UTF-8")),
    "index entry without digest": (dict(index=lambda i: (i["manifests"][0].pop("digest"), i)[1]),
                                   ("index.json", "manifests[0].digest", "missing")),
    "index entry digest in uppercase hex": (dict(index=lambda i: _entry(digest=_upper_hex(i["manifests"][0]["digest"]))(i)),
                                            ("index.json", "manifests[0].digest")),
    "index entry platform is a string": (dict(index=_entry(platform="linux/arm64")), ("index.json", "manifests[0].platform")),
    "index entry size is 10**30": (dict(index=_entry(size=10**30)), ("index.json", "manifests[0].size")),
    "index.json is UTF-16": (dict(index=lambda i: json.dumps(i).encode("utf-16")), ("index.json", "UTF-8")),
    "index.json nested 100000 deep": (dict(index=lambda i: b"[" * 100_000 + b"]" * 100_000), ("index.json", "deep")),
    "layer without mediaType": (dict(manifest=_layer_drop(1, "mediaType")), ("layers[1].mediaType", "missing")),
    "layer mediaType is a number": (dict(manifest=_layer(0, mediaType=5)), ("layers[0].mediaType", "5")),
    "layer mediaType is unknown": (dict(manifest=_layer(0, mediaType="application/x-foo")),
                                   ("layers[0].mediaType", "application/x-foo")),
    "layer digest in uppercase hex": (dict(manifest=lambda m: _layer(0, digest=_upper_hex(m["layers"][0]["digest"]))(m)),
                                      ("layers[0].digest",)),
    "layer digest is sha512": (dict(manifest=_layer(0, digest="sha512:" + "ab" * 64)), ("layers[0].digest", "sha512:")),
    "config digest is sha512": (dict(manifest=lambda m: (m["config"].update(digest="sha512:" + "ab" * 64), m)[1]),
                                ("config.digest", "sha512:")),
    "layer size negative": (dict(manifest=_layer(0, size=-1)), ("layers[0].size", "-1")),
    "layer size is a bool": (dict(manifest=_layer(0, size=True)), ("layers[0].size", "True")),
    "layer size is a string": (dict(manifest=_layer(0, size="64")), ("layers[0].size", "'64'")),
    "layer size is 10**30": (dict(manifest=_layer(0, size=10**30)), ("layers[0].size",)),
    "diff_ids is not a list": (dict(config=lambda c: (c["rootfs"].update(diff_ids="sha256:" + "0" * 64), c)[1]),
                               ("rootfs.diff_ids",)),
    "a diff_id is not a digest": (dict(config=lambda c: (c["rootfs"]["diff_ids"].__setitem__(1, "sha256:zz"), c)[1]),
                                  ("rootfs.diff_ids[1]", "sha256:zz")),
    "config without os": (dict(config=lambda c: _drop(c, "os")), ("config", "os", "missing")),
    "config runtime section is a list": (dict(config=_config_runtime([])), ("config", "config: expected")),
    "config nested 100000 deep": (dict(config=lambda c: _json_tail(c, '"deep": ' + "[" * 100_000 + "]" * 100_000)),
                                  ("config", "deep")),
    "config integer of 5000 digits": (dict(config=lambda c: _json_tail(c, '"huge": ' + "9" * 5000)), ("config", "integer")),
    "config number 1e400": (dict(config=lambda c: _json_tail(c, '"big": 1e400')), ("config", "1e400")),
    "config NaN": (dict(config=lambda c: _json_tail(c, '"nan": NaN')), ("config", "NaN")),
    "config label with a lone surrogate": (dict(config=_config_label("\ud800")), ("config", "surrogate")),
}


def _size_off(which: str, delta: int):
    """A descriptor whose size is `delta` off the blob's real size; fragments: the digest and both sizes."""
    def damage(base: Path, digests: dict):
        if which == "manifest":
            idx = json.loads((base / "index.json").read_text())
            desc = idx["manifests"][0]
            real = desc["size"]
            desc["size"] += delta
            (base / "index.json").write_text(json.dumps(idx))
            return desc["digest"], real, real + delta
        box = {}

        def edit(m):
            desc = m["config"] if which == "config" else m["layers"][0]
            box.update(digest=desc["digest"], real=desc["size"])
            desc["size"] += delta
            return m
        fx.restack(base, manifest=edit)
        return box["digest"], box["real"], box["real"] + delta
    return damage


SIZES = {"manifest size one too big": ("manifest", 1), "config size one too small": ("config", -1),
         "layer size one too big": ("layer", 1), "layer size one too small": ("layer", -1)}


@pytest.mark.parametrize("case", sorted(DOCUMENTS))
def test_bad_oci_document(overlay_world, case):
    """Every malformed index, manifest or config: one line naming file and key, from build and verify."""
    tmp, src, overlay = overlay_world
    fx.write_base(tmp / "base")
    edits, fragments = DOCUMENTS[case]
    fx.restack(tmp / "base", **edits)
    _build_refused(tmp, tmp / "base", src, overlay, *fragments)
    _verify_refused(tmp, tmp / "base", *fragments)


@pytest.mark.parametrize("case", sorted(SIZES))
def test_descriptor_size_must_match_the_blob(overlay_world, case):
    tmp, src, overlay = overlay_world
    digests = fx.write_base(tmp / "base")
    digest, real, said = _size_off(*SIZES[case])(tmp / "base", digests)
    # the message names the blob and both numbers; when the blob is longer than said, "more than" the claim
    fragments = (digest, str(said)) if said < real else (digest, str(real), str(said))
    _build_refused(tmp, tmp / "base", src, overlay, *fragments)
    _verify_refused(tmp, tmp / "base", *fragments)


DOCKER = {
    "manifest.json without Config": (lambda d: [_drop(d[0], "Config")], ("manifest.json", "[0].Config", "missing")),
    "manifest.json is an object": (lambda d: d[0], ("manifest.json", "list")),
    "manifest.json entry is a string": (lambda d: ["x"], ("manifest.json", "[0]", "object")),
    "manifest.json Layers is a string": (lambda d: [dict(d[0], Layers="layer0/layer.tar")], ("manifest.json", "[0].Layers")),
    "manifest.json Config climbs out": (lambda d: [dict(d[0], Config="../../etc/passwd")],
                                        ("manifest.json", "[0].Config", "../../etc/passwd")),
    "manifest.json is not UTF-8": (lambda d: json.dumps(d).encode()[:-1] + b', "\xff"]', ("manifest.json", "UTF-8")),
    "manifest.json nested 100000 deep": (lambda d: b"[" * 100_000 + b"]" * 100_000, ("manifest.json", "deep")),
    "manifest.json config nested 100000 deep": (None, ("deep",)),
}


@pytest.mark.parametrize("case", sorted(DOCKER))
def test_bad_docker_archive(overlay_world, case):
    tmp, src, overlay = overlay_world
    fx.write_base(tmp / "layout")
    edit, fragments = DOCKER[case]
    if edit is None:  # the config member itself is hostile
        fx.restack(tmp / "layout", config=lambda c: _json_tail(c, '"deep": ' + "[" * 100_000 + "]" * 100_000))
    fx.layout_to_docker_archive(tmp / "layout", tmp / "base.tar", edit=edit)
    _build_refused(tmp, tmp / "base.tar", src, overlay, *fragments)
    _verify_refused(tmp, tmp / "base.tar", *fragments)


def test_bad_document_in_an_oci_archive(overlay_world):
    tmp, src, overlay = overlay_world
    fx.write_base(tmp / "layout")
    fx.restack(tmp / "layout", manifest=_layer_drop(0, "mediaType"))
    fx.layout_to_oci_archive(tmp / "layout", tmp / "base.tar")
    _build_refused(tmp, tmp / "base.tar", src, overlay, "layers[0].mediaType", "missing")
    _verify_refused(tmp, tmp / "base.tar", "layers[0].mediaType", "missing")


# ---------------------------------------------------------------- index shapes that loop, nest or flood


def _nested_chain(base: Path, depth: int, fan_out: int = 1) -> None:
    """index.json -> index -> index ... -> the manifest, each index listing its child `fan_out` times."""
    idx = json.loads((base / "index.json").read_text())
    child = dict(idx["manifests"][0])
    child.pop("platform", None)
    for _ in range(depth):
        data = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                           "manifests": [child] * fan_out}).encode()
        child = {"mediaType": "application/vnd.oci.image.index.v1+json", "digest": fx.put_blob(base, data),
                 "size": len(data)}
    idx["manifests"] = [child]
    (base / "index.json").write_text(json.dumps(idx))


def test_deeply_nested_indexes(overlay_world):
    tmp, src, overlay = overlay_world
    fx.write_base(tmp / "base")
    _nested_chain(tmp / "base", 2000)
    _build_refused(tmp, tmp / "base", src, overlay, "index", "deep")
    _verify_refused(tmp, tmp / "base", "index", "deep")


def test_index_graph_that_revisits_one_index_is_walked_once(overlay_world):
    """Seven levels, each listing the next 20 times: 20**7 paths to one amd64 manifest, nothing for arm64."""
    tmp, src, overlay = overlay_world
    fx.write_base(tmp / "base", arch="amd64")
    _nested_chain(tmp / "base", 7, fan_out=20)
    _build_refused(tmp, tmp / "base", src, overlay, "linux/amd64")
    proc = _cli("image", "verify", tmp / "base")
    _one_line(proc, tmp, "20")  # verify, with no --platform: the nested index holds 20 manifests


def test_index_with_100000_manifests(overlay_world):
    tmp, src, overlay = overlay_world
    fx.write_base(tmp / "base", arch="amd64")
    idx = json.loads((tmp / "base/index.json").read_text())
    idx["manifests"] = idx["manifests"] * 100_000
    (tmp / "base/index.json").write_text(json.dumps(idx))
    line = _build_refused(tmp, tmp / "base", src, overlay, "linux/amd64")
    assert len(line) < 1000, f"one line, but {len(line)} characters long"
    _verify_refused(tmp, tmp / "base", "100000")


# ---------------------------------------------------------------- what sits at a blob or document path


def _fifo_at(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


FILES = {
    "layer blob is a symlink to /dev/zero": (lambda b, d: (fx.blob_path(b, d["layers"][0]).unlink(),
                                                            fx.blob_path(b, d["layers"][0]).symlink_to("/dev/zero")),
                                              lambda d: (d["layers"][0], "regular file")),
    "layer blob is a symlink to /etc/passwd": (lambda b, d: (fx.blob_path(b, d["layers"][2]).unlink(),
                                                              fx.blob_path(b, d["layers"][2]).symlink_to("/etc/passwd")),
                                                lambda d: (d["layers"][2],)),
    "manifest blob is a fifo": (lambda b, d: _fifo_at(fx.blob_path(b, d["manifest"])),
                                lambda d: (d["manifest"], "regular file")),
    "index.json is a fifo": (lambda b, d: _fifo_at(b / "index.json"), lambda d: ("index.json", "regular file")),
    "config blob is a directory": (lambda b, d: (fx.blob_path(b, d["config"]).unlink(),
                                                 fx.blob_path(b, d["config"]).mkdir()),
                                   lambda d: (d["config"], "regular file")),
    "layer blob is missing": (lambda b, d: fx.blob_path(b, d["layers"][1]).unlink(), lambda d: (d["layers"][1], "missing")),
}


@pytest.mark.parametrize("case", sorted(FILES))
def test_hostile_file_in_a_layout(overlay_world, case):
    tmp, src, overlay = overlay_world
    digests = fx.write_base(tmp / "base")
    damage, fragments = FILES[case]
    damage(tmp / "base", digests)
    _build_refused(tmp, tmp / "base", src, overlay, *fragments(digests))
    _verify_refused(tmp, tmp / "base", *fragments(digests))


# ---------------------------------------------------------------- oci-layout's content


LAYOUT_MARKERS = {
    "empty object": b"{}",
    "version 2.0.0": b'{"imageLayoutVersion":"2.0.0"}',
    "version as a number": b'{"imageLayoutVersion":1.0}',
    "not JSON": b"hello",
    "a JSON list": b'["1.0.0"]',
    "not UTF-8": b'{"imageLayoutVersion":"1.0.0\xff"}',
    "a directory": None,
}


@pytest.mark.parametrize("case", sorted(LAYOUT_MARKERS))
@pytest.mark.parametrize("form", ["layout dir", "oci-archive"])
def test_bad_oci_layout_marker(overlay_world, case, form):
    tmp, src, overlay = overlay_world
    fx.write_base(tmp / "layout")
    marker = tmp / "layout/oci-layout"
    marker.unlink()
    if LAYOUT_MARKERS[case] is None:
        marker.mkdir()
        if form == "oci-archive":
            (marker / "x").write_text("x")  # a dir member, and a file under it
    else:
        marker.write_bytes(LAYOUT_MARKERS[case])
    base = tmp / "layout"
    if form == "oci-archive":
        fx.layout_to_oci_archive(tmp / "layout", tmp / "base.tar")
        base = tmp / "base.tar"
    _build_refused(tmp, base, src, overlay, "oci-layout")
    _verify_refused(tmp, base, "oci-layout")


# ---------------------------------------------------------------- decompression errors name the layer


def _gzip_corrupt(blob: bytes) -> bytes:
    data = bytearray(blob)
    for i in range(len(data) // 2, len(data) // 2 + 16):
        data[i] ^= 0xA5
    return bytes(data)


def _zstd_corrupt(blob: bytes) -> bytes:
    data = bytearray(blob)
    data[4] |= 0x08  # the frame header's reserved bit: no decoder may accept it
    return bytes(data)


def _zstd_truncated_consistent(raw: bytes) -> tuple[bytes, str]:
    """A zstd blob cut mid-frame, with the diff_id of what a quietly stopping decoder yields."""
    blob = zstandard.ZstdCompressor().compress(raw)[:-40]
    partial = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(blob), read_across_frames=True).read()
    return blob, _sha(partial)


COMPRESSION = {
    # name: (compressions of the three fixture layers, damage(raw tar of layer 0, blob) -> (blob, diff_id or None), kind)
    "gzip layer corrupt mid-stream": (("gzip", "gzip", "none"), lambda raw, blob: (_gzip_corrupt(blob), None), "gzip"),
    "gzip layer truncated": (("gzip", "gzip", "none"), lambda raw, blob: (blob[:-100], None), "gzip"),
    "gzip layer missing its trailer": (("gzip", "gzip", "none"), lambda raw, blob: (blob[:-8], _sha(raw)), "gzip"),
    "gzip layer is empty": (("gzip", "gzip", "none"), lambda raw, blob: (b"", _sha(b"")), "gzip"),
    "zstd layer corrupt": (("zstd", "gzip", "none"), lambda raw, blob: (_zstd_corrupt(blob), None), "zstd"),
    "zstd layer truncated": (("zstd", "gzip", "none"), lambda raw, blob: (blob[:-100], None), "zstd"),
    "zstd layer truncated, diff_id of what a decoder yields": (
        ("zstd", "gzip", "none"), lambda raw, blob: _zstd_truncated_consistent(raw), "zstd"),
}


@pytest.mark.parametrize("case", sorted(COMPRESSION))
def test_decompression_error_names_the_layer(overlay_world, case):
    """The blob's digest is made to match, so only the compressed stream itself is wrong."""
    tmp, src, overlay = overlay_world
    compressions, damage, kind = COMPRESSION[case]
    layers = fx.default_layers(compressions=compressions)
    digests = fx.write_base(tmp / "base", layers=layers)
    raw = fx.tar_bytes(layers[0][1])
    blob, diff_id = damage(raw, fx.blob_path(tmp / "base", digests["layers"][0]).read_bytes())
    digest = fx.replace_layer(tmp / "base", 0, blob, diff_id)
    _build_refused(tmp, tmp / "base", src, overlay, digest, kind)
    _verify_refused(tmp, tmp / "base", digest, kind)


# ---------------------------------------------------------------- overlay.toml: every path, every type


def _toml(old: str, new: str):
    def edit(text: str) -> str:
        assert old in text, old
        return text.replace(old, new, 1)
    return edit


_IMAGE = 'name = "sparkstack/fixture"'
_DEST = 'dest = "model_executor/models/qwen3_dflash2.py"'
_SRC = 'src = "qwen3_dflash2.py"'
_SCRIPT = 'script = "patch_registry_and_select.py"'
_TOUCHES = 'touches = ["v1/core/kv_cache_utils.py"]'
_SUBDIR = 'subdir = "overlay-dflash2"'
_STEP = 'name = "registry_and_select"'
_ENABLED = "enabled = true"
_RUNTIME = 'runtime = [["python3", "-c", "import vllm.model_executor.models.qwen3_dflash2"]]'
_VARIANT = '\n[variants.instanttensor]\nload_format = "instanttensor"\n\n[[variants.instanttensor.wheels]]\nfile = {}\nsha256 = "unpinned"\n'

OVERLAYS = {
    "vllm_root climbs out": (_toml(_IMAGE, _IMAGE + '\nvllm_root = "/../../.."'), ("vllm_root", "/../../..")),
    "vllm_root climbs out mid-path": (_toml(_IMAGE, _IMAGE + '\nvllm_root = "usr/../../etc"'), ("vllm_root",)),
    "vllm_root is empty": (_toml(_IMAGE, _IMAGE + '\nvllm_root = ""'), ("vllm_root",)),
    "vllm_root is /": (_toml(_IMAGE, _IMAGE + '\nvllm_root = "/"'), ("vllm_root",)),
    "vllm_root is .": (_toml(_IMAGE, _IMAGE + '\nvllm_root = "."'), ("vllm_root",)),
    "vllm_root is a number": (_toml(_IMAGE, _IMAGE + "\nvllm_root = 3"), ("vllm_root",)),
    "install src is absolute": (_toml(_SRC, 'src = "/etc/passwd"'), ("src", "/etc/passwd")),
    "install dest climbs out after ./": (_toml(_DEST, 'dest = "a/./../../x"'), ("dest",)),
    "install dest has a backslash": (_toml(_DEST, 'dest = "..\\\\..\\\\x"'), ("dest",)),
    "install dest is .": (_toml(_DEST, 'dest = "."'), ("dest",)),
    "install dest has a NUL": (_toml(_DEST, 'dest = "a\\u0000b"'), ("dest",)),
    "step script is ./": (_toml(_SCRIPT, 'script = "./"'), ("script",)),
    "touches is absolute": (_toml(_TOUCHES, 'touches = ["/etc/passwd"]'), ("touches", "/etc/passwd")),
    "touches has a newline": (_toml(_TOUCHES, 'touches = ["v1/core/kv_cache_utils.py\\nx"]'), ("touches",)),
    "placeholder path has a backslash": (_toml("{file:v1/core/kv_cache_utils.py}", "{file:v1\\\\core}"), ("{file:",)),
    "source subdir climbs out": (_toml(_SUBDIR, 'subdir = "../.."'), ("subdir", "../..")),
    "source subdir is absolute": (_toml(_SUBDIR, 'subdir = "/tmp"'), ("subdir", "/tmp")),
    "wheel file has a backslash": (lambda t: t + _VARIANT.format('"..\\\\x.whl"'), ("variants.instanttensor", "file")),
    "wheel file is absolute": (lambda t: t + _VARIANT.format('"/x.whl"'), ("variants.instanttensor", "file", "/x.whl")),
    "name is a number": (_toml('name = "dflash2-fixture"', "name = 5"), ("name", "5")),
    "repo is a list": (_toml('repo = "example/overlay-fixture"', 'repo = ["a"]'), ("repo",)),
    "enabled is a string": (_toml(_ENABLED, 'enabled = "false"'), ("enabled", "'false'")),
    "step name has a newline": (_toml(_STEP, 'name = "a\\nb"'), ("name",)),
    "two steps share a name": (_toml('name = "glm_aux_capture"', _STEP), ("name", "registry_and_select")),
    "step arg has a NUL": (_toml('args = ["{vllm}"]', 'args = ["{vllm}\\u0000"]'), ("args",)),
    "runtime gate is empty": (_toml(_RUNTIME, "runtime = [[]]"), ("runtime",)),
    "runtime gate has a NUL": (_toml(_RUNTIME, 'runtime = [["python3", "\\u0000"]]'), ("runtime",)),
    "runtime is a string": (_toml(_RUNTIME, 'runtime = "python3"'), ("runtime",)),
    "variants is a string": (lambda t: 'variants = "x"\n' + t, ("variants",)),
    "variant name is not a tag": (lambda t: t + '\n[variants."a/b"]\nwheels = []\n', ("variants", "a/b")),
    "load_format is a number": (lambda t: t + "\n[variants.it]\nload_format = 5\nwheels = []\n", ("load_format", "5")),
    "install is a table, not an array": (
        lambda t: 'install = {src = "a", dest = "b", sha256 = "unpinned"}\n' + re.sub(r"\[\[install\]\]\n(.+\n){3}", "", t),
        ("install", "table")),
    "image name has a space": (_toml(_IMAGE, 'name = "sparkstack fixture"'), ("[image] name",)),
    "nested 100000 deep": (lambda t: t + "\nx = " + "[" * 100_000 + "]" * 100_000 + "\n", ("TOML",)),
}


@pytest.mark.parametrize("case", sorted(OVERLAYS))
def test_bad_overlay_paths_and_types(overlay_world, case):
    tmp, src, overlay = overlay_world
    fx.write_base(tmp / "base")
    toml = overlay / "overlay.toml"
    edit, fragments = OVERLAYS[case]
    toml.write_text(edit(toml.read_text()))
    before = sorted(p.name for p in tmp.iterdir())
    line = _build_refused(tmp, tmp / "base", src, overlay, *fragments)
    assert str(toml).replace(str(tmp), "<tmp>") in line  # names the file
    assert sorted(p.name for p in tmp.iterdir()) == before  # nothing written beside the build, anywhere


def test_overlay_toml_not_utf8(overlay_world):
    tmp, src, overlay = overlay_world
    fx.write_base(tmp / "base")
    toml = overlay / "overlay.toml"
    toml.write_bytes(toml.read_bytes().replace(b"dflash2-fixture", b"dflash2-\xff"))
    line = _build_refused(tmp, tmp / "base", src, overlay, "UTF-8")
    assert str(toml).replace(str(tmp), "<tmp>") in line
