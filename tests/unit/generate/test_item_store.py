"""The generate item store: lookups counted, byte budget, contested hashes, tenants."""

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
    store.put("", "h", item("a"))
    store.put("", "h", item("a"))  # the same item sent again with its data
    assert counts(metrics) == (0, 0)  # a put is neither a hit nor a miss
    assert store.get("", "h") == item("a")
    assert store.get("", "unknown") is None
    assert counts(metrics) == (1, 1)


def test_least_recently_used_items_go_first_and_oversize_ones_are_not_kept(metrics):
    store = ItemStore(10, metrics)
    store.put("", "a", item("a"))
    store.put("", "b", item("b"))
    assert store.get("", "a") is not None  # a is now the most recent
    store.put("", "c", item("c"))
    assert store.get("", "b") is None and store.get("", "a") and store.get("", "c")
    store.put("", "big", item("big", nbytes=11))
    assert store.get("", "big") is None


def test_items_are_scoped_by_tenant(metrics):
    store = ItemStore(100, metrics)
    store.put("t1", "h", item("a"))
    assert store.get("t2", "h") is None and store.get("t1", "h") == item("a")


def test_a_contested_hash_is_never_served_even_after_its_items_are_evicted(metrics):
    store = ItemStore(8, metrics)
    store.put("", "h", item("victim"))
    store.put("", "h", item("attacker"))  # other content under the same hash: contested
    assert store.get("", "h") is None
    for filler in "xyz":  # evict everything the item budget holds
        store.put("", filler, item(filler))
    store.put("", "h", item("attacker"))  # registering again does not lift the mark
    assert store.get("", "h") is None
    store.put("t2", "h", item("attacker"))  # other tenants are not affected
    assert store.get("t2", "h") == item("attacker")


def test_contested_keys_have_their_own_budget(metrics):
    store = ItemStore(100, metrics, contested_bytes=300)
    for key in ("h1", "h2"):  # each contested key costs 256 bytes plus its characters
        store.put("", key, item("a"))
        store.put("", key, item("b"))
    store.put("", "h1", item("c"))  # h1's mark made room for h2's: h1 is held again
    assert store.get("", "h1") == item("c") and store.get("", "h2") is None


def test_clear_forgets_items_and_marks(metrics):
    store = ItemStore(100, metrics)
    store.put("", "h", item("a"))
    store.put("", "h", item("b"))
    store.clear()
    store.put("", "h", item("b"))
    assert store.get("", "h") == item("b")
