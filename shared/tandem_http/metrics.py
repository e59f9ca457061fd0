"""Prometheus metrics that add up across uvicorn worker processes."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Metric,
    generate_latest,
    multiprocess,
)
from starlette.responses import Response

__all__ = [
    "MULTIPROC_ENV",
    "mark_process_dead",
    "metrics_registry",
    "metrics_response",
    "prepare_multiprocess_dir",
]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus_client's switch: when set, every process writes its values to files there."""


def metrics_registry(own: CollectorRegistry | None = None) -> CollectorRegistry:
    """The registry to expose: all workers' files in multiprocess mode, else ``own`` (an app's
    private registry) or the default one."""
    if os.environ.get(MULTIPROC_ENV):
        # A fresh registry per scrape, as prometheus_client documents: the collector reads the
        # files of every process (live or dead) at collection time.
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry
    return own if own is not None else REGISTRY


def metrics_response(
    own: CollectorRegistry | None = None,
    keep: Callable[[dict[str, str]], bool] | None = None,
) -> Response:
    """The ``GET /metrics`` answer: Prometheus text exposition of metrics_registry(own);
    ``keep`` (given a series' labels) drops the series it says no to (in multiprocess mode the
    files keep every series a worker ever wrote, those of nodes long gone included)."""
    registry: Any = metrics_registry(own)
    if keep is not None:
        registry = _Kept(registry, keep)
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


class _Kept:
    """A registry's metrics with only the series ``keep`` says yes to (a collector
    ``generate_latest`` reads as it reads a registry)."""

    def __init__(self, registry: CollectorRegistry, keep: Callable[[dict[str, str]], bool]):
        self.registry = registry
        self.keep = keep

    def collect(self) -> Iterator[Metric]:
        for metric in self.registry.collect():
            metric.samples = [s for s in metric.samples if self.keep(s.labels)]
            yield metric


def prepare_multiprocess_dir(path: Path | None = None) -> Path:
    """Create (or empty) the multiprocess metrics folder and set PROMETHEUS_MULTIPROC_DIR.

    Call it in the parent process BEFORE any worker starts and before anything in the parent
    creates a metric: prometheus_client picks its file-backed value class when it is first
    imported in a process, from this variable. ``None`` means the folder the variable already
    names, or a new temporary folder. Stale ``*.db`` files of an earlier run are deleted, or
    their counts would be added to this run's.
    """
    if path is None:
        current = os.environ.get(MULTIPROC_ENV)
        path = Path(current) if current else Path(tempfile.mkdtemp(prefix="tandem-metrics-"))
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink()
    os.environ[MULTIPROC_ENV] = str(path)
    return path


def mark_process_dead(pid: int) -> None:
    """Drop a gone worker's live gauges (``livesum``...); call from a worker-exit hook or at a
    worker's own shutdown. No-op outside multiprocess mode."""
    if os.environ.get(MULTIPROC_ENV):
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
