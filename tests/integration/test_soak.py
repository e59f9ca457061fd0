"""The soak's short form (make soak runs the long one): a minute of saturating mixed load on
its own render, generate and front door, with every check of tools/soak.py."""

from __future__ import annotations

import os

import pytest

from tools.soak import SoakConfig, print_report, run

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.engine]


def test_a_minute_at_saturation_loses_nothing_and_leaks_nothing(tmp_path):
    cfg = SoakConfig(
        seconds=float(os.environ.get("TANDEM_SOAK_SECONDS", "60")),
        concurrency=10,
        generate_max_pending=6,
        replay=24,
        out=tmp_path,
        window_s=10.0,
    )
    report = run(cfg)
    print_report(report, cfg)
    assert report.failures == []
    # Saturated: the queue filled (429s were answered and retried), and every route ran.
    assert report.overloaded > 0
    assert set(report.by_route) == {"direct", "front", "chat"}
    assert (tmp_path / "soak.png").stat().st_size > 0
