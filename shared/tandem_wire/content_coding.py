"""HTTP content coding of binary bodies: zstd, negotiated by ``Accept-Encoding``, decoded with the
decompressed size capped before anything is allocated.

zstd was picked over lz4 by measurement on real photographs (``make bench-wire``, the codec
table): lz4 and zstd's negative levels leave a Qwen-VL photo's pixel bytes at 0.89-0.99x,
while zstd level 1 (Huffman-coded literals) gets 0.81-0.94x, and decodes at about 1 ms per MB.
Noise costs nothing to try: zstd stores incompressible blocks raw.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import zstandard

from .errors import MalformedBody, PayloadTooLarge, UnsupportedContentEncoding

__all__ = [
    "IDENTITY",
    "ZSTD",
    "DEFAULT_ZSTD_LEVEL",
    "MAX_ZSTD_WINDOW",
    "MIN_COMPRESSED_BYTES",
    "accepts_coding",
    "body_coding",
    "compress_zstd",
    "decode_body",
]

IDENTITY = "identity"
"""No content coding."""

ZSTD = "zstd"
"""The zstd content coding (RFC 9659)."""

DEFAULT_ZSTD_LEVEL = 1
"""zstd's level 1: the cheapest that Huffman-codes literals (negative levels store them raw,
and raw pixel bytes are nearly all literals)."""

MAX_ZSTD_WINDOW = 8 * 1024 * 1024
"""Largest zstd window a decoder allocates (RFC 9659's limit for the ``zstd`` coding); level 1
writes 512 KiB windows."""

MIN_COMPRESSED_BYTES = 16 * 1024
"""Bodies below this size go as they are: the frame and the CPU would buy nothing."""

_CHUNK = 1024 * 1024
_local = threading.local()


def accepts_coding(accept_encoding: str | None, coding: str = ZSTD) -> bool:
    """Whether an ``Accept-Encoding`` value names ``coding`` with a non-zero q-value.

    Only an explicit name counts (``*`` does not): a compressed body is never sent on a guess.
    """
    for entry in (accept_encoding or "").split(","):
        name, _, params = entry.partition(";")
        if name.strip().lower() != coding:
            continue
        q = params.strip().lower()
        if q.startswith("q="):
            try:
                return float(q[2:]) > 0
            except ValueError:
                return False
        return True
    return False


def body_coding(content_encoding: str | None) -> str:
    """The coding a ``Content-Encoding`` value declares: ``identity`` or ``zstd``.

    Raises UnsupportedContentEncoding (415) for anything else, layered codings included.
    """
    value = (content_encoding or "").strip().lower()
    if value in ("", IDENTITY):
        return IDENTITY
    if value == ZSTD:
        return ZSTD
    shown = value[:40]
    raise UnsupportedContentEncoding(
        f"content encoding {shown!r} is not supported (send {ZSTD!r} or none)",
        param="content-encoding",
    )


def _compressor(level: int) -> zstandard.ZstdCompressor:
    # A context holds ~1 MB of tables: one per thread and level, reused (contexts are not
    # thread-safe; the services compress on their event-loop thread, the client may not).
    cache: dict[int, zstandard.ZstdCompressor] | None = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    cctx = cache.get(level)
    if cctx is None:
        cctx = cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return cctx


def compress_zstd(
    parts: bytes | Iterable[bytes | memoryview], level: int = DEFAULT_ZSTD_LEVEL
) -> bytes:
    """One zstd frame holding ``parts`` back to back, its content size in the frame header (so
    the receiver checks it against its cap before allocating)."""
    if isinstance(parts, bytes):
        return _compressor(level).compress(parts)
    pieces = list(parts)
    total = sum(len(p) for p in pieces)
    cobj = _compressor(level).compressobj(size=total)
    out = [cobj.compress(p) for p in pieces]
    out.append(cobj.flush())
    return b"".join(out)


def decode_body(body: bytes, coding: str, max_bytes: int) -> bytes:
    """``body`` decoded from ``coding`` (see ``body_coding``), at most ``max_bytes`` long.

    The frames are walked first (headers and block headers only), so a truncated body is
    refused and sizes are known before any output exists. Frames that declare their content
    size are refused before any allocation when the sizes add up past the cap, then inflated
    in one exact allocation each; a frame that does not declare it is inflated in bounded
    steps and refused as soon as the total passes the cap (413 ``payload_too_large``).
    Anything else wrong is 400 ``malformed_body``.
    """
    if coding == IDENTITY:
        return body
    if coding != ZSTD:
        raise UnsupportedContentEncoding(f"content encoding {coding!r} is not supported")
    frames = _frames(memoryview(body))
    too_large = PayloadTooLarge(f"decompressed body exceeds {max_bytes} bytes")
    if sum(max(size, 0) for _, size in frames) > max_bytes:
        raise too_large
    dctx = _decompressor()
    out: list[bytes] = []
    total = 0
    try:
        for frame, size in frames:
            if size > 0:
                # One allocation of the declared size; zstd checks the frame fills it exactly.
                # (Not for 0: the one-shot call returns at once without reading the frame.)
                piece = dctx.decompress(frame)
                total += len(piece)
                out.append(piece)
            else:
                total = _inflate_bounded(dctx, frame, total, max_bytes, out, too_large)
    except zstandard.ZstdError:
        raise MalformedBody("the body is not valid zstd data") from None
    return out[0] if len(out) == 1 else b"".join(out)


def _decompressor() -> zstandard.ZstdDecompressor:
    dctx: zstandard.ZstdDecompressor | None = getattr(_local, "decompressor", None)
    if dctx is None:
        dctx = _local.decompressor = zstandard.ZstdDecompressor(max_window_size=MAX_ZSTD_WINDOW)
    return dctx


def _inflate_bounded(
    dctx: zstandard.ZstdDecompressor,
    frame: memoryview,
    total: int,
    max_bytes: int,
    out: list[bytes],
    too_large: PayloadTooLarge,
) -> int:
    with dctx.stream_reader(frame) as reader:
        while True:
            # Never more than one byte past the cap is inflated.
            chunk = reader.read(min(_CHUNK, max_bytes - total + 1))
            if not chunk:
                return total
            total += len(chunk)
            if total > max_bytes:
                raise too_large
            out.append(chunk)


_FRAME_MAGIC = 0xFD2FB528
_SKIPPABLE_MAGIC = 0x184D2A50  # the low 4 bits are free
_MAX_FRAMES = 1024


def _frames(view: memoryview) -> list[tuple[memoryview, int]]:
    """Each zstd frame of a body and its declared content size (-1: not declared), walked by
    their headers (RFC 8878 section 3.1) without decoding; skippable frames are dropped."""
    frames: list[tuple[memoryview, int]] = []
    pos, end = 0, len(view)
    while pos < end:
        if end - pos < 4 or len(frames) >= _MAX_FRAMES:
            raise MalformedBody("the body is not a sequence of zstd frames")
        magic = int.from_bytes(view[pos : pos + 4], "little")
        if magic & 0xFFFFFFF0 == _SKIPPABLE_MAGIC:
            pos += 8 + int.from_bytes(view[pos + 4 : pos + 8], "little")
            continue
        if magic != _FRAME_MAGIC:
            raise MalformedBody("the body is not a sequence of zstd frames")
        try:
            params = zstandard.get_frame_parameters(view[pos:])
            block = pos + zstandard.frame_header_size(view[pos:])
        except zstandard.ZstdError:
            raise MalformedBody("a zstd frame header is malformed") from None
        while True:
            header = int.from_bytes(view[block : block + 3], "little")
            kind = (header >> 1) & 3
            if block + 3 > end or kind == 3:
                raise MalformedBody("a zstd frame is truncated or malformed")
            block += 3 + (1 if kind == 1 else header >> 3)  # an RLE block holds one byte
            if header & 1:  # the last block
                break
        block += 4 if params.has_checksum else 0
        if block > end:
            raise MalformedBody("a zstd frame is truncated")
        size = params.content_size
        frames.append((view[pos:block], -1 if size == zstandard.CONTENTSIZE_UNKNOWN else size))
        pos = block
    if pos > end or not frames:
        raise MalformedBody("the body holds no complete zstd frame")
    return frames
