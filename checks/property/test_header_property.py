"""Property tests of the safetensors header code, judged against the real safetensors library."""

import json
import math
import struct

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from safetensors import deserialize, safe_open

from sparkstack.errors import SparkstackError
from sparkstack.safetensors_header import TensorEntry, encode_header, parse_header
from sparkstack.strip.mtp import MTP_COMPONENTS, is_mtp_key

# dtypes torch (the "pt" framework) can hand back, with their element sizes.
DTYPES = {"U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "BOOL": 1, "BF16": 2, "F16": 2, "I16": 2,
          "F32": 4, "I32": 4, "F64": 8, "I64": 8,
          "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1, "F8_E8M0": 1, "U16": 2, "U32": 4, "U64": 8, "C64": 8}
# Sub-byte dtypes, in bits per element (the safetensors spec); torch cannot hand most of them back.
SUB_BYTE = {"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._", min_size=1, max_size=24).filter(lambda s: s != "__metadata__")
shapes = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)
tensor_lists = st.lists(st.tuples(names, st.sampled_from(sorted(DTYPES)), shapes), max_size=8, unique_by=lambda t: t[0])
metadata = st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3).map(lambda d: tuple(d.items()))

settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
settings.load_profile("ci")


def _entries(spec):
    return tuple(TensorEntry(n, d, s, 0, math.prod(s) * DTYPES[d]) for n, d, s in spec)


def _library_accepts(path) -> bool:
    try:
        with safe_open(str(path), "pt") as f:
            for k in f.keys():
                f.get_slice(k)
        return True
    except Exception:
        return False


@given(spec=tensor_lists, meta=metadata, data=st.data())
def test_encoded_headers_round_trip_and_load(tmp_path, spec, meta, data):
    entries = _entries(spec)
    prefix, laid_out = encode_header(meta, entries)
    payload = data.draw(st.binary(min_size=sum(e.nbytes for e in entries), max_size=sum(e.nbytes for e in entries)))
    path = tmp_path / "t.safetensors"
    path.write_bytes(prefix + payload)

    assert (8 + len(prefix[8:])) % 8 == 0
    parsed = parse_header(prefix[8:], len(prefix) + len(payload))
    assert {(t.name, t.dtype, t.shape, t.nbytes) for t in parsed.tensors} == {(n, d, s, math.prod(s) * DTYPES[d]) for n, d, s in spec}
    assert parsed.tensors == tuple(sorted(laid_out, key=lambda t: (t.begin, t.end)))
    assert dict(parsed.metadata) == dict(meta)

    with safe_open(str(path), "pt") as f:
        assert set(f.keys()) == {n for n, _, _ in spec}
        for t in laid_out:
            tensor = f.get_tensor(t.name)
            assert list(tensor.shape) == list(t.shape)
            raw = tensor.reshape(-1).view(__import__("torch").uint8).numpy().tobytes() if tensor.numel() else b""
            assert raw == payload[t.begin : t.end]


@given(spec=tensor_lists, data=st.data())
def test_validator_agrees_with_the_library(tmp_path, spec, data):
    """A valid layout, sometimes nudged (an offset, the data length): we accept exactly what safetensors accepts."""
    _, laid_out = encode_header((), _entries(spec))
    doc = {t.name: {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [t.begin, t.end]} for t in laid_out}
    data_len = sum(t.nbytes for t in laid_out)
    if laid_out and data.draw(st.booleans()):
        victim = data.draw(st.sampled_from(sorted(doc)))
        side = data.draw(st.integers(0, 1))
        doc[victim]["data_offsets"][side] = max(0, doc[victim]["data_offsets"][side] + data.draw(st.integers(-9, 9)))
    data_len = max(0, data_len + data.draw(st.sampled_from([0, 0, 0, -1, 1, 8])))
    body = json.dumps(doc).encode()
    path = tmp_path / "r.safetensors"
    path.write_bytes(struct.pack("<Q", len(body)) + body + b"\x01" * data_len)
    try:
        parse_header(body, 8 + len(body) + data_len)
        ours = True
    except SparkstackError:
        ours = False
    event("accepted" if ours else "refused")
    assert ours == _library_accepts(path), doc


@given(blob=st.binary(max_size=200))
def test_garbage_never_escapes_as_another_exception(blob):
    try:
        parse_header(blob, len(blob) + 8 + 16)
    except SparkstackError:
        pass


@pytest.mark.parametrize("body", [b"[]", b'{"a": 1}', b'{"__metadata__": {"a": 1}}', b'{"a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}}',
                                  b'{"a": {"dtype": ["U8"], "shape": [0], "data_offsets": [0, 0]}}',
                                  b'{"a": {"dtype": {"x": 1}, "shape": [0], "data_offsets": [0, 0]}}',
                                  b'{"a": {"dtype": "U8", "shape": [18446744073709551616], "data_offsets": [0, 0]}}',
                                  b'{"a": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0], "b": NaN}}',
                                  b"[" * 100_000 + b"]" * 100_000, b'{"a": ' + b"7" * 5000 + b"}"])
def test_structural_errors_are_sparkstack_errors(body):
    with pytest.raises(SparkstackError):
        parse_header(body, 8 + len(body))


# ---------------------------------------------------------------- agreement on sizes, sub-byte dtypes included

big_dims = st.one_of(st.integers(0, 9), st.sampled_from([2**31, 2**32, 2**33, 2**62, 2**63, 2**64 - 1]))


@given(dtype=st.sampled_from(sorted({**DTYPES, **SUB_BYTE})), shape=st.lists(big_dims, max_size=4),
       nbytes=st.integers(0, 40), data=st.data())
def test_size_rules_agree_with_the_library(dtype, shape, nbytes, data):
    """Whole bytes for sub-byte dtypes, u64 overflow (folded in order, as the reference does), exact span."""
    bits = SUB_BYTE.get(dtype) or 8 * DTYPES[dtype]
    numel = math.prod(shape)
    if numel * bits <= 8 * 40 and data.draw(st.booleans()):
        nbytes = -(-numel * bits // 8)  # often the right span, so acceptance is exercised too
    body = json.dumps({"t": {"dtype": dtype, "shape": shape, "data_offsets": [0, nbytes]}}).encode()
    raw = struct.pack("<Q", len(body)) + body + b"\x01" * nbytes
    try:
        parse_header(body, len(raw))
        ours = True
    except SparkstackError:
        ours = False
    try:
        deserialize(raw)
        theirs = True
    except Exception:
        theirs = False
    event("accepted" if ours else "refused")
    assert ours == theirs, (dtype, shape, nbytes)


# ---------------------------------------------------------------- hostile JSON

hostile_tokens = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "9" * 4301, "-" + "9" * 5000,
                                  '"\\ud800"', '"\\udfff x"', "18446744073709551616", "[" * 3000 + "]" * 3000,
                                  '{"a": 1, "a": 2}', "true", "null", "0.5", '"U8"'])
json_values = st.recursive(
    hostile_tokens | st.integers(-2, 2**65).map(str) | st.text(max_size=6).map(json.dumps),
    lambda inner: st.lists(inner, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]")
    | st.lists(st.tuples(st.sampled_from(['"dtype"', '"shape"', '"data_offsets"', '"__metadata__"', '"a"']), inner),
               max_size=4).map(lambda kvs: "{" + ", ".join(f"{k}: {v}" for k, v in kvs) + "}"),
    max_leaves=12)


@given(text=json_values, prefix=st.sampled_from(["", "\ufeff", " "]), encoding=st.sampled_from(["utf-8", "utf-16", "latin-1"]))
def test_hostile_json_is_refused_as_a_sparkstack_error(text, prefix, encoding):
    try:
        body = (prefix + text).encode(encoding)
    except UnicodeEncodeError:
        body = (prefix + text).encode("utf-8", errors="surrogatepass")
    try:
        parse_header(body, 8 + len(body) + 16)
    except SparkstackError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 1000


# ---------------------------------------------------------------- MTP rule scope

TEXT_STACK = ["model.layers.", "model.language_model.layers.", "language_model.model.layers."]
OTHER = ["model.visual.encoder.layers.", "model.vision_tower.layers.", "vision_model.encoder.layers.",
         "model.visual.layers.", "x.model.layers.", "model.mm_projector.layers.", "layers."]
tails = st.lists(st.sampled_from(["w", "weight", "mlp", "mtp_proj", "nextn_gate", "mtp", "nextn", "shared_head",
                                  "mtp_layers", "experts", "0"]), min_size=1, max_size=3)


@given(prefix=st.sampled_from(TEXT_STACK + OTHER), index=st.integers(0, 200), tail=tails, layers=st.integers(1, 100))
def test_numeric_rule_only_in_the_text_stack(prefix, index, tail, layers):
    key = f"{prefix}{index}." + ".".join(tail)
    by_name = any(part in MTP_COMPONENTS for part in key.split("."))
    by_number = prefix in TEXT_STACK and index >= layers
    assert is_mtp_key(key, layers) == (by_name or by_number)
