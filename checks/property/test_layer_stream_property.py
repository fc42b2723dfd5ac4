"""Property tests of layer decompression, judged against zlib/gzip and the zstandard library.

A stream cut anywhere short of its end must be refused as truncated (never quietly end early);
a whole stream, in one or many members or frames, must decompress to exactly its input.
"""

import gzip
import io
import zlib

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkstack.errors import SparkstackError
from sparkstack.oci.layers import ZstdFrames, uncompressed
from sparkstack.oci.model import LAYER_GZIP, LAYER_ZSTD

settings.register_profile("layers", deadline=None, max_examples=150)
settings.load_profile("layers")

payloads = st.lists(st.binary(max_size=3000) | st.builds(lambda n, b: b * n, st.integers(1, 200_000), st.binary(min_size=1, max_size=3)),
                    min_size=1, max_size=3)
levels = st.integers(-5, 19)


def _zstd(parts: list[bytes], level: int, checksum: bool, sizes: bool) -> bytes:
    c = zstandard.ZstdCompressor(level=level, write_checksum=checksum, write_content_size=sizes)
    return b"".join(c.compress(p) for p in parts)


def _boundaries(pieces: list[bytes]) -> set[int]:
    ends, at = set(), 0
    for piece in pieces:
        at += len(piece)
        ends.add(at)
    return ends


def _read_all(blob: bytes, media: str) -> bytes:
    with uncompressed(io.BufferedReader(io.BytesIO(blob)), media, "L") as r:
        out = io.BytesIO()
        while chunk := r.read(1 << 16):
            out.write(chunk)
        return out.getvalue()


@given(payloads, levels, st.booleans(), st.booleans())
def test_zstd_whole_streams_decode_and_are_complete(parts, level, checksum, sizes):
    blob = _zstd(parts, level, checksum, sizes)
    frames = ZstdFrames()
    frames.feed(blob)
    assert frames.complete and frames.frames == len(parts)
    assert _read_all(blob, LAYER_ZSTD) == b"".join(parts)


@given(payloads, levels, st.booleans(), st.data())
def test_zstd_cut_anywhere_is_truncated(parts, level, checksum, data):
    blob = _zstd(parts, level, checksum, True)
    cut = data.draw(st.integers(0, len(blob) - 1))
    # Cut exactly between frames, what is left is a complete shorter stream: not a truncation.
    if cut in _boundaries([_zstd([p], level, checksum, True) for p in parts]):
        return
    frames = ZstdFrames()
    frames.feed(blob[:cut])
    assert not frames.complete
    with pytest.raises(SparkstackError, match="^L: (truncated|corrupt) zstd"):
        _read_all(blob[:cut], LAYER_ZSTD)


@given(st.lists(st.integers(1, 50), max_size=20), payloads)
def test_zstd_walker_sees_any_chunking(cuts, parts):
    blob = _zstd(parts, 3, True, True)
    frames, at = ZstdFrames(), 0
    for n in cuts:
        frames.feed(blob[at:at + n])
        at += n
    frames.feed(blob[at:])
    assert frames.complete


def test_zstd_skippable_frame_is_stepped_over():
    skippable = (0x184D2A50).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"12345"
    blob = skippable + _zstd([b"x" * 100], 3, False, True)
    frames = ZstdFrames()
    frames.feed(blob)
    assert frames.complete


@given(payloads, st.integers(0, 9))
def test_gzip_members_decode(parts, level):
    blob = b"".join(gzip.compress(p, compresslevel=level, mtime=0) for p in parts)
    assert _read_all(blob, LAYER_GZIP) == b"".join(parts)


@given(payloads, st.integers(0, 9), st.data())
def test_gzip_cut_anywhere_is_refused(parts, level, data):
    blob = b"".join(gzip.compress(p, compresslevel=level, mtime=0) for p in parts)
    cut = data.draw(st.integers(0, len(blob) - 1))
    # Cut exactly at a member boundary, what is left is a complete shorter stream: not a truncation.
    if cut in _boundaries([gzip.compress(p, compresslevel=level, mtime=0) for p in parts]):
        return
    with pytest.raises(SparkstackError, match="^L: (truncated|corrupt) gzip"):
        _read_all(blob[:cut], LAYER_GZIP)


def test_gzip_bomb_output_is_bounded_per_read():
    """1 GiB of zeros in ~1 MiB of gzip: each read returns at most what was asked for."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = bytes(1 << 20)
    blob = b"".join(z.compress(chunk) for _ in range(1024)) + z.flush()
    with uncompressed(io.BufferedReader(io.BytesIO(blob)), LAYER_GZIP, "L") as r:
        buf = bytearray(1 << 16)
        for _ in range(64):
            assert r.readinto(buf) <= len(buf)
