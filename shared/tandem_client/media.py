"""Media given to the client (images as bytes, PIL images, arrays or URLs; videos and audio
clips as bytes or URLs) -> what the wire carries."""

from __future__ import annotations

import base64
import io
from typing import Any

__all__ = ["ImageLike", "MediaLike", "image_source", "media_source"]

ImageLike = Any
"""Encoded image bytes, a PIL image, an HxWx3 uint8 array, or a URL (http(s)/data/file)."""

MediaLike = str | bytes | bytearray | memoryview
"""A video or audio clip: its encoded bytes (e.g. mp4, wav), or a URL (http(s)/data/file)."""


def _png(image: Any) -> bytes:
    from PIL import Image

    if not isinstance(image, Image.Image):
        image = Image.fromarray(image)
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def image_source(image: ImageLike, *, binary: bool) -> str | bytes:
    """Raw bytes for a msgpack body (no base64 at all), a data URL for a JSON body; URLs as they
    are (the render service fetches them)."""
    if isinstance(image, str):
        return image
    data = bytes(image) if isinstance(image, (bytes, bytearray, memoryview)) else _png(image)
    return media_source(data, binary=binary, media_type="image/png")


def media_source(
    item: MediaLike, *, binary: bool, media_type: str = "application/octet-stream"
) -> str | bytes:
    """``image_source`` for media passed as they are: a URL unchanged, bytes raw in msgpack or
    as a data URL in JSON (render reads the bytes, whatever ``media_type`` says)."""
    if isinstance(item, str):
        return item
    if not isinstance(item, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected media bytes or a URL, not {type(item).__name__}")
    data = bytes(item)
    if binary:
        return data
    return f"data:{media_type};base64," + base64.b64encode(data).decode("ascii")
