"""The soak's short form (make soak runs the long one): a minute of the same saturating mix through
the front door (OpenAI chat, TRL's render-then-generate, tandem_client rollouts, a weight update,
fresh images) on its own render, generate and front door, with every check of tools/soak.py."""

from __future__ import annotations

import os

import pytest

from tools.soak import KINDS, SoakConfig, print_report, run

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
    # Saturated: the queue filled (429s were answered and retried), every kind of client ran,
    # and the weights changed under the load (rollouts saw a label the update set).
    assert report.overloaded > 0
    assert set(report.by_kind) == set(KINDS)
    assert len(report.updates) >= 1
    assert any(v.startswith("soak-") for v in report.versions_seen)
    assert (tmp_path / "soak.png").stat().st_size > 0
