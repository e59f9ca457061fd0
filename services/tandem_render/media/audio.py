"""Audio checks: sample rate, duration and decoded size, read from the header before decoding."""

from __future__ import annotations

import io
from dataclasses import dataclass

import soundfile  # type: ignore[import-untyped]

from ..errors import MediaError, MediaTooLarge

__all__ = [
    "AudioDecoding",
    "AudioHeader",
    "AudioLimits",
    "MIN_AUDIO_SAMPLE_RATE",
    "check_audio_bytes",
]

MIN_AUDIO_SAMPLE_RATE = 1000
"""Below this a stream is not speech or sound any model takes (telephony is 8 kHz)."""

_FLOAT32 = 4  # bytes per decoded sample: vLLM's decoders hand out float32


@dataclass(frozen=True)
class AudioLimits:
    """What one audio clip may cost, judged from its header."""

    max_seconds: float
    max_sample_rate: int
    max_decoded_bytes: int
    """Bytes of the decoded waveform, every channel, as float32 (before the mono downmix)."""


@dataclass(frozen=True)
class AudioDecoding:
    """How a clip is decoded: under the clip limits (again, since a header may lie), then
    resampled to the model's rate."""

    limits: AudioLimits
    sample_rate: int | None
    """The model's feature extractor's rate; None leaves clips at their own rate."""


@dataclass(frozen=True)
class AudioHeader:
    """What an audio container states about its stream."""

    sample_rate: int
    channels: int
    frames: int
    format: str

    @property
    def seconds(self) -> float:
        return self.frames / self.sample_rate


def read_audio_header(data: bytes) -> AudioHeader:
    """The stream's header, read by libsndfile (the decoder vLLM uses for these formats)."""
    try:
        info = soundfile.info(io.BytesIO(data))
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError, EOFError):
        raise MediaError(
            "data is not audio this server decodes (WAV, FLAC, MP3, OGG/Vorbis/Opus, AIFF, ...)"
        ) from None
    return AudioHeader(
        sample_rate=int(info.samplerate),
        channels=int(info.channels),
        frames=int(info.frames),
        format=str(info.format),
    )


def check_audio_bytes(data: bytes, limits: AudioLimits) -> AudioHeader:
    """The header of ``data``, refusing a clip whose sample rate, duration or decoded size is
    out of bounds before a sample is decoded (the decoder enforces the same bounds again, in
    case the header lies)."""
    header = read_audio_header(data)
    if header.sample_rate < MIN_AUDIO_SAMPLE_RATE or header.channels < 1 or header.frames < 1:
        raise MediaError(
            f"the audio states {header.frames} frames of {header.channels} channel(s) at "
            f"{header.sample_rate} Hz; at least one frame of one channel at "
            f"{MIN_AUDIO_SAMPLE_RATE} Hz or more is needed"
        )
    decoded = header.frames * header.channels * _FLOAT32
    for what, value, bound in (
        ("Hz sample rate", header.sample_rate, limits.max_sample_rate),
        ("seconds", header.seconds, limits.max_seconds),
        ("bytes of decoded samples", decoded, limits.max_decoded_bytes),
    ):
        if value > bound:
            raise MediaTooLarge(f"the audio has {value:.0f} {what}, more than {bound}")
    return header
