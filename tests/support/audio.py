"""Test audio: deterministic clips (a tone plus seeded noise) as WAV or FLAC bytes."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np


def waveform(seconds: float = 1.0, rate: int = 16_000, seed: int = 0, channels: int = 1):
    """A tone whose pitch the seed picks, with a little seeded noise; (frames,) or
    (frames, channels) float32 in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate), dtype=np.float64) / rate
    tone = 0.5 * np.sin(2 * np.pi * (220 + 40 * seed) * t)
    out = tone[:, None] + 0.05 * rng.standard_normal((t.size, channels))
    out = np.clip(out, -1, 1).astype(np.float32)
    return out[:, 0] if channels == 1 else out


def audio_bytes(
    seconds: float = 1.0,
    rate: int = 16_000,
    seed: int = 0,
    channels: int = 1,
    fmt: str = "WAV",
    subtype: str | None = "PCM_16",
) -> bytes:
    """The clip encoded by libsndfile (``fmt``: WAV, FLAC, OGG, ...)."""
    import soundfile

    data = waveform(seconds, rate, seed, channels)
    if subtype == "PCM_16":
        # Quantized here, so every container holds the very same samples.
        data = np.round(data * 32767).astype(np.int16)
    buf = io.BytesIO()
    soundfile.write(buf, data, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def input_audio_part(data: bytes, fmt: str = "wav") -> dict[str, Any]:
    """An OpenAI ``input_audio`` content part."""
    return {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(data).decode("ascii"), "format": fmt},
    }


def audio_url_part(url: str) -> dict[str, Any]:
    return {"type": "audio_url", "audio_url": {"url": url}}


def audio_chat(model: str, parts: list[dict[str, Any]], text: str = "What is this?", **extra):
    """A chat whose user message holds the audio parts, then the text."""
    content = [*parts, {"type": "text", "text": text}]
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}
