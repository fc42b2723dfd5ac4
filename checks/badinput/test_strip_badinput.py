"""Each bad input: one clear error line, exit 1, nothing written, the source untouched."""

import json
import struct
from pathlib import Path

import pytest

import synth

MIXED = "model-00002-of-00003.safetensors"


def _raw_header(doc: dict, data: bytes) -> bytes:
    body = json.dumps(doc).encode()
    return struct.pack("<Q", len(body)) + body + data


def _corrupt_shard(flat: Path, content: bytes) -> None:
    (flat / MIXED).write_bytes(content)


def _truncated(flat):
    raw = (flat / MIXED).read_bytes()
    _corrupt_shard(flat, raw[: len(raw) - 20])


def _tiny(flat):
    _corrupt_shard(flat, b"\x10\x00\x00")


def _header_past_end(flat):
    _corrupt_shard(flat, struct.pack("<Q", 1 << 20) + b"{}")


def _not_json(flat):
    body = b"{not json at all"
    _corrupt_shard(flat, struct.pack("<Q", len(body)) + body)


def _shard_with(entries: dict, data_len: int):
    def make(flat):
        _corrupt_shard(flat, _raw_header(entries, b"\0" * data_len))
        # Keep the index consistent with the shard, so only the offsets are wrong.
        idx = json.loads((flat / "model.safetensors.index.json").read_text())
        idx["weight_map"] = {k: v for k, v in idx["weight_map"].items() if v != MIXED}
        idx["weight_map"].update({k: MIXED for k in entries})
        (flat / "model.safetensors.index.json").write_text(json.dumps(idx))
    return make


def _u8(a, b):
    return {"dtype": "U8", "shape": [b - a], "data_offsets": [a, b]}


def _index_edit(fn):
    def make(flat):
        idx = json.loads((flat / "model.safetensors.index.json").read_text())
        fn(idx["weight_map"])
        (flat / "model.safetensors.index.json").write_text(json.dumps(idx))
    return make


def _duplicate_name(flat):
    body = (b'{"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},'
            b' "a": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}}')
    _corrupt_shard(flat, struct.pack("<Q", len(body)) + body + bytes(8))


CASES = {
    "duplicate tensor name": (_duplicate_name, "appears twice"),
    "truncated file": (_truncated, "past the"),
    "shorter than the length prefix": (_tiny, "shorter than"),
    "header length beyond file size": (_header_past_end, "runs past the end"),
    "header not JSON": (_not_json, "not JSON"),
    "overlapping offsets": (_shard_with({"a": _u8(0, 8), "b": _u8(4, 12)}, 12), "overlaps"),
    "offsets out of bounds": (_shard_with({"a": _u8(0, 8), "b": _u8(8, 64)}, 16), "past the"),
    "offsets leave a gap": (_shard_with({"a": _u8(0, 8), "b": _u8(16, 24)}, 24), "gap"),
    "offsets do not cover the data": (_shard_with({"a": _u8(0, 8)}, 16), "not covered"),
    "index names a missing shard": (_index_edit(lambda wm: wm.update({"model.norm.weight": "model-00009-of-00009.safetensors"})), "not in"),
    "weight_map with ../": (_index_edit(lambda wm: wm.update({"model.norm.weight": "../outside.safetensors"})), "outside the model dir"),
    "weight_map with absolute path": (_index_edit(lambda wm: wm.update({"model.norm.weight": "/etc/passwd"})), "outside the model dir"),
    "index maps a tensor the shard lacks": (_index_edit(lambda wm: wm.update({"model.ghost.weight": MIXED})), "no such tensor"),
    "config not JSON": (lambda flat: (flat / "config.json").write_text("{oops"), "not valid JSON"),
    "bad dtype": (_shard_with({"a": {"dtype": "Q7", "shape": [8], "data_offsets": [0, 8]}}, 8), "unknown dtype"),
    "size disagrees with shape": (_shard_with({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, 8), "needs 12"),
}


def _assert_clean_failure(proc, expect: str):
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("sparkstack: error: ")
    assert expect in lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("layout", ["flat", "cache"])
def test_bad_input_is_refused_cleanly(tmp_path, run_cli, case, layout):
    make, expect = CASES[case]
    flat = tmp_path / "model"
    synth.write_model_dir(flat)
    make(flat)
    src = synth.cache_from_dir(flat, tmp_path / "hub") if layout == "cache" else flat
    before = synth.tree_digest(tmp_path)
    proc = run_cli("strip", src)
    _assert_clean_failure(proc, expect)
    assert synth.tree_digest(tmp_path) == before  # nothing written anywhere, staging included
    _assert_clean_failure(run_cli("strip", src, "--dry-run", "--json"), expect)


@pytest.mark.parametrize("what", ["empty dir", "missing", "a file", "entry without refs", "refs/main escapes"])
def test_src_that_is_not_a_model(tmp_path, run_cli, what):
    src = tmp_path / "x"
    if what == "empty dir":
        src.mkdir()
    elif what == "a file":
        src.write_text("hi")
    elif what == "entry without refs":
        src = tmp_path / "models--a--b"
        (src / "snapshots").mkdir(parents=True)
    elif what == "refs/main escapes":
        flat = tmp_path / "model"
        synth.write_model_dir(flat)
        src = synth.cache_from_dir(flat, tmp_path / "hub")
        (src / "refs" / "main").write_text("../../../model")
    before = synth.tree_digest(tmp_path)
    proc = run_cli("strip", src)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("sparkstack: error: ") and "Traceback" not in proc.stderr
    assert synth.tree_digest(tmp_path) == before


def test_out_inside_source_is_refused(tmp_path, run_cli):
    flat = tmp_path / "model"
    synth.write_model_dir(flat)
    before = synth.tree_digest(flat)
    _assert_clean_failure(run_cli("strip", flat, "--out", flat / "sub"), "overlap")
    _assert_clean_failure(run_cli("strip", flat, "--out", flat), "overlap")
    assert synth.tree_digest(flat) == before


def test_config_without_layer_info_falls_back_to_45_with_warning(tmp_path, run_cli):
    import torch
    shards = {"model.safetensors": [
        synth.Spec("model.layers.44.w", torch.float32, (2,), False),
        synth.Spec("model.layers.45.w", torch.float32, (2,), True),
        synth.Spec("model.layers.3.w", torch.float32, (2,), False),
    ]}
    flat = tmp_path / "model"
    synth.write_model_dir(flat, shards=shards, config={"architectures": ["X"]}, index=False)
    proc = run_cli("strip", flat, check=0)
    assert "sparkstack: warning:" in proc.stderr and "45" in proc.stderr
    from safetensors.torch import load_file
    assert set(load_file(str(tmp_path / "model-no-MTP" / "model.safetensors"))) == {"model.layers.44.w", "model.layers.3.w"}


def test_usage_error_exits_2(run_cli):
    proc = run_cli("strip")
    assert proc.returncode == 2
