"""docs/models.md's table is the one the suites' parameters give (tools.supported_models)."""

from __future__ import annotations

from tools import supported_models
from tools.tiny_families import FAMILIES


def test_the_supported_models_page_is_current():
    page = supported_models.PAGE.read_text(encoding="utf-8")
    assert supported_models.rendered(page) == page, "run: python -m tools.supported_models"


def test_every_family_the_suite_runs_has_a_row():
    titles = {row.title for row in supported_models.rows()}
    assert {f.title for f in FAMILIES.values()} <= titles
