"""Hostile zstd bodies, built by code (RFC 8878 frames written by hand), and seeded mutants of
honest ones: the corpus the decoder and the door's generate route are fuzzed with."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator

import zstandard

MIB = 1024 * 1024
_MAGIC = (0xFD2FB528).to_bytes(4, "little")
_SKIPPABLE = (0x184D2A50).to_bytes(4, "little")


def frame_header(size: int | None = None, window_log: int = 19) -> bytes:
    """A frame header with a window descriptor; ``size`` declared in 8 bytes, or not at all."""
    window = bytes([(window_log - 10) << 3])
    if size is None:
        return _MAGIC + b"\x00" + window
    return _MAGIC + b"\xc0" + window + size.to_bytes(8, "little")


def block(kind: int, size: int, last: bool = False) -> bytes:
    """A block header: kind 0 raw, 1 RLE, 2 compressed; ``size`` as the header states it."""
    return ((size << 3) | (kind << 1) | int(last)).to_bytes(3, "little")


def empty_raw_blocks(length: int, size: int | None = None) -> bytes:
    """One frame of 3-byte empty raw blocks, ``length`` bytes long (it inflates to nothing)."""
    head = frame_header(size)
    count = (length - len(head)) // 3
    return head + block(0, 0) * (count - 1) + block(0, 0, last=True)


def skippable_flood(length: int) -> bytes:
    """Empty skippable frames, 8 bytes each."""
    return (_SKIPPABLE + bytes(4)) * (length // 8)


def tiny_frames(length: int) -> bytes:
    """Frames of one byte each, back to back."""
    frame = zstandard.ZstdCompressor().compress(b"x")
    return frame * (length // len(frame))


def rle_bomb(length: int, size: int | None = None) -> bytes:
    """One frame of RLE blocks, 4 bytes each inflating to 128 KiB (``length`` bytes: 32768x)."""
    head = frame_header(size)
    count = (length - len(head)) // 4
    return head + (block(1, 128 * 1024) + b"\0") * (count - 1) + block(1, 128 * 1024, True) + b"\0"


CRAFTED: dict[str, Callable[[int], bytes]] = {
    "empty-raw-blocks": empty_raw_blocks,
    "empty-raw-blocks-declaring-0": functools.partial(empty_raw_blocks, size=0),
    "empty-raw-blocks-declaring-1": functools.partial(empty_raw_blocks, size=1),
    "skippable-flood": skippable_flood,
    "tiny-frame-flood": tiny_frames,
    "rle-bomb": rle_bomb,
    "rle-bomb-declaring-1-mib": functools.partial(rle_bomb, size=MIB),
    "rle-bomb-declaring-2-40": functools.partial(rle_bomb, size=1 << 40),
}
"""The crafted bodies by name: each builds one about as long as it is asked."""


def hostile(length: int) -> dict[str, bytes]:
    """Every crafted body, about ``length`` bytes each, by name."""
    return {name: build(length) for name, build in CRAFTED.items()}


def honest(seed: int = 0) -> list[bytes]:
    """Bodies an encoder writes: sized, unsized, several frames, skippable frames between."""
    rng = random.Random(seed)
    data = bytes(rng.randrange(40) for _ in range(20_000)) + bytes(30_000)
    sized = zstandard.ZstdCompressor(write_checksum=True).compress(data)
    cobj = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    unsized = cobj.compress(data) + cobj.flush()
    skip = _SKIPPABLE + (5).to_bytes(4, "little") + b"hello"
    return [sized, unsized, sized + skip + unsized, skip + sized]


def mutants(seed: int, count: int) -> Iterator[bytes]:
    """``count`` seeded mutants of honest and small hostile bodies: bytes flipped, cut,
    repeated, spliced, header fields overwritten."""
    rng = random.Random(seed)
    pool = [*honest(seed), *hostile(4096).values()]
    for _ in range(count):
        body = bytearray(rng.choice(pool))
        for _ in range(rng.randint(1, 3)):
            kind = rng.randrange(6)
            at = rng.randrange(len(body) + 1)
            if kind == 0 and body:  # flip a byte, often in the headers
                i = rng.randrange(min(len(body), 24)) if rng.random() < 0.5 else at % len(body)
                body[i] ^= 1 << rng.randrange(8)
            elif kind == 1:  # cut
                del body[at:]
            elif kind == 2:  # repeat a slice
                body[at:at] = body[at : at + rng.randrange(1, 64)] * rng.randrange(1, 50)
            elif kind == 3:  # splice a skippable or a tiny frame in
                body[at:at] = rng.choice(
                    [skippable_flood(8 * rng.randrange(1, 300)), tiny_frames(30)]
                )
            elif kind == 4:  # trailing bytes
                body += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 6)))
            else:  # overwrite a declared size or window byte
                if len(body) > 14:
                    body[rng.randrange(4, 14)] = rng.randrange(256)
        yield bytes(body)
