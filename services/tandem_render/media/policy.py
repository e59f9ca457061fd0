"""The media policy: the sources, sizes and deadlines the loader accepts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .audio import AudioLimits

__all__ = ["MediaPolicy"]


@dataclass(frozen=True)
class MediaPolicy:
    """Where media may come from and how much of it is accepted."""

    allowed_schemes: frozenset[str] = frozenset({"http", "https", "data"})
    """URL schemes accepted. ``file`` is accepted if and only if ``allowed_local_media_path`` is
    set, whatever this set says."""
    allowed_domains: tuple[str, ...] | None = None
    """Hosts http(s) media may come from; ``None`` means any public host. An entry matches the
    host itself and its subdomains (``example.com`` matches ``cdn.example.com``)."""
    allow_private_networks: bool = False
    """Allow private, loopback, link-local and reserved addresses (trusted networks only)."""
    allowed_private_hosts: frozenset[str] = frozenset()
    """Host names or IPs exempt from the private-address check (tests, dev: ``127.0.0.1``)."""
    allowed_local_media_path: Path | None = None
    """Folder ``file:`` URLs may read from (symlinks are resolved first); ``None`` refuses
    ``file:``."""
    fetch_timeout_s: float = 10.0
    """Deadline in seconds for one http(s) load: DNS, every redirect hop and the whole body."""
    max_media_bytes: int = 32 * 1024 * 1024
    """Largest media item in bytes, for every scheme."""
    max_redirects: int = 3
    """Redirects followed per http(s) load; more is a fetch failure."""
    max_image_pixels: int = 64 * 1024 * 1024
    """Largest image accepted, as width * height, checked from the header before decoding."""
    max_audio_seconds: float = 600.0
    """Longest audio clip, from its header's frame count and sample rate."""
    max_audio_sample_rate: int = 192_000
    """Highest audio sample rate in Hz (resampling cost grows with it)."""
    max_decoded_audio_bytes: int = 256 * 1024 * 1024
    """Largest decoded audio (every channel, float32), from the header."""
    user_agent: str = "tandem-render"
    """User-Agent sent with http(s) requests."""

    @property
    def audio_limits(self) -> AudioLimits:
        return AudioLimits(
            max_seconds=self.max_audio_seconds,
            max_sample_rate=self.max_audio_sample_rate,
            max_decoded_bytes=self.max_decoded_audio_bytes,
        )
