"""docs/models.md's table is the one the suites' parameters give (tools.supported_models)."""

from __future__ import annotations

import pytest

from tools import supported_models
from tools.tiny_families import FAMILIES


def test_the_supported_models_page_is_current():
    page = supported_models.PAGE.read_text(encoding="utf-8")
    assert supported_models.rendered(page) == page, "run: python -m tools.supported_models"


def test_every_family_the_suite_runs_has_a_row():
    titles = {row.title for row in supported_models.rows()}
    assert {f.title for f in FAMILIES.values()} <= titles


def test_every_family_vllm_serves_that_transformers_holds_is_proven_or_says_why_not():
    """vLLM's registry of multimodal architectures, against transformers' auto classes: each
    one both know is a row of the table or in ``UNTESTED`` with its reason, and no row of
    the untested list is proven already."""
    transformers = pytest.importorskip("transformers")
    registry = pytest.importorskip("vllm.model_executor.models.registry")
    auto = transformers.models.auto.modeling_auto
    held: set[str] = set()
    for name in dir(auto):
        mapping = getattr(auto, name)
        if name.startswith("MODEL_") and name.endswith("_NAMES") and isinstance(mapping, dict):
            for value in mapping.values():
                held |= {value} if isinstance(value, str) else set(value)
    both = held & set(registry._MULTIMODAL_MODELS)
    proven = {row.architecture for row in supported_models.rows()}
    assert both - proven == set(supported_models.UNTESTED)
