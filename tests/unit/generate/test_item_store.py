"""The generate item store: lookups counted, byte budget, keyed by content, tenants."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from tandem_generate.item_store import ItemStore, StoredItem
from tandem_generate.metrics import GenerateMetrics


def item(content: str, nbytes: int = 4) -> StoredItem:
    return StoredItem(content_id=content, item=None, wire={}, nbytes=nbytes)


@pytest.fixture
def metrics() -> GenerateMetrics:
    return GenerateMetrics.create(CollectorRegistry())


def counts(metrics: GenerateMetrics) -> tuple[float, float]:
    def value(counter) -> float:
        return counter.collect()[0].samples[0].value

    return value(metrics.item_cache_hits), value(metrics.item_cache_misses)


def test_only_lookups_count(metrics):
    store = ItemStore(100, metrics)
    store.put("", item("a"))
    store.put("", item("a"))  # the same item sent again with its data
    assert counts(metrics) == (0, 0)  # a put is neither a hit nor a miss
    assert store.get("", "a") == item("a")
    assert store.get("", "unknown") is None
    assert counts(metrics) == (1, 1)


def test_least_recently_used_items_go_first_and_oversize_ones_are_not_kept(metrics):
    store = ItemStore(10, metrics)
    store.put("", item("a"))
    store.put("", item("b"))
    assert store.get("", "a") is not None  # a is now the most recent
    store.put("", item("c"))
    assert store.get("", "b") is None and store.get("", "a") and store.get("", "c")
    store.put("", item("big", nbytes=11))
    assert store.get("", "big") is None


def test_items_are_scoped_by_tenant(metrics):
    store = ItemStore(100, metrics)
    store.put("t1", item("a"))
    assert store.get("t2", "a") is None and store.get("t1", "a") == item("a")


def test_clear_forgets_items(metrics):
    store = ItemStore(100, metrics)
    store.put("", item("a"))
    store.clear()
    assert store.get("", "a") is None
