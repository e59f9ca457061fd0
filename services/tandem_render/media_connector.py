"""A vLLM media connector that serves only media this service fetched and vetted itself."""

from __future__ import annotations

import asyncio
import io
from dataclasses import dataclass
from typing import Any

import blake3
import numpy as np
from vllm import envs
from vllm.multimodal.audio import resample_audio_scipy
from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY, AudioMediaIO, MediaConnector
from vllm.multimodal.media.audio import load_audio
from vllm.multimodal.media.connector import global_thread_pool

from tandem_vllm.items import numpy_to_tensor

from .caches import DecodedCache
from .errors import InvalidImage, MediaError, MediaSchemeNotAllowed, MediaTooLarge
from .media import AudioDecoding
from .prepare import MEDIA_URL_PREFIX
from .render_call import current

__all__ = [
    "CONNECTOR_NAME",
    "PrefetchedMediaConnector",
    "decode_audio",
    "VideoLimits",
    "check_video_bytes",
    "DecodedCache",
    "decode_media",
    "decoded_size",
    "register_connector",
]

CONNECTOR_NAME = "tandem-prefetched"

_INLINE = False  # set once per process by register_connector


def decoded_size(media: Any) -> int:
    """Bytes a decoded media object holds (pixels plus the original encoded bytes)."""
    inner = getattr(media, "media", media)
    original = len(getattr(media, "original_bytes", b""))
    if hasattr(inner, "size") and hasattr(inner, "getbands"):  # a PIL image
        w, h = inner.size
        bands: int = len(inner.getbands())
        return int(w) * int(h) * bands + original
    if isinstance(inner, tuple):  # audio: (waveform, rate); video: (frames, metadata)
        return sum(int(getattr(part, "nbytes", 0)) for part in inner) + original
    nbytes: int = getattr(inner, "nbytes", 0)
    return nbytes + original


@dataclass(frozen=True)
class VideoLimits:
    """What one video may cost, checked from its container before any frame is decoded."""

    max_seconds: float
    max_frames: int
    """Frames in the container (decoding seeks through them)."""
    max_frame_pixels: int
    max_decoded_bytes: int
    """Bytes of the frames vLLM samples and decodes (RGB), at the request's ``num_frames``."""


def check_video_bytes(data: bytes, limits: VideoLimits, sampled_frames: int) -> int:
    """Read the container's header with vLLM's own OpenCV opener and refuse a video whose
    duration, frame count, frame size or decoded frames exceed ``limits``; else the bytes
    its sampled frames decode to (RGB)."""
    import cv2
    from vllm.multimodal.video_decoders.opencv import OpenCVVideoBackendMixin

    # The stream stays referenced until the capture is released: OpenCV reads it lazily,
    # and releasing a capture whose stream was collected crashes the process.
    stream = io.BytesIO(data)
    api = OpenCVVideoBackendMixin.get_cv2_video_api()  # type: ignore[no-untyped-call]
    # OpenCV's stubs lack its buffered-stream overload (the one vLLM itself uses).
    cap = cv2.VideoCapture(stream, api, [])  # type: ignore[call-overload]
    try:
        if not cap.isOpened():
            raise MediaError("could not open the video")
        frames = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
        fps = float(cap.get(cv2.CAP_PROP_FPS))
        width = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH))
        height = int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
    finally:
        cap.release()
        del stream
    if frames <= 0 or width <= 0 or height <= 0:
        raise MediaError("the video's container states no frames or no frame size")
    seconds = frames / fps if fps > 0 else float("inf")
    decoded = min(sampled_frames, frames) * width * height * 3
    for what, value, bound in (
        ("frames", frames, limits.max_frames),
        ("seconds", seconds, limits.max_seconds),
        ("pixels per frame", width * height, limits.max_frame_pixels),
        ("bytes of decoded frames", decoded, limits.max_decoded_bytes),
    ):
        if value > bound:
            raise MediaTooLarge(f"the video has {value:.0f} {what}, more than {bound}")
    return decoded


def decode_audio(media_io: Any, data: bytes, how: AudioDecoding) -> tuple[np.ndarray, int]:
    """vLLM's audio decode of ``data`` (libsndfile unless the operator chose another backend),
    bounded by ``how.limits``, at the model's sample rate.

    The resampling is vLLM's own scipy method. vLLM's default (torchaudio) has no build for
    the torch this project runs, where vLLM refuses any clip not already at the model's rate;
    resampling here also makes every render node resample alike, whatever is installed.
    """
    try:
        audio, rate = load_audio(
            io.BytesIO(data),
            sr=None,
            max_duration_s=how.limits.max_seconds,
            max_decode_bytes=how.limits.max_decoded_bytes,
            backend=media_io.audio_backend or "soundfile",
        )
    except ValueError as exc:
        # vLLM raises ValueError for both; only its limit messages say "exceed(s/ed/ing)".
        if "exceed" in str(exc):
            raise MediaTooLarge(
                "the audio decodes past its header's length or the decoded-size limit"
            ) from None
        raise MediaError("could not decode the audio") from None
    except (RuntimeError, OSError, EOFError):  # libsndfile's errors on corrupt streams
        raise MediaError("could not decode the audio") from None
    if how.sample_rate is not None and int(rate) != how.sample_rate:
        audio = resample_audio_scipy(audio, orig_sr=rate, target_sr=how.sample_rate)
        rate = how.sample_rate
    return np.asarray(audio, dtype=np.float32), int(rate)


def _lookup(url: str) -> tuple[bytes, DecodedCache | None, AudioDecoding | None]:
    # Defence in depth: the walker rewrote every media URL, so anything else reaching vLLM
    # (a URL smuggled through a field we do not walk) is refused, never fetched. vLLM builds
    # this connector itself, so the request's media arrive through its RenderCall.
    call = current()
    data = call.media.get(url) if call is not None and url.startswith(MEDIA_URL_PREFIX) else None
    if data is None or call is None:
        raise MediaSchemeNotAllowed("media must come from a supported content part")
    return data, call.decoded, call.audio


def _lookup_embeds(token: str) -> Any:
    # Only tensors the request's embedding parts were decoded and checked into (prepare.py);
    # vLLM's own fetch would base64-decode and torch.load() whatever string it is handed.
    call = current()
    tensor = call.embeds.get(token) if call is not None else None
    if tensor is None:
        raise MediaSchemeNotAllowed("embeddings must come from a supported content part")
    return numpy_to_tensor(tensor)


def decode_media(
    media_io: Any,
    data: bytes,
    decoded: DecodedCache | None = None,
    audio: AudioDecoding | None = None,
) -> Any:
    """vLLM's decode of ``data`` (what it hashes and processes), through the cache if given;
    audio as ``audio`` says when given."""
    is_audio = audio is not None and isinstance(media_io, AudioMediaIO)
    key = None
    if decoded is not None:
        settings = repr(sorted((k, repr(v)) for k, v in vars(media_io).items()))
        if is_audio:
            settings += repr(audio)
        key = (type(media_io).__name__ + settings, blake3.blake3(data).hexdigest())
        hit = decoded.get(key)
        if hit is not None:
            return hit
    if is_audio and audio is not None:
        media: Any = decode_audio(media_io, data, audio)
    else:
        try:
            media = media_io.load_bytes(data)
        except (ValueError, OSError) as exc:
            raise InvalidImage(f"could not decode media: {str(exc)[:120]}") from None
    if key is not None and decoded is not None:
        decoded.put(key, media)
    return media


class PrefetchedMediaConnector(MediaConnector):
    """Decodes prefetched bytes with vLLM's own media IO, so items and hashes match upstream."""

    def load_from_url(self, url: str, media_io: Any, *, fetch_timeout: int | None = None) -> Any:
        return decode_media(media_io, *_lookup(url))

    async def load_from_url_async(
        self, url: str, media_io: Any, *, fetch_timeout: int | None = None
    ) -> Any:
        data, decoded, audio = _lookup(url)
        if _INLINE:
            return decode_media(media_io, data, decoded, audio)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            global_thread_pool, decode_media, media_io, data, decoded, audio
        )

    # Every embedding fetch serves only the request's checked tensors (none of them loads).
    def fetch_image_embedding(self, data: str) -> Any:
        return _lookup_embeds(data)

    async def fetch_image_embedding_async(self, data: str) -> Any:
        return _lookup_embeds(data)

    def fetch_audio_embedding(self, data: str) -> Any:
        return _lookup_embeds(data)

    async def fetch_audio_embedding_async(self, data: str) -> Any:
        return _lookup_embeds(data)

    def fetch_video_embedding(self, data: str) -> Any:
        return _lookup_embeds(data)

    async def fetch_video_embedding_async(self, data: str) -> Any:
        return _lookup_embeds(data)


def register_connector(*, inline: bool = False) -> None:
    """Make this connector the one vLLM loads in this process (idempotent); ``inline``
    decodes on the calling thread instead of vLLM's media thread pool.

    It takes the place of vLLM's default entry rather than being chosen through
    ``VLLM_MEDIA_CONNECTOR``: an environment variable would leak into every child process
    (including other vLLM servers), and in a render process vLLM must never fetch anything.
    """
    global _INLINE
    _INLINE = inline
    MEDIA_CONNECTOR_REGISTRY.register(CONNECTOR_NAME)(PrefetchedMediaConnector)
    MEDIA_CONNECTOR_REGISTRY.register(envs.VLLM_MEDIA_CONNECTOR)(PrefetchedMediaConnector)
