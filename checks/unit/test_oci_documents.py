"""The OCI document validators and the cache identity rule, on documents written out by hand."""

import os
import re
from types import SimpleNamespace

import pytest

from sparkstack.errors import SparkstackError
from sparkstack.oci.documents import (
    check_digest, check_layout_marker, check_size, config_parts, docker_entries, index_entries, manifest_parts,
    parse_json,
)
from sparkstack.oci.model import BlobIdentity, same_blob_file

D = "sha256:" + "ab" * 32
LAYER = {"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "digest": D, "size": 3}
MANIFEST = {"schemaVersion": 2, "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": D,
                                           "size": 7}, "layers": [LAYER]}
CONFIG = {"os": "linux", "architecture": "arm64", "variant": "v8", "rootfs": {"type": "layers", "diff_ids": [D]}}


def test_a_good_manifest_and_config():
    config, layers = manifest_parts(MANIFEST, "m")
    assert (config.digest, config.size) == (D, 7)
    assert [(l.media_type, l.size) for l in layers] == [("application/vnd.oci.image.layer.v1.tar+gzip", 3)]
    assert config_parts(CONFIG, "c", 1) == ("linux/arm64/v8", (D,))


@pytest.mark.parametrize("value", [D.upper(), "sha512:" + "ab" * 64, D[:-1], D + "a", D + "\n", 5, None, "ab" * 32])
def test_digest_refused(value):
    with pytest.raises(SparkstackError, match=r"^f: k: "):
        check_digest(value, "f", "k")


@pytest.mark.parametrize("value", [-1, True, False, 1.0, "3", 2**63, 10**30, None])
def test_size_refused(value):
    with pytest.raises(SparkstackError, match=r"^f: k: "):
        check_size(value, "f", "k")


@pytest.mark.parametrize("value", [0, 1, 2**63 - 1])
def test_size_accepted(value):
    assert check_size(value, "f", "k") == value


@pytest.mark.parametrize("data, why", [
    (b"\xff{}", "UTF-8"), ('{"a": 1}'.encode("utf-16"), "UTF-8"), (b"[" * 50_000 + b"]" * 50_000, "deep"),
    (b'{"a": ' + b"9" * 5000 + b"}", "integer"), (b'{"a": NaN}', "NaN"), (b'{"a": -Infinity}', "Infinity"),
    (b'{"a": 1e999}', "1e999"), (b'{"a": "\\udc80"}', "surrogate"), (b"\xef\xbb\xbf{}", "not JSON"),
])
def test_parse_json_refuses(data, why):
    with pytest.raises(SparkstackError, match=f"^doc: .*{why}"):
        parse_json(data, "doc")


def test_parse_json_keeps_paired_surrogates():
    assert parse_json(b'{"a": "\\ud83d\\ude00"}', "doc") == {"a": "\U0001F600"}


@pytest.mark.parametrize("doc, key", [
    ({**MANIFEST, "layers": [dict(LAYER, mediaType="text/plain")]}, "layers[0].mediaType"),
    ({**MANIFEST, "schemaVersion": 1}, "schemaVersion"),
    ({**MANIFEST, "schemaVersion": True}, "schemaVersion"),
    ({**MANIFEST, "mediaType": "application/vnd.oci.image.index.v1+json"}, "mediaType"),
    ({k: v for k, v in MANIFEST.items() if k != "layers"}, "layers"),
    ({**MANIFEST, "config": [D]}, "config"),
])
def test_manifest_refused(doc, key):
    with pytest.raises(SparkstackError, match=f"^m: {re.escape(key)}"):
        manifest_parts(doc, "m")


@pytest.mark.parametrize("doc, key", [
    ({**CONFIG, "os": "linux/evil"}, "os"),
    ({**CONFIG, "variant": 8}, "variant"),
    ({**CONFIG, "rootfs": []}, "rootfs"),
    ({**CONFIG, "rootfs": {"diff_ids": [D, D]}}, "rootfs.diff_ids"),
    ({**CONFIG, "config": {"Labels": ["a"]}}, "config.Labels"),
    ({**CONFIG, "history": {}}, "history"),
])
def test_config_refused(doc, key):
    with pytest.raises(SparkstackError, match=f"^c: {re.escape(key)}"):
        config_parts(doc, "c", 1)


def test_index_platforms_and_refusals():
    entry = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": D, "size": 1,
             "platform": {"os": "linux", "architecture": "amd64"}}
    assert index_entries({"manifests": [entry]}, "i")[0].platform == "linux/amd64"
    for doc, key in [({"manifests": []}, "manifests"), ({"manifests": {}}, "manifests"),
                     ({"manifests": [dict(entry, platform={"os": "linux"})]}, "manifests[0].platform.architecture")]:
        with pytest.raises(SparkstackError, match=f"^i: {re.escape(key)}"):
            index_entries(doc, "i")


def test_docker_entries_normalise_and_refuse_climbing():
    assert docker_entries([{"Config": "./a/../c.json", "Layers": ["l/layer.tar"]}], "m") == (("c.json", ("l/layer.tar",)),)
    for name in ("../x", "/etc/passwd", ".", ""):
        with pytest.raises(SparkstackError, match=r"^m: \[0\]\.Config"):
            docker_entries([{"Config": name, "Layers": []}], "m")


@pytest.mark.parametrize("doc", [{}, [], {"imageLayoutVersion": "1.0"}, {"imageLayoutVersion": 1}])
def test_layout_marker_refused(doc):
    with pytest.raises(SparkstackError, match="^o"):
        check_layout_marker(doc, "o")


def _ident(**kw) -> BlobIdentity:
    st = SimpleNamespace(st_dev=1, st_ino=2, st_size=100, st_mtime_ns=5, st_ctime_ns=6, st_nlink=1)
    for k, v in kw.items():
        setattr(st, k, v)
    return BlobIdentity.of(st, 0, 100)


def test_same_blob_file_rule():
    saved = _ident()
    assert same_blob_file(saved, _ident())
    for change in [dict(st_dev=9), dict(st_ino=9), dict(st_size=101), dict(st_mtime_ns=9), dict(st_ctime_ns=9)]:
        assert not same_blob_file(saved, _ident(**change)), change
    # a hardlink made (image build links base blobs into its output) moves ctime and the link count only
    assert same_blob_file(saved, _ident(st_ctime_ns=9, st_nlink=2))
    assert not same_blob_file(saved, _ident(st_ctime_ns=9, st_nlink=2, st_mtime_ns=7))


def test_identity_of_a_real_hardlink(tmp_path):
    """The rule, against what the kernel really does on link() and on an in-place write."""
    p = tmp_path / "blob"
    p.write_bytes(b"x" * 100)
    saved = BlobIdentity.of(os.stat(p), 0, 100)
    os.link(p, tmp_path / "linked")
    assert same_blob_file(saved, BlobIdentity.of(os.stat(p), 0, 100))
    before = os.stat(p)
    with open(p, "r+b") as f:
        f.write(b"y")
    os.utime(p, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert not same_blob_file(BlobIdentity.of(before, 0, 100), BlobIdentity.of(os.stat(p), 0, 100))
