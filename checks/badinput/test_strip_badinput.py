"""Each bad input: one clear error line, exit 1, nothing written, the source untouched."""

import json
import struct
from pathlib import Path

import pytest

import synth
from clirun import one_error_line

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
    assert expect in one_error_line(proc)
    assert proc.stdout == ""


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("layout", ["flat", "cache"])
def test_bad_input_is_refused_cleanly(tmp_path, run_inproc, case, layout):
    make, expect = CASES[case]
    flat = tmp_path / "model"
    synth.write_model_dir(flat)
    make(flat)
    src = synth.cache_from_dir(flat, tmp_path / "hub") if layout == "cache" else flat
    before = synth.tree_digest(tmp_path)
    proc = run_inproc("strip", src)
    _assert_clean_failure(proc, expect)
    assert synth.tree_digest(tmp_path) == before  # nothing written anywhere, staging included
    _assert_clean_failure(run_inproc("strip", src, "--dry-run", "--json"), expect)


# ---------------------------------------------------------------- hostile values (Hardening II)
#
# Each case: how to spoil a good checkpoint, and what the one error line must name (the file, and the
# key or value at fault). The corpus aims at Python's json and int handling (depth, long integers, NaN,
# encodings, lone surrogates) as well as at each field's type and range.

INDEX = "model.safetensors.index.json"
DEEP = 200_000
U64_MAX = 2**64 - 1


def _write(name: str, content: bytes):
    return lambda flat: (flat / name).write_bytes(content)


def _header_bytes(body: bytes, data_len: int = 16) -> bytes:
    return struct.pack("<Q", len(body)) + body + b"\0" * data_len


def _raw_shard(body: bytes, data_len: int = 16):
    """MIXED gets this header, and the index goes (the shards are found by name), so the header is the
    only fault even where a lax parser would accept it."""
    def make(flat):
        (flat / MIXED).write_bytes(_header_bytes(body, data_len))
        (flat / INDEX).unlink()
    return make


def _entry(dtype="U8", shape=(8,), offsets=(0, 8), **extra) -> dict:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets), **extra}


def _json_text(doc) -> bytes:
    return json.dumps(doc).encode()


def _config(doc_or_bytes):
    data = doc_or_bytes if isinstance(doc_or_bytes, bytes) else json.dumps(doc_or_bytes).encode()
    return _write("config.json", data)


def _layers(value):
    return _config({"architectures": ["X"], "num_hidden_layers": value})


def _index(doc_or_bytes):
    data = doc_or_bytes if isinstance(doc_or_bytes, bytes) else json.dumps(doc_or_bytes).encode()
    return _write(INDEX, data)


def _index_with(**changes):
    def make(flat):
        idx = json.loads((flat / INDEX).read_text())
        idx.update(changes)
        (flat / INDEX).write_text(json.dumps(idx))
    return make


def _splice_index(old: bytes, new: bytes):
    """Edit the index's JSON text directly, for what json.dumps cannot write (duplicates, NaN)."""
    def make(flat):
        raw = json.dumps(json.loads((flat / INDEX).read_text())).encode()
        assert old in raw
        (flat / INDEX).write_bytes(raw.replace(old, new, 1))
    return make


NESTED = b"[" * DEEP + b"]" * DEEP
BIG_INT = b"9" * 5000  # past Python's 4300-digit int conversion limit
HUGE_INT = int("9" * 4000)  # parseable, absurd

HOSTILE = {
    # --- safetensors header
    "header nested 200,000 deep": (_raw_shard(b'{"a": ' + NESTED + b"}"), (MIXED, "nested")),
    "header integer of 5000 digits": (_raw_shard(b'{"a": {"dtype": "U8", "shape": [' + BIG_INT + b'], "data_offsets": [0, 16]}}'),
                                      (MIXED, "digits")),
    "header offset of 4000 digits": (_shard_with({"a": _entry(offsets=(0, HUGE_INT))}, 8), (MIXED, "'a'", "data_offsets")),
    "header offset of 2^64": (_shard_with({"a": _entry(offsets=(0, 2**64))}, 8), (MIXED, "'a'", "data_offsets")),
    "header dim of 4000 digits": (_shard_with({"a": _entry(shape=(HUGE_INT,))}, 8), (MIXED, "'a'", "shape")),
    "header dims whose product overflows u64": (_shard_with({"a": _entry("F32", (2**32, 2**32, 2), (0, 8))}, 8),
                                                 (MIXED, "'a'", "overflow")),
    "header dim of u64 max times 2 bytes": (_shard_with({"a": _entry("F16", (U64_MAX,), (0, 8))}, 8), (MIXED, "'a'", "overflow")),
    "header negative dim": (_shard_with({"a": _entry(shape=(-1,))}, 8), (MIXED, "'a'", "shape", "-1")),
    "header negative offset": (_shard_with({"a": _entry(offsets=(-8, 0))}, 8), (MIXED, "'a'", "data_offsets", "-8")),
    "header NaN in an entry": (_raw_shard(b'{"a": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16], "x": NaN}}'),
                               (MIXED, "NaN")),
    "header Infinity as a dim": (_raw_shard(b'{"a": {"dtype": "U8", "shape": [Infinity], "data_offsets": [0, 16]}}'),
                                 (MIXED, "Infinity")),
    "header 1e999 as an offset": (_raw_shard(b'{"a": {"dtype": "U8", "shape": [16], "data_offsets": [0, 1e999]}}'),
                                  (MIXED, "1e999")),
    "header float dim": (_shard_with({"a": _entry(shape=(8.0,))}, 8), (MIXED, "'a'", "shape", "8.0")),
    "header boolean offsets": (_shard_with({"a": _entry(offsets=(False, True))}, 1), (MIXED, "'a'", "data_offsets")),
    "header three offsets": (_shard_with({"a": _entry(offsets=(0, 4, 8))}, 8), (MIXED, "'a'", "data_offsets")),
    "header shape is an object": (_shard_with({"a": _entry(shape={"0": 8})}, 8), (MIXED, "'a'", "shape")),
    "header __metadata__ with a number": (_shard_with({"__metadata__": {"format": "pt", "n": 1}, "a": _entry()}, 8),
                                          (MIXED, "__metadata__", "'n'")),
    "header __metadata__ with an object": (_shard_with({"__metadata__": {"nested": {"x": "y"}}, "a": _entry()}, 8),
                                           (MIXED, "__metadata__", "'nested'")),
    "header __metadata__ is an array": (_shard_with({"__metadata__": ["format", "pt"], "a": _entry()}, 8),
                                        (MIXED, "__metadata__")),
    "header dtype is an array": (_shard_with({"a": _entry(dtype=["U8"])}, 8), (MIXED, "'a'", "dtype")),
    "header dtype missing": (_shard_with({"a": {"shape": [8], "data_offsets": [0, 8]}}, 8), (MIXED, "'a'", "dtype")),
    "header entry is a number": (_shard_with({"a": 7}, 0), (MIXED, "'a'")),
    "header is an array": (_raw_shard(b"[]", 0), (MIXED, "object")),
    "header is null": (_raw_shard(b"null", 0), (MIXED, "object")),
    "header of only spaces": (_raw_shard(b" " * 8, 0), (MIXED,)),
    "header not UTF-8": (_raw_shard(b'{"a\xff": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]}}'), (MIXED, "UTF-8")),
    "header starts with a BOM": (_raw_shard(b'\xef\xbb\xbf{"a": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]}}'),
                                 (MIXED, "BOM")),
    "header tensor name with a lone surrogate": (_raw_shard(b'{"model.norm\\ud800": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}, '
                                                            b'"model.layers.3.w": {"dtype": "U8", "shape": [8], "data_offsets": [8, 16]}}'),
                                                 (MIXED, "surrogate")),
    "header key twice inside an entry": (_raw_shard(b'{"a": {"dtype": "U8", "dtype": "F32", "shape": [16], "data_offsets": [0, 16]}}'),
                                         (MIXED, "'dtype'", "twice")),
    "header length of u64 max": (_write(MIXED, struct.pack("<Q", U64_MAX) + b"{}"), (MIXED,)),
    "empty shard file": (_write(MIXED, b""), (MIXED, "shorter than")),
    "F4 tensor that ends mid-byte": (_shard_with({"a": _entry("F4", (3,), (0, 2))}, 2), (MIXED, "'a'", "byte")),
    "F6 tensor that ends mid-byte": (_shard_with({"a": _entry("F6_E2M3", (3,), (0, 3))}, 3), (MIXED, "'a'", "byte")),
    "megabyte tensor name with a bad dtype": (_shard_with({"x" * 1_000_000: _entry(dtype="Q9")}, 8), (MIXED, "dtype")),
    # --- config.json
    "config nested 200,000 deep": (_config(b'{"a": ' + NESTED + b"}"), ("config.json", "nested")),
    "config integer of 5000 digits": (_config(b'{"num_hidden_layers": 3, "vocab_size": ' + BIG_INT + b"}"),
                                      ("config.json", "digits")),
    "config num_hidden_layers of 4000 digits": (_layers(HUGE_INT), ("config.json", "num_hidden_layers")),
    "config num_hidden_layers 0": (_layers(0), ("config.json", "num_hidden_layers", "0")),
    "config num_hidden_layers negative": (_layers(-3), ("config.json", "num_hidden_layers", "-3")),
    "config num_hidden_layers a string": (_layers("3"), ("config.json", "num_hidden_layers", "'3'")),
    "config num_hidden_layers a float": (_layers(3.0), ("config.json", "num_hidden_layers", "3.0")),
    "config num_hidden_layers true": (_layers(True), ("config.json", "num_hidden_layers", "true")),
    "config num_hidden_layers a billion": (_layers(10**9), ("config.json", "num_hidden_layers", "1000000000")),
    "config text_config is an array": (_config({"num_hidden_layers": 3, "text_config": [{"num_hidden_layers": 3}]}),
                                       ("config.json", "text_config")),
    "config text_config is a string": (_config({"num_hidden_layers": 3, "text_config": "llama"}), ("config.json", "text_config")),
    "config text_config num_hidden_layers of 4000 digits": (_config({"text_config": {"num_hidden_layers": HUGE_INT}}),
                                                            ("config.json", "text_config", "num_hidden_layers")),
    "config is an array": (_config([{"num_hidden_layers": 3}]), ("config.json", "object")),
    "config is null": (_config(b"null"), ("config.json", "object")),
    "index is null": (_index(b"null"), (INDEX, "object")),
    "config empty": (_config(b""), ("config.json",)),
    "config not UTF-8": (_config(b'{"num_hidden_layers": 3, "name": "caf\xe9"}'), ("config.json", "UTF-8")),
    "config in UTF-16": (_config('{"num_hidden_layers": 3}'.encode("utf-16")), ("config.json", "UTF-8")),
    "config starts with a BOM": (_config(b'\xef\xbb\xbf{"num_hidden_layers": 3}'), ("config.json", "BOM")),
    "config NaN": (_config(b'{"num_hidden_layers": 3, "rope_theta": NaN}'), ("config.json", "NaN")),
    "config -Infinity": (_config(b'{"num_hidden_layers": 3, "rope_theta": -Infinity}'), ("config.json", "Infinity")),
    "config 1e999": (_config(b'{"num_hidden_layers": 3, "rope_theta": 1e999}'), ("config.json", "1e999")),
    "config num_hidden_layers twice": (_config(b'{"num_hidden_layers": 3, "num_hidden_layers": 50}'),
                                       ("config.json", "num_hidden_layers", "twice")),
    "config lone surrogate": (_config(b'{"num_hidden_layers": 3, "name": "\\ud800"}'), ("config.json", "surrogate")),
    # --- model.safetensors.index.json
    "index nested 200,000 deep": (_index(b'{"weight_map": {}, "a": ' + NESTED + b"}"), (INDEX, "nested")),
    "index integer of 5000 digits": (_splice_index(b'"total_size": ', b'"total_size": ' + BIG_INT + b', "was": '),
                                     (INDEX, "digits")),
    "index weight_map is an array": (_index_with(weight_map=[["model.norm.weight", MIXED]]), (INDEX, "weight_map")),
    "index weight_map is a string": (_index_with(weight_map=MIXED), (INDEX, "weight_map")),
    "index weight_map missing": (_index({"metadata": {}}), (INDEX, "weight_map")),
    "index weight_map value a number": (_index_edit(lambda wm: wm.update({"model.norm.weight": 2})),
                                        (INDEX, "weight_map", "'model.norm.weight'")),
    "index weight_map value null": (_index_edit(lambda wm: wm.update({"model.norm.weight": None})),
                                    (INDEX, "weight_map", "'model.norm.weight'")),
    "index weight_map value an array": (_index_edit(lambda wm: wm.update({"model.norm.weight": [MIXED]})),
                                        (INDEX, "weight_map", "'model.norm.weight'")),
    "index weight_map value empty": (_index_edit(lambda wm: wm.update({"model.norm.weight": ""})),
                                     (INDEX, "weight_map", "'model.norm.weight'")),
    "index weight_map names config.json": (_index_edit(lambda wm: wm.update({"model.norm.weight": "config.json"})),
                                           ("config.json", "safetensors")),
    "index weight_map key twice": (_splice_index(b'"model.norm.weight": ', b'"model.norm.weight": "model-00001-of-00003.safetensors", "model.norm.weight": '),
                                   (INDEX, "'model.norm.weight'", "twice")),
    "index metadata is an array": (_index_with(metadata=["total_size"]), (INDEX, "metadata")),
    "index metadata is a string": (_index_with(metadata="big"), (INDEX, "metadata")),
    "index metadata is a number": (_index_with(metadata=5), (INDEX, "metadata")),
    "index is an array": (_index([{"weight_map": {}}]), (INDEX, "object")),
    "index NaN": (_splice_index(b'"total_size": ', b'"total_size": NaN, "was": '), (INDEX, "NaN")),
    "index empty": (_index(b""), (INDEX,)),
    "index not UTF-8": (_splice_index(b'"metadata": {', b'"metadata": {"caf\xe9": 1, '), (INDEX, "UTF-8")),
    "index in UTF-16": (lambda flat: (flat / INDEX).write_bytes((flat / INDEX).read_text().encode("utf-16")), (INDEX, "UTF-8")),
    "index lone surrogate in a tensor name": (_index_edit(lambda wm: wm.update({"model.norm.weight\ud800": MIXED})),
                                              (INDEX, "surrogate")),
}


def _assert_one_line_naming(proc, expects: tuple[str, ...]):
    line = one_error_line(proc)
    assert len(line) < 1000, f"not a clear line: {len(line)} chars"
    for text in expects:
        assert text.lower() in line.lower(), f"{text!r} not in {line!r}"
    assert proc.stdout == ""


@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize("layout", ["flat", "cache"])
def test_hostile_value_gets_one_clear_line(tmp_path, run_inproc, case, layout):
    make, expects = HOSTILE[case]
    flat = tmp_path / "model"
    synth.write_model_dir(flat)
    make(flat)
    src = synth.cache_from_dir(flat, tmp_path / "hub") if layout == "cache" else flat
    before = synth.tree_digest(tmp_path)
    _assert_one_line_naming(run_inproc("strip", src), expects)
    assert synth.tree_digest(tmp_path) == before  # nothing written anywhere, staging and lock file included


@pytest.mark.parametrize("what", ["empty dir", "missing", "a file", "entry without refs", "refs/main escapes"])
def test_src_that_is_not_a_model(tmp_path, run_inproc, what):
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
    proc = run_inproc("strip", src)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("sparkstack: error: ") and "Traceback" not in proc.stderr
    assert synth.tree_digest(tmp_path) == before


def test_out_inside_source_is_refused(tmp_path, run_inproc):
    flat = tmp_path / "model"
    synth.write_model_dir(flat)
    before = synth.tree_digest(flat)
    _assert_clean_failure(run_inproc("strip", flat, "--out", flat / "sub"), "overlap")
    _assert_clean_failure(run_inproc("strip", flat, "--out", flat), "overlap")
    assert synth.tree_digest(flat) == before


def test_config_without_layer_info_falls_back_to_45_with_warning(tmp_path, run_inproc):
    import torch
    shards = {"model.safetensors": [
        synth.Spec("model.layers.44.w", torch.float32, (2,), False),
        synth.Spec("model.layers.45.w", torch.float32, (2,), True),
        synth.Spec("model.layers.3.w", torch.float32, (2,), False),
    ]}
    flat = tmp_path / "model"
    synth.write_model_dir(flat, shards=shards, config={"architectures": ["X"]}, index=False)
    proc = run_inproc("strip", flat, check=0)
    assert "sparkstack: warning:" in proc.stderr and "45" in proc.stderr
    from safetensors.torch import load_file
    assert set(load_file(str(tmp_path / "model-no-MTP" / "model.safetensors"))) == {"model.layers.44.w", "model.layers.3.w"}


def test_usage_error_exits_2(run_inproc):
    proc = run_inproc("strip")
    assert proc.returncode == 2
