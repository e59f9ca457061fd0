"""Generate service settings (the API side; vLLM's engine options travel as AsyncEngineArgs)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GenerateSettings"]


@dataclass(frozen=True)
class GenerateSettings:
    """Everything the HTTP side of the generate service is configured with."""

    served_model_names: tuple[str, ...]
    """Names clients may use in ``model`` (null ``model`` means the first)."""

    host: str = "127.0.0.1"
    port: int = 8200
    api_key: str | None = None
    """When set, every route but /health needs ``Authorization: Bearer <key>``."""

    log_level: str = "info"
    max_body_bytes: int = 256 * 1024 * 1024
    """Largest request body (several images of pixels)."""

    max_items_per_prompt: int = 32
    """Most multimodal items in one request."""

    max_pending: int = 256
    """Requests admitted (decoding, queued or running) before answering 429."""

    item_cache_bytes: int = 2 * 1024 * 1024 * 1024
    """Bytes of decoded items kept for null ``kwargs_data`` entries (per tenant and hash)."""

    disconnect_poll_s: float = 0.25
    """How often a non-streaming request checks whether its client went away."""
