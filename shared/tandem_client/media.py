"""Images given to the client (bytes, PIL images, arrays, URLs) -> what the wire carries."""

from __future__ import annotations

import base64
import io
from typing import Any

__all__ = ["ImageLike", "image_source"]

ImageLike = Any
"""Encoded image bytes, a PIL image, an HxWx3 uint8 array, or a URL (http(s)/data/file)."""


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
    if binary:
        return data
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")
