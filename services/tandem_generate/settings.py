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
    api_key: str | tuple[str, ...] | None = None
    """When set, every route but /health needs ``Authorization: Bearer <key>``."""

    enable_control_routes: bool = False
    """With no ``api_key``, state-changing control routes (pause, resume, abort, weight
    updates, cache reset) answer 403 unless this is set; with a key they need the key."""

    weight_transfer_dir: str | None = None
    """The folder ``tandem_file`` weight updates are read from (paths outside it are refused);
    trainer and server must both see it (same machine or a shared filesystem)."""

    log_level: str = "info"
    max_body_bytes: int | None = None
    """Largest request body; by default what the model can take (its context filled with
    item tokens, see ``ModelSpec.max_request_bytes``)."""

    max_items_per_prompt: int = 32
    """Most multimodal items in one request."""

    max_pending: int = 256
    """Requests admitted (decoding, queued or running) before answering 429."""

    allow_request_priority: bool = False
    """Honour the ``priority`` a request sets (with ``--scheduling-policy priority`` a caller
    could otherwise put itself ahead of everyone); off: every request runs at priority 0."""

    item_cache_bytes: int = 2 * 1024 * 1024 * 1024
    """Bytes of decoded items kept for null ``kwargs_data`` entries (per tenant and hash)."""

    pretouch_item_cache: bool = True
    """Keep freed memory in the process and fault in the item cache's budget at start-up, so
    filling the cache does not make requests pay for fresh pages (measured: ~2 ms of API CPU
    per request with an image on our VMs)."""

    disconnect_poll_s: float = 0.25
    """How often a non-streaming request checks whether its client went away."""
