"""safetensors headers: read, validate and write them without touching tensor data.

Layout: u64 little-endian header length N, N bytes of JSON, then the data. Each
entry's data_offsets are relative to the start of the data, and together they
must tile it exactly: no gap, no overlap, nothing past the end.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass

from sparkstack.errors import SparkstackError

# Bits per element. Sub-byte types pack; a tensor's byte length is ceil(numel * bits / 8).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}

# The reference implementation refuses headers above 100 MB; so do we, before allocating.
MAX_HEADER_BYTES = 100_000_000
METADATA_KEY = "__metadata__"


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


def read_header(path: str | os.PathLike) -> ShardHeader:
    """Read and fully validate the header of one safetensors file."""
    shown = str(path)
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


def parse_header(raw: bytes, file_size: int, path: str = "<header>") -> ShardHeader:
    """Validate header JSON bytes against the size of the file they came from."""
    header_len = len(raw)
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_refuse_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(path, f"header is not JSON ({exc})") from None
    except _DuplicateKey as exc:
        raise _bad(path, f"tensor name {exc.args[0]!r} appears twice in the header") from None
    if not isinstance(doc, dict):
        raise _bad(path, "header JSON is not an object")

    metadata: tuple[tuple[str, str], ...] = ()
    if METADATA_KEY in doc:
        meta = doc[METADATA_KEY]
        if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            raise _bad(path, "__metadata__ must map strings to strings")
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
            raise _bad(path, f"tensor {t.name!r} ends at {t.end}, past the {data_size}-byte data section")
        if t.begin < cursor:
            raise _bad(path, f"tensor {t.name!r} overlaps the previous tensor (starts at {t.begin}, previous ends at {cursor})")
        if t.begin > cursor:
            raise _bad(path, f"gap of {t.begin - cursor} bytes before tensor {t.name!r}: offsets do not cover the data")
        cursor = t.end
    if cursor != data_size:
        raise _bad(path, f"offsets cover {cursor} of {data_size} data bytes: trailing bytes are not covered")

    return ShardHeader(path=path, header_len=header_len, file_size=file_size, metadata=metadata, tensors=tuple(tensors))


class _DuplicateKey(Exception):
    pass


def _refuse_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return doc


def _parse_entry(path: str, name: str, entry: object) -> TensorEntry:
    if not isinstance(entry, dict):
        raise _bad(path, f"entry {name!r} is not an object")
    dtype = entry.get("dtype")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if dtype not in DTYPE_BITS:
        raise _bad(path, f"tensor {name!r} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
        raise _bad(path, f"tensor {name!r} has a bad shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_uint(o) for o in offsets)):
        raise _bad(path, f"tensor {name!r} has bad data_offsets {offsets!r}")
    begin, end = offsets
    if end < begin:
        raise _bad(path, f"tensor {name!r} has data_offsets that end before they begin ({begin}, {end})")
    expected = math.ceil(math.prod(shape) * DTYPE_BITS[dtype] / 8)
    if end - begin != expected:
        raise _bad(path, f"tensor {name!r} spans {end - begin} bytes but {dtype}{shape} needs {expected}")
    return TensorEntry(name=name, dtype=dtype, shape=tuple(shape), begin=begin, end=end)


def _is_uint(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


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
