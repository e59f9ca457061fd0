"""The byte-budget LRU: eviction order, budget accounting, oversized values."""

from __future__ import annotations

from tandem_wire import ByteBudgetLRU


def make(budget=10):
    return ByteBudgetLRU[str, bytes](budget, len)


def test_evicts_least_recently_used_first():
    c = make()
    c.put("a", b"aaaa")
    c.put("b", b"bbbb")
    assert c.get("a") == b"aaaa"  # a is now the most recent
    c.put("c", b"cccc")
    assert "b" not in c and "a" in c and "c" in c
    assert c.nbytes == 8


def test_replacing_a_key_updates_the_byte_count():
    c = make()
    c.put("a", b"aaaa")
    c.put("a", b"aa")
    assert c.nbytes == 2 and len(c) == 1


def test_value_larger_than_budget_is_not_stored():
    c = make(4)
    c.put("a", b"aa")
    c.put("big", b"x" * 5)
    assert "big" not in c and c.get("a") == b"aa"


def test_get_or_create_counts_hits_and_misses():
    c = make()
    calls = []
    for _ in range(3):
        c.get_or_create("k", lambda: calls.append(1) or b"v")
    assert calls == [1] and c.hits == 2 and c.misses == 1
    c.clear()
    assert len(c) == 0 and c.nbytes == 0
