"""HTTP content coding of binary bodies: zstd, negotiated by ``Accept-Encoding``, decoded with the
decompressed size capped before anything is allocated.

zstd was picked over lz4 by measurement on real photographs (``make bench-wire``, the codec
table): lz4 and zstd's negative levels leave a Qwen-VL photo's pixel bytes at 0.89-0.99x,
while zstd level 1 (Huffman-coded literals) gets 0.81-0.94x, and decodes at about 1 ms per MB.
Noise costs nothing to try: zstd stores incompressible blocks raw.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable

import zstandard

from .errors import MalformedBody, PayloadTooLarge, UnsupportedContentEncoding

__all__ = [
    "IDENTITY",
    "ZSTD",
    "DEFAULT_ZSTD_LEVEL",
    "MAX_ZSTD_FRAMES",
    "MAX_ZSTD_WINDOW",
    "MIN_COMPRESSED_BYTES",
    "accepts_coding",
    "body_coding",
    "compress_zstd",
    "decode_body",
    "declared_decoded_size",
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

MAX_ZSTD_FRAMES = 1024
"""Most frames (skippable ones included) a body may hold: each costs a step in Python, and our
senders write one."""

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

    libzstd (C) does all the decoding and the walking of blocks; Python only steps from frame
    to frame, and at most ``MAX_ZSTD_FRAMES`` of them (skippable ones count), so the work is
    linear in the body at C speed. A frame that declares its content size is refused before
    any allocation when it does not fit under the cap, else inflated in one exact allocation
    (the common case: one such frame is the whole body, decoded in one call); a frame that does
    not declare it is inflated into at most ``max_bytes + 1`` bytes, and refused past the cap
    (413 ``payload_too_large``). A truncated frame, trailing bytes, a window above
    ``MAX_ZSTD_WINDOW``, a body of skippable frames only and anything else wrong are 400
    ``malformed_body``.
    """
    if coding == IDENTITY:
        return body
    if coding != ZSTD:
        raise UnsupportedContentEncoding(f"content encoding {coding!r} is not supported")
    view = memoryview(body)
    dctx = _decompressor()
    out: list[bytes] = []
    total = pos = 0
    try:
        for _ in range(MAX_ZSTD_FRAMES):
            rest = view[pos:]
            length = _skippable_length(rest)
            if length is None:
                piece, length = _frame(dctx, rest, max_bytes - total)
                total += len(piece)
                out.append(piece)
            pos += length
            if pos == len(view):
                break
        else:
            raise MalformedBody(f"the body holds more than {MAX_ZSTD_FRAMES} zstd frames")
    except zstandard.ZstdError:
        raise MalformedBody("the body is not valid zstd data") from None
    if not out:
        raise MalformedBody("the body holds no zstd frame, only skippable ones")
    return out[0] if len(out) == 1 else b"".join(out)


def declared_decoded_size(body: bytes, coding: str) -> int | None:
    """The size ``body`` says it decodes to, read from its first frame's header without
    decoding anything: exact for the one sized frame every Tandem sender writes (a body of
    more frames decodes to more); None when the first frame does not say (or is skippable,
    or the header is malformed: ``decode_body`` judges those)."""
    if coding == IDENTITY:
        return len(body)
    if coding != ZSTD or len(body) < 4:
        return None
    if int.from_bytes(body[:4], "little") != _FRAME_MAGIC:
        return None
    try:
        size = zstandard.get_frame_parameters(body).content_size
    except zstandard.ZstdError:
        return None
    return None if size == zstandard.CONTENTSIZE_UNKNOWN else int(size)


def _decompressor() -> zstandard.ZstdDecompressor:
    dctx: zstandard.ZstdDecompressor | None = getattr(_local, "decompressor", None)
    if dctx is None:
        dctx = _local.decompressor = zstandard.ZstdDecompressor(max_window_size=MAX_ZSTD_WINDOW)
    return dctx


_FRAME_MAGIC = 0xFD2FB528
_SKIPPABLE_MAGIC = 0x184D2A50  # the low 4 bits are free
_EMPTY_LAST_BLOCK = 1  # block header: last, raw, no bytes
_FIRST_FEED = 64 * 1024
# How zstandard words a frame that is broken in itself (truncated, corrupt, longer than
# declared, a bad checksum), as opposed to one followed by more input.
_BROKEN = ("corruption", "full frame", "too small", "checksum", "expected")


def _skippable_length(rest: memoryview) -> int | None:
    """The length of the skippable frame ``rest`` starts with; None for a zstd frame."""
    if len(rest) < 4:
        raise MalformedBody("the body is not a sequence of zstd frames")
    magic = int.from_bytes(rest[:4], "little")
    if magic == _FRAME_MAGIC:
        return None
    if magic & 0xFFFFFFF0 != _SKIPPABLE_MAGIC:
        raise MalformedBody("the body is not a sequence of zstd frames")
    length = 8 + int.from_bytes(rest[4:8], "little")
    if len(rest) < max(length, 8):
        raise MalformedBody("a skippable frame is truncated")
    return length


def _frame(dctx: zstandard.ZstdDecompressor, rest: memoryview, room: int) -> tuple[bytes, int]:
    """The content of the zstd frame ``rest`` starts with, at most ``room`` bytes, and the
    frame's length."""
    try:
        params = zstandard.get_frame_parameters(rest)
    except zstandard.ZstdError:
        raise MalformedBody("a zstd frame header is malformed") from None
    if params.window_size > MAX_ZSTD_WINDOW:
        raise MalformedBody(f"a zstd frame's window exceeds {MAX_ZSTD_WINDOW} bytes")
    too_large = PayloadTooLarge(f"decompressed body exceeds the {room} bytes left under the cap")
    size = params.content_size
    sized = size != zstandard.CONTENTSIZE_UNKNOWN
    if sized and size > room:
        raise too_large
    if size == 0:
        # The one-shot call returns at once for a declared 0 without reading the frame: an
        # encoder writes it as one empty block, and nothing else is taken for it.
        return b"", _empty_frame_length(dctx, rest, params.has_checksum)
    # A declared size is the one exact allocation (zstd refuses a frame that does not fill
    # it); otherwise the buffer is the room plus one byte, so a bomb stops one byte past.
    limit = 0 if sized else room + 1
    try:
        # Most bodies are one sized frame: decoded in one call, which refuses truncation and
        # extra bytes alike. (zstandard 0.25 does not check for extra bytes after an unsized
        # frame that leaves its buffer part empty: those always have their end found below.)
        piece = dctx.decompress(rest, limit, allow_extra_data=not sized)
        length = len(rest) if sized else _frame_length(dctx, rest)
    except zstandard.ZstdError as exc:
        # Not a body of one whole frame: more frames follow, or this one is broken.
        piece = _decode_alone(dctx, rest, limit, exc, too_large)
        length = _frame_length(dctx, rest)
    if len(piece) > room:
        raise too_large
    return piece, length


def _decode_alone(
    dctx: zstandard.ZstdDecompressor,
    rest: memoryview,
    limit: int,
    failure: zstandard.ZstdError,
    too_large: PayloadTooLarge,
) -> bytes:
    """The frame ``rest`` starts with, decoded alone after ``failure`` to decode ``rest`` as
    one whole frame (``limit``: 0 for a sized frame, else the room plus one byte);
    zstandard's words tell whether more frames follow or this one is broken
    (a changed wording would only cost a second decode)."""
    if limit == 0 and not any(word in str(failure) for word in _BROKEN):
        with contextlib.suppress(zstandard.ZstdError):
            return dctx.decompress(rest)
    # An unsized frame that filled its buffer is a bomb, told apart from a truncated one by
    # counting through one reused buffer (no allocation).
    if limit and _inflates_past(dctx, rest, limit - 1):
        raise too_large from None
    raise MalformedBody("a zstd frame is truncated or malformed") from None


def _inflates_past(dctx: zstandard.ZstdDecompressor, rest: memoryview, room: int) -> bool:
    """Whether ``rest`` inflates past ``room`` bytes, counted through one reused buffer.

    (Counting may run on into later frames: their content counts toward the cap too.)"""
    scratch = memoryview(bytearray(min(_CHUNK, room + 1)))
    seen = 0
    with dctx.stream_reader(rest, read_across_frames=True) as reader:
        while seen <= room:
            n = reader.readinto(scratch[: room + 1 - seen])
            if not n:
                return False
            seen += n
    return True


def _frame_length(dctx: zstandard.ZstdDecompressor, rest: memoryview) -> int:
    """Where the zstd frame ``rest`` starts with ends, found by zstd itself.

    Only for a frame already decoded within the cap: its content is produced again here (and
    dropped), so it is bounded. The input goes in doubling steps, so the bytes past the frame
    that zstd hands back (a copy) stay within twice the frame.
    """
    dobj = dctx.decompressobj()
    fed, step = 0, _FIRST_FEED
    while fed < len(rest):
        chunk = rest[fed : fed + step]
        dobj.decompress(chunk)
        fed += len(chunk)
        if dobj.eof:
            return fed - len(dobj.unused_data)
        step *= 2
    raise MalformedBody("a zstd frame is truncated")


def _empty_frame_length(
    dctx: zstandard.ZstdDecompressor, rest: memoryview, has_checksum: bool
) -> int:
    block = zstandard.frame_header_size(rest)
    length = block + 3 + (4 if has_checksum else 0)
    if int.from_bytes(rest[block : block + 3], "little") != _EMPTY_LAST_BLOCK:
        raise MalformedBody("a zstd frame that declares no content holds more than an empty block")
    if length > len(rest):
        raise MalformedBody("a zstd frame is truncated")
    return _frame_length(dctx, rest[:length])  # checks the checksum, if any
