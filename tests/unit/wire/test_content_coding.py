"""zstd content coding: round trips, golden frames, negotiation grammar, and hostile bodies
(bombs refused before they are inflated, corrupt frames typed)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem_wire import (
    IDENTITY,
    ZSTD,
    MalformedBody,
    PayloadTooLarge,
    UnsupportedContentEncoding,
    accepts_coding,
    body_coding,
    compress_zstd,
    decode_body,
    error_types,
)

GOLDEN = Path(__file__).parent / "golden"
MIB = 1024 * 1024


def golden_document() -> bytes:
    return bytes.fromhex((GOLDEN / "generate_request.msgpack.hex").read_text().strip())


def unsized_frame(data: bytes) -> bytes:
    """A frame that does not declare its content size (as a streaming sender writes it)."""
    cobj = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    return cobj.compress(data) + cobj.flush()


def zero_bomb(size: int, *, sized: bool) -> bytes:
    """``size`` zero bytes as one frame of a few KiB, built without holding them all."""
    cobj = zstandard.ZstdCompressor(write_content_size=sized).compressobj(
        size=size if sized else -1
    )
    chunk = bytes(MIB)
    out = [cobj.compress(chunk) for _ in range(size // MIB)]
    out.append(cobj.flush())
    return b"".join(out)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=3000), max_size=6), st.integers(min_value=-5, max_value=5))
def test_parts_round_trip_as_one_sized_frame(parts: list[bytes], level: int) -> None:
    frame = compress_zstd(parts, level)
    joined = b"".join(parts)
    assert zstandard.get_frame_parameters(frame).content_size == len(joined)
    assert decode_body(frame, ZSTD, len(joined)) == joined


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=5000))
def test_unsized_and_multi_frame_bodies_decode(data: bytes) -> None:
    half = len(data) // 2
    assert decode_body(unsized_frame(data), ZSTD, len(data)) == data
    two = compress_zstd(data[:half]) + unsized_frame(data[half:])
    assert decode_body(two, ZSTD, len(data)) == data


def test_golden_frames_decode_to_the_golden_document() -> None:
    # Frames as a zstd 1.5 encoder wrote them (one declaring its size, one not): decoding a
    # fixed frame must never drift, whatever the library version.
    for name in ("generate_request.msgpack.zst.hex", "generate_request.unsized.zst.hex"):
        frame = bytes.fromhex((GOLDEN / name).read_text().strip())
        assert decode_body(frame, ZSTD, 1 * MIB) == golden_document()


def test_our_frames_are_smaller_and_declare_their_size() -> None:
    doc = golden_document() * 20
    frame = compress_zstd([doc[:100], memoryview(doc)[100:]])
    params = zstandard.get_frame_parameters(frame)
    assert params.content_size == len(doc) and params.window_size <= 8 * MIB
    assert len(frame) < len(doc) // 4


def test_identity_passes_the_body_through() -> None:
    body = b"\x00\x01not compressed"
    assert decode_body(body, IDENTITY, 1) is body


@pytest.mark.parametrize("sized", [True, False], ids=["declared-size", "unsized"])
def test_a_bomb_is_refused_without_inflating_it(sized: bool) -> None:
    bomb = zero_bomb(256 * MIB, sized=sized)
    assert len(bomb) < 64 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLarge) as refused:
            decode_body(bomb, ZSTD, 4 * MIB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert refused.value.status_code == 413
    assert refused.value.type == error_types.PAYLOAD_TOO_LARGE
    # Python-side allocations stay within the cap plus one read step (the C decoder's window
    # is bounded by MAX_ZSTD_WINDOW), nowhere near the 256 MiB the frame inflates to.
    assert peak < 8 * MIB


def test_the_cap_is_inclusive() -> None:
    data = bytes(range(256)) * 64
    for frame in (compress_zstd(data), unsized_frame(data)):
        assert decode_body(frame, ZSTD, len(data)) == data
        with pytest.raises(PayloadTooLarge):
            decode_body(frame, ZSTD, len(data) - 1)


def test_a_frame_lying_about_its_size_is_malformed() -> None:
    data = b"abc" * 1000
    frame = bytearray(compress_zstd(data))
    # Frame header: magic (4), descriptor (1), then (single-segment, size < 64 KiB) a 2-byte
    # content size stored minus 256.
    assert frame[4] & 0x20 and frame[4] >> 6 == 1
    frame[5:7] = (len(data) - 256 - 10).to_bytes(2, "little")
    with pytest.raises(MalformedBody):
        decode_body(bytes(frame), ZSTD, 1 * MIB)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not zstd at all",
        b"\x28\xb5\x2f\xfd",  # the magic number alone
        compress_zstd(b"x" * 5000)[:-3],  # truncated
        unsized_frame(b"y" * 5000)[:-3],
        compress_zstd(b"z" * 5000) + b"trailing junk",
    ],
    ids=["empty", "text", "magic-only", "truncated", "truncated-unsized", "trailing-junk"],
)
def test_corrupt_bodies_are_malformed(body: bytes) -> None:
    with pytest.raises(MalformedBody) as refused:
        decode_body(body, ZSTD, 1 * MIB)
    assert refused.value.status_code == 400


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, False),
        ("", False),
        ("gzip, deflate", False),
        ("zstd", True),
        ("gzip, ZSTD", True),
        ("zstd;q=0.5, gzip", True),
        ("zstd; q=0", False),
        ("zstd;q=0.0", False),
        ("zstd;q=x", False),
        ("*", False),  # never compressed on a guess
        ("zstdx", False),
    ],
)
def test_accept_encoding_grammar(header: str | None, expected: bool) -> None:
    assert accepts_coding(header, ZSTD) is expected


@pytest.mark.parametrize(
    ("header", "coding"),
    [(None, IDENTITY), ("", IDENTITY), ("identity", IDENTITY), (" ZSTD ", ZSTD)],
)
def test_content_encoding_grammar(header: str | None, coding: str) -> None:
    assert body_coding(header) == coding


@pytest.mark.parametrize("header", ["gzip", "br", "zstd, gzip", "deflate", "x" * 500])
def test_other_content_encodings_are_unsupported(header: str) -> None:
    with pytest.raises(UnsupportedContentEncoding) as refused:
        body_coding(header)
    assert refused.value.status_code == 415
    assert refused.value.type == error_types.UNSUPPORTED_CONTENT_ENCODING
    assert len(refused.value.message) < 120
