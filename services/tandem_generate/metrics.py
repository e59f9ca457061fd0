"""Prometheus metrics of the generate service, and the engine's own (vLLM's) beside them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.metrics_core import Metric

__all__ = ["GenerateMetrics"]


@dataclass(frozen=True)
class GenerateMetrics:
    requests: Counter
    latency: Histogram
    generated_tokens: Counter
    item_cache_hits: Counter
    item_cache_misses: Counter
    bytes_in: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> GenerateMetrics:
        registry.register(_EngineMetrics())
        return cls(
            requests=Counter(
                "tandem_generate_requests",
                "Generate requests by outcome",
                ["outcome"],
                registry=registry,
            ),
            latency=Histogram(
                "tandem_generate_latency_seconds",
                "Time from admission to the last token",
                registry=registry,
                buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            ),
            generated_tokens=Counter(
                "tandem_generate_tokens", "Tokens generated", registry=registry
            ),
            item_cache_hits=Counter(
                "tandem_generate_item_cache_hits",
                "Null kwargs entries served from the cache",
                registry=registry,
            ),
            item_cache_misses=Counter(
                "tandem_generate_item_cache_misses",
                "Null kwargs entries not held: answered 409, resend",
                registry=registry,
            ),
            bytes_in=Counter(
                "tandem_generate_request_bytes",
                "Request body bytes",
                ["format"],
                registry=registry,
            ),
        )


class _EngineMetrics:
    """vLLM's engine metrics (``vllm:*``: requests running and waiting, KV cache usage, token
    counts, latencies), as the engine reports them. vLLM's stat logger registers them in
    prometheus_client's default registry; this collector shows them on the app's /metrics."""

    def describe(self) -> Iterable[Metric]:
        # Nothing to check for clashes at registration: the names are vLLM's, not ours, and the
        # engine (which creates them) starts after the app is built.
        return ()

    def collect(self) -> Iterable[Metric]:
        return [m for m in REGISTRY.collect() if m.name.startswith("vllm:")]
