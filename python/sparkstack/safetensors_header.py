"""safetensors headers: read, validate and write them without touching tensor data.

Layout: u64 little-endian header length N, N bytes of JSON, then the data. Each
entry's data_offsets are relative to the start of the data, and together they
must tile it exactly: no gap, no overlap, nothing past the end.
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass
from typing import Any

from sparkstack.errors import SparkstackError
from sparkstack.text import quoted

# Bits per element: every dtype of the reference implementation (safetensors 0.8's Dtype enum).
# Sub-byte types pack; like the reference, a tensor must fill a whole number of bytes.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}

# The reference implementation refuses headers above 100 MB; so do we, before allocating.
MAX_HEADER_BYTES = 100_000_000
METADATA_KEY = "__metadata__"
# Offsets and dims are u64 in the format, and the reference refuses a size that overflows one.
U64_MAX = 2**64 - 1
# serde_json's recursion limit: no JSON file a Rust reader accepts nests deeper.
MAX_JSON_DEPTH = 128
# Python refuses to convert longer integers (and to print them); refuse them first, with a clear reason.
MAX_INT_DIGITS = 4300


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # relative to the start of the data section
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class ShardHeader:
    """One safetensors file's header, with tensors in data-offset order."""

    path: str
    header_len: int
    file_size: int
    metadata: tuple[tuple[str, str], ...]
    tensors: tuple[TensorEntry, ...]

    @property
    def data_start(self) -> int:
        return 8 + self.header_len

    @property
    def data_size(self) -> int:
        return self.file_size - self.data_start


def _bad(path: str, why: str) -> SparkstackError:
    return SparkstackError(f"{path}: not a valid safetensors file: {why}")


def read_header(path: str | os.PathLike, shown: str | None = None) -> ShardHeader:
    """Read and fully validate the header of one safetensors file. Errors name it `shown` (default: `path`);
    a cache blob is better named by the snapshot file the user knows."""
    shown = str(path) if shown is None else shown
    try:
        with open(path, "rb") as f:
            file_size = os.fstat(f.fileno()).st_size
            prefix = f.read(8)
            if len(prefix) < 8:
                raise _bad(shown, f"file is {file_size} bytes, shorter than the 8-byte length prefix")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > MAX_HEADER_BYTES:
                raise _bad(shown, f"header length {header_len} exceeds the {MAX_HEADER_BYTES}-byte limit")
            if 8 + header_len > file_size:
                raise _bad(shown, f"header length {header_len} runs past the end of the {file_size}-byte file")
            raw = f.read(header_len)
    except OSError as exc:
        raise SparkstackError(f"{shown}: cannot read: {exc.strerror or exc}") from None
    return parse_header(raw, file_size, shown)


class JsonRefused(ValueError):
    """JSON that strict_json refuses; str() is a one-line reason."""


def strict_json(raw: bytes) -> Any:
    """Parse JSON no more leniently than serde_json, the reference safetensors reader (and tokenizers):
    UTF-8 without a byte-order mark, no NaN or Infinity, no duplicate keys, nesting and integers bounded.

    Python's own json is laxer on each count, and some lax inputs crash it (RecursionError,
    ValueError on long integers). Raises JsonRefused with a one-line reason.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JsonRefused(f"not UTF-8 (byte {raw[exc.start]:#04x} at offset {exc.start})") from None
    if text.startswith("\ufeff"):
        raise JsonRefused("starts with a byte-order mark (BOM); JSON must be plain UTF-8")
    try:
        doc = json.loads(text, object_pairs_hook=_refuse_duplicates, parse_constant=_refuse_constant,
                         parse_float=_finite_float, parse_int=_bounded_int)
    except json.JSONDecodeError as exc:
        raise JsonRefused(str(exc)) from None
    except RecursionError:
        raise JsonRefused(f"nested more than {MAX_JSON_DEPTH} levels deep") from None
    _check_tree(doc)
    return doc


def _refuse_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise JsonRefused(f"key {quoted(key)} appears twice in one object")
            seen.add(key)
    return doc


def _refuse_constant(name: str) -> float:
    raise JsonRefused(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise JsonRefused(f"number {quoted(text)} is out of range")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise JsonRefused(f"an integer of {len(text.lstrip('-'))} digits (more than {MAX_INT_DIGITS})")
    return int(text)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_tree(doc: object) -> None:
    """Depth within MAX_JSON_DEPTH, and no string holding a lone surrogate (a `\\ud800` escape), which
    serde_json refuses and no UTF-8 writer can write back. Iterative, so depth cannot exhaust the stack."""
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            if _LONE_SURROGATE.search(node):
                raise JsonRefused(f"string {quoted(node)} holds a lone surrogate escape, which is not Unicode")
            continue
        if isinstance(node, dict):
            stack.extend((key, depth) for key in node)
            node = list(node.values())
        elif not isinstance(node, list):
            continue
        if depth > MAX_JSON_DEPTH:
            raise JsonRefused(f"nested more than {MAX_JSON_DEPTH} levels deep")
        stack.extend((child, depth + 1) for child in node)


def parse_header(raw: bytes, file_size: int, path: str = "<header>") -> ShardHeader:
    """Validate header JSON bytes against the size of the file they came from."""
    header_len = len(raw)
    try:
        doc = strict_json(raw)
    except JsonRefused as exc:
        raise _bad(path, f"header is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise _bad(path, f"header JSON is not an object but {json_kind(doc)}")

    metadata: tuple[tuple[str, str], ...] = ()
    if METADATA_KEY in doc:
        meta = doc[METADATA_KEY]
        if not isinstance(meta, dict):
            raise _bad(path, f"__metadata__ must be an object of strings, not {json_kind(meta)}")
        for key, value in meta.items():
            if not isinstance(value, str):
                raise _bad(path, f"__metadata__ value of {quoted(key)} is {quoted(value)}; values must be strings")
        metadata = tuple(meta.items())

    tensors = []
    for name, entry in doc.items():
        if name == METADATA_KEY:
            continue
        tensors.append(_parse_entry(path, name, entry))
    tensors.sort(key=lambda t: (t.begin, t.end))

    data_size = file_size - 8 - header_len
    cursor = 0
    for t in tensors:
        if t.end > data_size:
            raise _bad(path, f"tensor {quoted(t.name)} ends at {t.end}, past the {data_size}-byte data section")
        if t.begin < cursor:
            raise _bad(path, f"tensor {quoted(t.name)} overlaps the previous tensor (starts at {t.begin}, previous ends at {cursor})")
        if t.begin > cursor:
            raise _bad(path, f"gap of {t.begin - cursor} bytes before tensor {quoted(t.name)}: offsets do not cover the data")
        cursor = t.end
    if cursor != data_size:
        raise _bad(path, f"offsets cover {cursor} of {data_size} data bytes: trailing bytes are not covered")

    return ShardHeader(path=path, header_len=header_len, file_size=file_size, metadata=metadata, tensors=tuple(tensors))


def json_kind(value: object) -> str:
    """'an object', 'an array', ...: what a JSON value is, for error messages."""
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _parse_entry(path: str, name: str, entry: object) -> TensorEntry:
    tensor = f"tensor {quoted(name)}"
    if not isinstance(entry, dict):
        raise _bad(path, f"{tensor}: entry is {json_kind(entry)}, not an object")
    dtype = entry.get("dtype")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise _bad(path, f"{tensor} has unknown dtype {quoted(dtype)}")
    if not isinstance(shape, list):
        raise _bad(path, f"{tensor} has a bad shape {quoted(shape)}: not an array")
    for i, dim in enumerate(shape):
        if not _is_u64(dim):
            raise _bad(path, f"{tensor} has a bad shape: shape[{i}] is {quoted(dim)}, not an integer from 0 to 2^64-1")
    if not (isinstance(offsets, list) and len(offsets) == 2):
        raise _bad(path, f"{tensor} has bad data_offsets {quoted(offsets)}: not a [begin, end] pair")
    for i, off in enumerate(offsets):
        if not _is_u64(off):
            raise _bad(path, f"{tensor} has bad data_offsets: data_offsets[{i}] is {quoted(off)}, "
                             "not an integer from 0 to 2^64-1")
    begin, end = offsets
    if end < begin:
        raise _bad(path, f"{tensor} has data_offsets that end before they begin ({begin}, {end})")
    bits = _size_in_bits(shape, DTYPE_BITS[dtype])
    if bits is None:
        raise _bad(path, f"{tensor}: the size of {dtype}{quoted(shape)} overflows 64 bits")
    if bits % 8:
        raise _bad(path, f"{tensor}: {dtype}{quoted(shape)} is {bits} bits, not a whole number of bytes")
    if end - begin != bits // 8:
        raise _bad(path, f"{tensor} spans {end - begin} bytes but {dtype}{quoted(shape)} needs {bits // 8}")
    return TensorEntry(name=name, dtype=dtype, shape=tuple(shape), begin=begin, end=end)


def _is_u64(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U64_MAX


def _size_in_bits(shape: list[int], bits: int) -> int | None:
    """numel * bits, or None once it passes u64, folding in order as the reference does (so a later 0 does
    not rescue an overflow, and a hostile shape costs no big-number arithmetic)."""
    numel = 1
    for dim in shape:
        numel *= dim
        if numel > U64_MAX:
            return None
    total = numel * bits
    return total if total <= U64_MAX else None


def encode_header(metadata: tuple[tuple[str, str], ...], tensors: tuple[TensorEntry, ...]) -> tuple[bytes, tuple[TensorEntry, ...]]:
    """Lay `tensors` out back to back, in the given order, and return (prefix+header bytes, relocated entries).

    The JSON is compact and padded with spaces so the data starts 8-byte aligned,
    as the reference writer does. Output is a pure function of the inputs.
    """
    relocated = []
    cursor = 0
    for t in tensors:
        relocated.append(TensorEntry(t.name, t.dtype, t.shape, cursor, cursor + t.nbytes))
        cursor += t.nbytes
    doc: dict[str, object] = {}
    if metadata:
        doc[METADATA_KEY] = dict(metadata)
    for t in relocated:
        doc[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [t.begin, t.end]}
    body = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body, tuple(relocated)
