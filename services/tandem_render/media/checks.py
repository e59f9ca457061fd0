"""Image checks: decodable, not empty, and few enough pixels, judged from the header first."""

from __future__ import annotations

import io
import warnings

from PIL import Image, UnidentifiedImageError

from ..errors import ImageTooLarge, InvalidImage

__all__ = ["check_image_bytes", "open_image"]


def open_image(data: bytes, max_pixels: int) -> Image.Image:
    """Decode ``data`` (first frame of animations), refusing oversize images before decoding.

    The mode is left as stored; converting is the caller's choice.
    """
    img = _open_checked(data, max_pixels)
    try:
        img.load()
    except (OSError, SyntaxError, ValueError, EOFError):
        raise InvalidImage("image data is corrupt or truncated") from None
    return img


def check_image_bytes(data: bytes, max_pixels: int) -> tuple[int, int]:
    """``(width, height)`` from the header alone, with the same checks as :func:`open_image`."""
    img = _open_checked(data, max_pixels)
    size = img.size
    img.close()
    return size


def _open_checked(data: bytes, max_pixels: int) -> Image.Image:
    try:
        # Pillow's own bomb guard warns before it errors; both mean "too many pixels". The
        # filter is process-global, so racing threads can at worst leave it set to "error",
        # which is the behaviour wanted anyway.
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageTooLarge("image has too many pixels") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError):
        raise InvalidImage("data is not a decodable image") from None
    width, height = img.size
    if width <= 0 or height <= 0:
        img.close()
        raise InvalidImage("image has zero width or height")
    if width * height > max_pixels:
        img.close()
        raise ImageTooLarge(f"image is {width}x{height} pixels, more than {max_pixels}")
    return img
