"""Test images: deterministic PNG/JPEG bytes and data URLs."""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image


def png_bytes(width: int = 224, height: int = 224, seed: int = 0, noise: bool = True) -> bytes:
    """A PNG of random noise (seeded) or a solid colour chosen by the seed."""
    rng = np.random.default_rng(seed)
    if noise:
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    else:
        pixels = np.full((height, width, 3), rng.integers(0, 256, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


def photo_jpeg(seed: int, width: int = 1280, height: int = 720) -> bytes:
    """A photo-like JPEG (720p by default): smooth gradients with a little seeded noise, a
    few hundred KB on the wire."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (width + height)], -1)
    pixels = np.clip(base + rng.integers(-12, 13, base.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=85)
    return out.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64," + base64.b64encode(data).decode("ascii")


def chat_body(
    model: str, images: Sequence[str | bytes], text: str = "Describe.", **extra: object
) -> dict[str, Any]:
    """An OpenAI chat request with the images (URLs, or raw bytes as image_bytes parts).

    A JSON document, typed loosely so that callers can reach into it."""
    parts: list[dict[str, object]] = []
    for img in images:
        if isinstance(img, bytes):
            parts.append({"type": "image_bytes", "image_bytes": img})
        else:
            parts.append({"type": "image_url", "image_url": {"url": img}})
    parts.append({"type": "text", "text": text})
    return {"model": model, "messages": [{"role": "user", "content": parts}], **extra}


def mp4_bytes(frames: int = 8, size: int = 112, fps: int = 4, seed: int = 0) -> bytes:
    """A short noise video (mp4v), written with OpenCV through a temporary file."""
    import os
    import tempfile

    import cv2

    fd, path = tempfile.mkstemp(suffix=".mp4")
    os.close(fd)
    try:
        writer = cv2.VideoWriter(path, cv2.VideoWriter.fourcc(*"mp4v"), fps, (size, size))
        rng = np.random.default_rng(seed)
        for _ in range(frames):
            writer.write(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
        writer.release()
        with open(path, "rb") as f:
            return f.read()
    finally:
        os.unlink(path)
