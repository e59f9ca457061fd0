"""Front door settings: one frozen object, built from the command line or the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from tandem_http import settings_from_json, settings_to_json

__all__ = ["FrontSettings", "LogprobsFormat", "SETTINGS_ENV"]

SETTINGS_ENV = "TANDEM_FRONT_SETTINGS"
"""Environment variable carrying the settings (JSON) from the launcher to worker processes."""

LogprobsFormat = Literal["auto", "vllm-0.32", "trl"]


@dataclass(frozen=True)
class FrontSettings:
    """Everything the front door is configured with."""

    render_urls: tuple[str, ...]
    """Base URLs of the render nodes (requests spread by pending count)."""

    generate_urls: tuple[str, ...]
    """Base URLs of the generate nodes (requests routed by first item hash)."""

    model: str
    """Model folder or hub name: its tokenizer detokenizes the OpenAI routes' answers."""

    served_model_name: tuple[str, ...] = ()
    """Names clients may use in ``model``; defaults to ``model``."""

    tokenizer: str | None = None
    """Tokenizer folder or name when it differs from ``model``."""

    trust_remote_code: bool = False

    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = field(default_factory=lambda: min(os.cpu_count() or 1, 4))

    api_key: str | None = None
    """When set, every route but /health needs ``Authorization: Bearer <key>``."""

    upstream_api_key: str | None = None
    """The key the front door presents to the render and generate nodes."""

    enable_control_routes: bool = False
    """Serve state-changing control routes without an API key (with a key they are served)."""

    logprobs_format: LogprobsFormat = "auto"
    """Shape of ``/inference/v1/generate`` logprob entries: ``vllm-0.32``, integer
    ``token_id`` entries as they come (the body passes through untouched); ``trl``, each entry
    also gets ``token: "token_id:<id>"``, the shape TRL 1.16's ``parse_logprobs`` reads;
    ``auto``, TRL's shape for requests that signal TRL (a ``request_id`` starting ``trl-``, as
    TRL's ``VLLMClient`` sends) and untouched otherwise. A request may also pick with the
    header ``X-Tandem-Logprobs-Format: trl|vllm-0.32``."""

    log_level: str = "info"

    max_body_bytes: int = 256 * 1024 * 1024
    """Largest request body forwarded (generate bodies carry tensors)."""

    connect_timeout_s: float = 5.0
    """Connection timeout per upstream attempt; a refused or timed-out connect is retried on
    another node (the request never reached the first)."""

    read_timeout_s: float = 600.0
    """Longest wait for an upstream's next bytes."""

    max_connections_per_upstream: int = 256

    health_interval_s: float = 2.0
    """How long a node's health answer is trusted by ``/health``."""

    node_cooldown_s: float = 5.0
    """How long a node that refused a connection comes last in routing."""

    def names(self) -> tuple[str, ...]:
        return self.served_model_name or (self.model,)

    def to_json(self) -> str:
        return settings_to_json(self)

    @classmethod
    def from_json(cls, text: str) -> FrontSettings:
        return settings_from_json(cls, text)
