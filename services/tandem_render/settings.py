"""Render service settings: one frozen object, built from the command line or the environment."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem_http import (
    BodyDeadline,
    SendDeadline,
    settings_from_json,
    settings_to_json,
    usable_cores,
)

from .media import MediaPolicy

__all__ = ["RenderSettings", "SETTINGS_ENV"]

SETTINGS_ENV = "TANDEM_RENDER_SETTINGS"
"""Environment variable carrying the settings (JSON) from the launcher to worker processes."""

# Per-request processor kwargs that only choose resolution or sampling of frames; anything else
# could change what the engine computes or how much memory the processor takes.
DEFAULT_MM_KWARGS_ALLOWLIST = ("min_pixels", "max_pixels", "fps", "num_frames")


def render_default_workers() -> int:
    """Render's worker count when none is given: one per usable core but one, at least one.

    What starts render without a count is a one-box deployment (``make run``, the documented
    commands), where an engine shares the host: its scheduler loop (and, on a CPU build, its
    pinned worker) holds a core, and the door and generate's API process run beside it. A
    render worker per core then only adds processes that preempt those on the request's path
    (measured on 2 cores at c=8: 31 req/s with one render worker, 26-27 with two). Dedicated
    render nodes set ``--workers`` to their cores (the deploy manifests do)."""
    return max(1, usable_cores() - 1)


@dataclass(frozen=True)
class RenderSettings:
    """Everything the render service is configured with."""

    model: str
    """Model folder or hub name (tokenizer, chat template and processor configs; no weights)."""

    served_model_name: tuple[str, ...] = ()
    """Names clients may use in ``model``; defaults to ``model``."""

    tokenizer: str | None = None
    """Tokenizer folder or name when it differs from ``model``."""

    revision: str | None = None
    """Model revision, for hub names."""

    trust_remote_code: bool = False
    """Allow model-provided processor code (only for models you trust)."""

    max_model_len: int | None = None
    """Context length; defaults to the model's."""

    chat_template: str | None = None
    """A chat template file or string overriding the model's."""

    tool_call_parser: str | None = None
    """vLLM's tool-call parser (e.g. ``hermes``) for the derender routes (``tool_calls`` out of
    the generated text) and for rendering ``tool_choice: auto``; None: tool calls stay text.
    vLLM's option of the same name."""

    enable_auto_tool_choice: bool = False
    """Take ``tool_choice: auto`` (needs ``tool_call_parser``); vLLM's option of the same name."""

    exclude_tools_when_tool_choice_none: bool = False
    """Leave tool definitions out of the prompt when ``tool_choice`` is ``none`` (vLLM's)."""

    tool_strict_level: str = "auto"
    """vLLM's server-side floor for structural-tag tool calling: ``auto``, ``function`` or
    ``parameter`` (vLLM's option of the same name)."""

    reasoning_parser: str | None = None
    """vLLM's reasoning parser (e.g. ``deepseek_r1``, ``qwen3``): derender splits
    ``reasoning_content`` off, render resolves ``reasoning_ended``; None: no reasoning split."""

    default_chat_template_kwargs: dict[str, Any] | None = None
    """Chat template keyword arguments every request starts from (its own override them), e.g.
    ``{"enable_thinking": false}``; vLLM's option of the same name. None: none."""

    cohere_format: str | None = "cmd4"
    """The Cohere prompt format (``cmd4`` or ``cmd3``) added to the default chat template
    kwargs, as vLLM's option of the same name does for every model (other templates ignore it;
    it shows in render's ``reasoning_parser_kwargs``); None: not added."""

    host: str = "127.0.0.1"
    port: int = 8100
    uds: str | None = None
    """A Unix-domain socket path to listen on instead of ``host`` and ``port`` (``--uds``,
    as ``vllm serve``'s); clients name the node ``unix:PATH``. None: TCP."""
    workers: int = field(default_factory=render_default_workers)
    """Worker processes; rendering is CPU- and GIL-bound, so throughput grows with them up to
    the cores free for it (default: the usable cores but one, see ``render_default_workers``)."""

    inline_processing: bool = True
    """Tokenize, apply the chat template and decode/process media on each worker's event loop
    thread rather than in thread pools: workers are the parallelism, and thread hand-offs
    cost CPU (measured ~2 ms per request). I/O (media fetches) stays asynchronous."""

    api_key: str | tuple[str, ...] | None = None
    """When set, every route but /health needs ``Authorization: Bearer <key>``."""

    log_level: str = "info"

    max_body_bytes: int = 64 * 1024 * 1024
    """Largest request body accepted."""

    max_images_per_prompt: int | None = None
    """Most images in one prompt (one chat conversation or one completion prompt). By default
    the model's own limit as vLLM derives it (``--limit-mm-per-prompt``'s 999, capped by what
    the model supports): render takes what ``vllm serve`` takes. Set, it is vLLM's
    ``--limit-mm-per-prompt`` for images (still capped by the model)."""

    max_videos_per_prompt: int | None = None
    """Most videos in one prompt; by default the model's own limit, as for images."""

    max_audios_per_prompt: int | None = None
    """Most audio clips in one prompt; by default the model's own limit, as for images."""

    max_pending: int = 64
    """Requests a worker holds at once (rendering or waiting) before answering 429."""

    max_held_bytes: int | None = None
    """Bytes of request bodies a worker's admitted requests may hold (by Content-Length,
    before any is read); past it a request is answered 429 with Retry-After before its body
    is read, and one declaring more than all of it 413. None: a quarter of the memory limit
    (the cgroup's, else the host's RAM) shared by the workers; 0: no byte budget. What one
    request's media decode to is bounded apart (``max_decoded_request_bytes``)."""

    body_timeout_s: float = BodyDeadline.timeout_s
    """A request body's grace and the longest pause within it, in seconds: past either, 408
    ``body_timeout`` and the request is let go (``tandem_http.BodyDeadline``); 0: no deadline."""

    body_min_rate: int = BodyDeadline.min_rate
    """Bytes per second a request body must keep on average once ``body_timeout_s`` is spent."""

    send_timeout_s: float = SendDeadline.timeout_s
    """An answer's grace and the longest a write of it may wait on a caller that does not
    read, in seconds: past either, the connection is cut and the request let go, as when its
    caller hangs up (``tandem_http.SendDeadline``); 0: no deadline."""

    send_min_rate: int = SendDeadline.min_rate
    """Bytes per second a caller must read its answer at on average, in the time writes wait
    on it, once ``send_timeout_s`` is spent."""

    item_cache_bytes: int = 128 * 1024 * 1024
    """Bytes of encoded items kept per worker, keyed by mm_hash (media + processor kwargs)."""

    decoded_cache_bytes: int = 64 * 1024 * 1024
    """Bytes of decoded media kept per worker, keyed by a hash of the encoded bytes."""

    answer_cache_bytes: int = 128 * 1024 * 1024
    """Bytes of whole rendered answers kept per worker, keyed by the exact request bytes
    (only requests whose media are inline: data URLs or raw bytes)."""

    answer_cache_ttl_s: float = 60.0
    """How long a cached answer is served (templates may read the clock); 0 disables."""

    mm_processor_cache_gb: float = 0.125
    """vLLM's processor-only cache per worker (processed items by mm_hash, so a repeated image
    skips the HF processor); 0 disables it."""

    pretouch_cache_memory: bool = True
    """Keep freed memory in each worker and fault in the caches' byte budgets at start-up, so
    filling the caches does not make first-seen requests pay for fresh pages (measured:
    ~3 ms of CPU per first-seen image on our VMs)."""

    enable_mm_embeds: bool = False
    """Accept precomputed embeddings (``image_embeds`` content parts, safetensors) for models
    that take them (vLLM's option of the same name); refused with ``mm_embeds_disabled``
    otherwise. Generate needs it too."""
    answer_zstd_level: int = 1
    """zstd level of binary (msgpack) answers to callers whose ``Accept-Encoding`` names zstd;
    0 never compresses. JSON answers are never compressed (they stay upstream's bytes)."""

    mm_processor_kwargs_allowlist: tuple[str, ...] = DEFAULT_MM_KWARGS_ALLOWLIST
    """Keys a request may set in ``mm_processor_kwargs``."""

    max_kwargs_pixels: int | None = None
    """Largest ``min_pixels`` / ``max_pixels`` a request may set; by default the model's own
    ``max_pixels`` (a request may ask for less work than the model's default, never more)."""

    max_kwargs_frames: int | None = None
    """Largest ``num_frames`` a request may set; by default the video processor's own
    ``max_frames``."""

    allowed_media_domains: tuple[str, ...] | None = None
    """If set, http(s) media only from these domains (and their subdomains)."""

    allow_private_networks: bool = False
    """Let media URLs reach private, loopback and link-local addresses (development only)."""

    allowed_private_hosts: tuple[str, ...] = ()
    """Hosts or IPs exempt from the private-address block (e.g. an internal media store)."""

    allowed_local_media_path: str | None = None
    """A folder from which ``file://`` media may be read; ``file://`` is refused without it."""

    media_fetch_timeout_s: float = 10.0
    """Timeout of one remote media fetch, in seconds."""

    max_media_bytes: int = 32 * 1024 * 1024
    """Largest media object (encoded image, video or audio clip), in bytes."""

    max_image_pixels: int = 64 * 1024 * 1024
    """Largest declared image (width x height), checked before decoding."""

    max_video_seconds: float = 600.0
    """Longest video, from its container's frame count and rate, checked before decoding."""

    max_video_frames: int = 36_000
    """Most frames in a video's container (decoding seeks through them)."""

    max_decoded_video_bytes: int = 1024 * 1024 * 1024
    """Most bytes of decoded frames (RGB) one video may take."""

    max_decoded_request_bytes: int | None = None
    """Most bytes all of one request's media may decode to at once (images as RGB, videos'
    sampled frames as RGB, audio as float32 samples), judged from their headers before any
    decode. By default the model's own largest image (its processor's ``max_pixels``) times
    the prompt's image limit, at 3 bytes a pixel, capped at 1 GiB and never below one image
    at ``max_image_pixels``."""

    max_audio_seconds: float = 600.0
    """Longest audio clip, from its header; the decoder enforces it again (vLLM's default)."""

    max_audio_sample_rate: int = 192_000
    """Highest audio sample rate in Hz, from the header (clips are resampled to the model's)."""

    max_decoded_audio_bytes: int = 256 * 1024 * 1024
    """Most bytes one clip decodes to (float32, every channel), from the header; the decoder
    enforces it again (vLLM's default)."""

    def limit_mm_per_prompt(self) -> dict[str, int]:
        """The per-prompt item limits the operator set, as vLLM's ``--limit-mm-per-prompt``
        takes them (a modality left out keeps vLLM's default, capped by the model)."""
        limits = {
            "image": self.max_images_per_prompt,
            "video": self.max_videos_per_prompt,
            "audio": self.max_audios_per_prompt,
        }
        return {modality: n for modality, n in limits.items() if n is not None}

    def cache_budget_bytes(self) -> int:
        """What this worker's caches hold when full (vLLM's processor cache included)."""
        vllm_cache = int(self.mm_processor_cache_gb * 2**30)
        answers = self.answer_cache_bytes if self.answer_cache_ttl_s > 0 else 0
        return self.item_cache_bytes + self.decoded_cache_bytes + answers + vllm_cache

    def names(self) -> tuple[str, ...]:
        return self.served_model_name or (self.model,)

    def media_policy(self) -> MediaPolicy:
        return MediaPolicy(
            allowed_domains=self.allowed_media_domains,
            allow_private_networks=self.allow_private_networks,
            allowed_private_hosts=frozenset(self.allowed_private_hosts),
            allowed_local_media_path=(
                Path(self.allowed_local_media_path) if self.allowed_local_media_path else None
            ),
            fetch_timeout_s=self.media_fetch_timeout_s,
            max_media_bytes=self.max_media_bytes,
            max_image_pixels=self.max_image_pixels,
            max_audio_seconds=self.max_audio_seconds,
            max_audio_sample_rate=self.max_audio_sample_rate,
            max_decoded_audio_bytes=self.max_decoded_audio_bytes,
        )

    def to_json(self) -> str:
        return settings_to_json(self)

    @classmethod
    def from_json(cls, text: str) -> RenderSettings:
        return settings_from_json(cls, text)
