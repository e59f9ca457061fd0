"""Metrics: default-registry exposition and multiprocess aggregation across processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, Counter

from tandem_http import (
    MULTIPROC_ENV,
    mark_process_dead,
    metrics_registry,
    metrics_response,
    prepare_multiprocess_dir,
)


def test_default_registry_exposes_a_counter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    counter = Counter("tandem_http_test_default", "A counter for this test.")
    try:
        counter.inc(3)
        assert metrics_registry() is REGISTRY
        response = metrics_response()
        assert response.media_type is not None and response.media_type.startswith("text/plain")
        assert b"tandem_http_test_default_total 3.0" in bytes(response.body)
    finally:
        REGISTRY.unregister(counter)


def test_prepare_multiprocess_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # setenv first, so that monkeypatch restores the variable prepare_multiprocess_dir sets.
    monkeypatch.setenv(MULTIPROC_ENV, "")
    target = tmp_path / "metrics"
    target.mkdir()
    (target / "counter_123.db").write_bytes(b"stale")
    (target / "keep.txt").write_text("not ours")
    assert prepare_multiprocess_dir(target) == target
    assert os.environ[MULTIPROC_ENV] == str(target)
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"]

    # None reuses the folder the variable names...
    assert prepare_multiprocess_dir(None) == target
    # ...or makes a new one.
    monkeypatch.setenv(MULTIPROC_ENV, "")
    made = prepare_multiprocess_dir(None)
    try:
        assert made.is_dir() and os.environ[MULTIPROC_ENV] == str(made)
    finally:
        made.rmdir()


_WRITER = """
import os
from prometheus_client import Counter
from prometheus_client import Gauge
Counter("tandem_http_test_mp", "Counted in several processes.").inc()
Gauge("tandem_http_test_mp_in_flight", "Left raised on exit.", multiprocess_mode="livesum").inc()
print(os.getpid())
"""


def _run_writer(metrics_dir: Path) -> int:
    # A fresh interpreter per writer: prometheus_client picks its file-backed values when it is
    # first imported, so the variable must be set before that, as in a real worker.
    env = {**os.environ, MULTIPROC_ENV: str(metrics_dir)}
    out = subprocess.run(
        [sys.executable, "-c", _WRITER], env=env, capture_output=True, text=True, check=True
    )
    return int(out.stdout)


def test_multiprocess_collector_adds_up_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids = [_run_writer(tmp_path), _run_writer(tmp_path)]
    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))

    registry = metrics_registry()
    assert registry is not REGISTRY
    text = bytes(metrics_response().body).decode()
    assert "tandem_http_test_mp_total 2.0" in text
    assert registry.get_sample_value("tandem_http_test_mp_in_flight") == 2.0

    # A worker that is gone stops counting towards the live gauge (but not the counter).
    mark_process_dead(pids[0])
    registry = metrics_registry()
    assert registry.get_sample_value("tandem_http_test_mp_in_flight") == 1.0
    assert registry.get_sample_value("tandem_http_test_mp_total") == 2.0
