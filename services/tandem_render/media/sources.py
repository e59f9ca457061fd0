"""Media that needs no network: data: URLs, and file: URLs inside one allowed folder."""

from __future__ import annotations

import binascii
from pathlib import Path
from urllib.parse import unquote, unquote_to_bytes, urlsplit

import pybase64

from ..errors import InvalidImage, MediaNotFound, MediaTooLarge, MediaUrlForbidden

__all__ = ["decode_data_url", "read_file"]

_MAX_DATA_URL_HEADER = 1024  # "data:<media type>;<params>;base64" before the ','


def decode_data_url(url: str, max_bytes: int) -> bytes:
    """The bytes a ``data:`` URL carries, refused unread if they could exceed ``max_bytes``."""
    comma = url.find(",", 0, _MAX_DATA_URL_HEADER)
    if comma < 0:
        raise InvalidImage("malformed data URL: no ',' separator")
    header, payload = url[len("data:") : comma], url[comma + 1 :]
    is_base64 = header.lower().endswith(";base64")
    # Upper bounds of the decoded size, so nothing oversize is ever decoded.
    bound = len(payload) * 3 // 4 if is_base64 else len(payload)
    if bound > max_bytes:
        raise MediaTooLarge(f"data URL is larger than {max_bytes} bytes")
    if not is_base64:
        return unquote_to_bytes(payload)
    try:
        return pybase64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidImage("data URL is not valid base64") from None


def read_file(url: str, root: Path, max_bytes: int) -> bytes:
    """The bytes of a ``file:`` URL's file inside ``root``. Blocking: run it in a thread."""
    root = root.resolve()
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise MediaUrlForbidden("file: URLs may not name a remote host")
    try:
        path = Path(unquote(parts.path)).resolve()
    except (OSError, ValueError, RuntimeError):
        raise MediaUrlForbidden("file: URL does not name a readable path") from None
    # resolve() has followed symlinks, so a link pointing outside the folder fails here.
    if not parts.path.startswith("/") or not path.is_relative_to(root):
        raise MediaUrlForbidden("file: URL is outside the allowed media folder")
    try:
        if not path.is_file():
            raise MediaNotFound("media file not found")
        if path.stat().st_size > max_bytes:
            raise MediaTooLarge(f"media file is larger than {max_bytes} bytes")
        with path.open("rb") as f:
            # Read one byte past the cap: the file may have grown since stat().
            data = f.read(max_bytes + 1)
    except OSError:
        raise MediaNotFound("media file not found or not readable") from None
    if len(data) > max_bytes:
        raise MediaTooLarge(f"media file is larger than {max_bytes} bytes")
    return data
