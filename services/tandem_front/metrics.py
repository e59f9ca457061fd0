"""The front door's Prometheus metrics: per-upstream latency, errors and retries."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["FrontMetrics"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


@dataclass(frozen=True)
class FrontMetrics:
    upstream_latency: Histogram
    """Seconds from sending a request to an upstream until its answer's headers, by node."""
    upstream_errors: Counter
    """Upstream answers >= 400, failed connections and transport failures, by node and kind."""
    upstream_retries: Counter
    """Requests moved to another node because one could not be reached, by tier."""

    def forget(self, tier: str, url: str) -> None:
        """Drop every series of a node that left the fleet (discovery removed it): the label
        sets would otherwise grow with every address a DNS name ever had."""
        with warnings.catch_warnings():
            # Multiprocess mode keeps the series in its files (unimplemented removal): the
            # in-process ones go, and the door's /metrics leaves the files' out (see
            # ``tandem_http.metrics_response``'s ``keep``).
            warnings.simplefilter("ignore", UserWarning)
            for metric in (self.upstream_latency, self.upstream_errors):
                metric.remove_by_labels({"tier": tier, "node": url})

    @classmethod
    def create(cls, registry: CollectorRegistry) -> FrontMetrics:
        return cls(
            upstream_latency=Histogram(
                "tandem_front_upstream_latency_seconds",
                "Time to an upstream's answer headers",
                ["tier", "node"],
                buckets=_LATENCY_BUCKETS,
                registry=registry,
            ),
            upstream_errors=Counter(
                "tandem_front_upstream_errors",
                "Upstream answers >= 400 (kind=status), unreachable or draining nodes "
                "(kind=connect, draining) and transport failures (kind=upstream_timeout, ...)",
                ["tier", "node", "kind"],
                registry=registry,
            ),
            upstream_retries=Counter(
                "tandem_front_upstream_retries",
                "Requests moved to another node after a failed connection",
                ["tier"],
                registry=registry,
            ),
        )
