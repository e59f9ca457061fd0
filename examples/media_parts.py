"""One chat content part per modality, as vLLM's chat API takes them (shared by the examples).

    image: {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}
    video: {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,..."}}
    audio: {"type": "input_audio", "input_audio": {"data": "<base64 WAV>", "format": "wav"}}

``image_url``, ``video_url`` and ``audio_url`` also take http(s) URLs (and file:// URLs under the
render server's --allowed-local-media-path).
"""

from __future__ import annotations

import base64
import io
import math
import os
import struct
import tempfile
import wave
from typing import Any

MEDIA = ("image", "video", "audio")
QUESTIONS = {
    "image": "What color is this image?",
    "video": "What happens in this video?",
    "audio": "What do you hear?",
}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def red_png(size: int = 224) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), (255, 0, 0)).save(buf, "PNG")
    return buf.getvalue()


def color_cycle_mp4(frames: int = 8, size: int = 112, fps: int = 4) -> bytes:
    """A 2-second clip of frames turning from red to blue (OpenCV writes it; vLLM decodes with
    OpenCV too)."""
    import cv2
    import numpy as np

    fd, path = tempfile.mkstemp(suffix=".mp4")
    os.close(fd)
    try:
        writer = cv2.VideoWriter(path, cv2.VideoWriter.fourcc(*"mp4v"), fps, (size, size))
        for i in range(frames):
            bgr = (int(255 * i / (frames - 1)), 0, int(255 * (1 - i / (frames - 1))))
            writer.write(np.full((size, size, 3), bgr, np.uint8))
        writer.release()
        with open(path, "rb") as f:
            return f.read()
    finally:
        os.unlink(path)


def tone_wav(seconds: float = 1.0, rate: int = 16_000, hz: float = 440.0) -> bytes:
    """A sine tone as 16-bit mono WAV (the standard library writes it). Any rate works: render
    resamples to the model's (16 kHz for Qwen2-Audio)."""
    frames = b"".join(
        struct.pack("<h", int(12_000 * math.sin(2 * math.pi * hz * i / rate)))
        for i in range(int(seconds * rate))
    )
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(frames)
    return buf.getvalue()


def media_part(kind: str) -> dict[str, Any]:
    """The content part for one ``kind`` of media (see the module docstring)."""
    if kind == "image":
        return {
            "type": "image_url",
            "image_url": {"url": "data:image/png;base64," + b64(red_png())},
        }
    if kind == "video":
        url = "data:video/mp4;base64," + b64(color_cycle_mp4())
        return {"type": "video_url", "video_url": {"url": url}}
    if kind == "audio":
        return {"type": "input_audio", "input_audio": {"data": b64(tone_wav()), "format": "wav"}}
    raise ValueError(f"unknown media {kind!r}; choose from {', '.join(MEDIA)}")


def user_message(kind: str) -> dict[str, Any]:
    """A user turn holding one ``kind`` of media and a question about it."""
    content = [media_part(kind), {"type": "text", "text": QUESTIONS[kind]}]
    return {"role": "user", "content": content}
