"""zstd content coding: round trips, golden frames, negotiation grammar, and hostile bodies
(bombs refused before they are inflated, corrupt frames typed)."""

from __future__ import annotations

import os
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
from tandem_wire.content_coding import MAX_ZSTD_FRAMES, MAX_ZSTD_WINDOW

from ...support import zstd_bodies
from ...support.fuzz import keep_crash

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
        unsized_frame(b"z" * 5000) + b"trailing junk",
        unsized_frame(b"z" * 5000) + b"\x28\xb5",
    ],
    ids=[
        "empty",
        "text",
        "magic-only",
        "truncated",
        "truncated-unsized",
        "trailing-junk",
        "trailing-junk-unsized",
        "trailing-bytes-unsized",
    ],
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


# Crafted bodies: what each is answered (413 for one that inflates past the cap, 400 for one
# that is malformed, or its content).
CRAFTED_OUTCOMES = {
    "empty-raw-blocks": b"",  # legal: one frame of empty blocks holds nothing
    "empty-raw-blocks-declaring-0": MalformedBody,  # a declared-empty frame is one block
    "empty-raw-blocks-declaring-1": MalformedBody,
    "skippable-flood": MalformedBody,  # more than MAX_ZSTD_FRAMES frames
    "tiny-frame-flood": MalformedBody,
    "rle-bomb": PayloadTooLarge,
    "rle-bomb-declaring-1-mib": MalformedBody,  # inflates past what it declares
    "rle-bomb-declaring-2-40": PayloadTooLarge,  # refused from its header
}


def answer(body: bytes, cap: int) -> bytes | type[Exception]:
    try:
        return decode_body(body, ZSTD, cap)
    except (MalformedBody, PayloadTooLarge) as exc:
        return type(exc)


@pytest.mark.parametrize("name", sorted(CRAFTED_OUTCOMES))
def test_a_crafted_32_mib_body_is_answered(name: str) -> None:
    # Blocks and frames are walked by libzstd, frames counted: at most ~0.35 s of CPU a body
    # (11 M empty blocks), where a Python walk of block headers took 3-6 s (make bench-wire's
    # hostile part measures each).
    body = zstd_bodies.CRAFTED[name](32 * MIB)
    assert answer(body, 8 * MIB) == CRAFTED_OUTCOMES[name]


def test_frames_are_counted_skippable_ones_too() -> None:
    one = compress_zstd(b"ab")
    skip = zstd_bodies.skippable_flood(8)
    assert decode_body(one * MAX_ZSTD_FRAMES, ZSTD, MIB) == b"ab" * MAX_ZSTD_FRAMES
    assert decode_body(skip * (MAX_ZSTD_FRAMES - 1) + one, ZSTD, MIB) == b"ab"
    for body in (one * (MAX_ZSTD_FRAMES + 1), skip * MAX_ZSTD_FRAMES + one):
        with pytest.raises(MalformedBody, match="frames"):
            decode_body(body, ZSTD, MIB)


def test_skippable_frames_are_skipped_but_never_the_whole_body() -> None:
    data = b"payload" * 500
    skip = b"\x5a\x2a\x4d\x18" + (3).to_bytes(4, "little") + b"abc"
    assert decode_body(skip + compress_zstd(data) + skip, ZSTD, MIB) == data
    for body in (skip, skip * 3, skip[:-1], compress_zstd(data) + skip[:-1]):
        with pytest.raises(MalformedBody):
            decode_body(body, ZSTD, MIB)


def test_a_window_above_the_limit_is_malformed_from_its_header() -> None:
    assert MAX_ZSTD_WINDOW == 1 << 23
    ok = zstd_bodies.frame_header(window_log=23) + zstd_bodies.block(0, 0, last=True)
    assert decode_body(ok, ZSTD, MIB) == b""
    big = zstd_bodies.frame_header(window_log=24) + zstd_bodies.block(0, 0, last=True)
    with pytest.raises(MalformedBody, match="window"):
        decode_body(big, ZSTD, MIB)


def test_an_unsized_bomb_past_a_small_cap_is_too_large_not_truncated() -> None:
    bomb = zstd_bodies.rle_bomb(4096)  # 128 MiB of zeros
    for cap in (0, 1, 128 * 1024, MIB):
        with pytest.raises(PayloadTooLarge):
            decode_body(bomb, ZSTD, cap)
    # The same frame cut short inflates to less than the cap: truncated, not too large.
    with pytest.raises(MalformedBody):
        decode_body(zstd_bodies.rle_bomb(512)[:-1], ZSTD, 32 * MIB)


def test_later_frames_count_toward_the_cap() -> None:
    data = bytes(range(256)) * 16
    body = compress_zstd(data) + unsized_frame(data) + compress_zstd(data)
    assert decode_body(body, ZSTD, 3 * len(data)) == data * 3
    for cap in (3 * len(data) - 1, 2 * len(data), len(data) + 5):
        with pytest.raises(PayloadTooLarge):
            decode_body(body, ZSTD, cap)


FUZZ_COUNT = int(os.environ.get("TANDEM_FUZZ_COUNT", "400"))  # make fuzz: more


def test_mutated_zstd_bodies_are_typed_refusals_or_decode_as_zstd_does() -> None:
    # Seeded mutants of honest and crafted bodies: each is a typed 4xx, or decodes to what
    # libzstd itself reads from it (never more than the cap).
    cap = 4 * MIB
    reference = zstandard.ZstdDecompressor(max_window_size=MAX_ZSTD_WINDOW)
    seen: dict[str, int] = {}
    for body in zstd_bodies.mutants(seed=26, count=FUZZ_COUNT):
        try:
            got = decode_body(body, ZSTD, cap)
        except (MalformedBody, PayloadTooLarge) as exc:
            assert exc.status_code in (400, 413)
            seen[exc.type] = seen.get(exc.type, 0) + 1
        except Exception as exc:  # an untyped error is a crash: keep the input
            path = keep_crash("zstd-decode", body.hex(), repr(exc))
            pytest.fail(f"{exc!r} for the input kept in {path}")
        else:
            seen["decoded"] = seen.get("decoded", 0) + 1
            with reference.stream_reader(body, read_across_frames=True) as reader:
                assert got == reader.read(cap + 1)
    print("zstd fuzz: answers", dict(sorted(seen.items())))
    assert set(seen) == {"decoded", "malformed_body", "payload_too_large"}
