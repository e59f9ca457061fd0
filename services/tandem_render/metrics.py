"""Prometheus metrics of the render service (per worker; summed over workers on scrape)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["RenderMetrics"]


@dataclass(frozen=True)
class RenderMetrics:
    requests: Counter
    latency: Histogram
    media_bytes: Counter
    bytes_out: Counter
    item_cache_hits: Counter
    item_cache_misses: Counter
    answer_cache_hits: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> RenderMetrics:
        return cls(
            requests=Counter(
                "tandem_render_requests",
                "Render requests by route and outcome",
                ["route", "outcome"],
                registry=registry,
            ),
            latency=Histogram(
                "tandem_render_latency_seconds",
                "Render latency (screen, fetch, render)",
                ["route"],
                registry=registry,
                buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
            ),
            media_bytes=Counter(
                "tandem_render_media_bytes", "Media bytes received or fetched", registry=registry
            ),
            bytes_out=Counter(
                "tandem_render_response_bytes",
                "Response body bytes",
                ["format"],
                registry=registry,
            ),
            item_cache_hits=Counter(
                "tandem_render_item_cache_hits",
                "Encoded items served from the cache",
                registry=registry,
            ),
            item_cache_misses=Counter(
                "tandem_render_item_cache_misses", "Items encoded anew", registry=registry
            ),
            answer_cache_hits=Counter(
                "tandem_render_answer_cache_hits",
                "Requests answered from the cache of identical recent requests",
                registry=registry,
            ),
        )
