"""Render's byte-budget caches: eviction order, byte accounting, oversized values, expiry."""

from __future__ import annotations

from tandem_render.caches import ByteBudgetCache, new_answer_cache
from tandem_wire import GenerateRequest


def make(budget: int = 10) -> ByteBudgetCache[str, bytes]:
    return ByteBudgetCache[str, bytes](budget, len)


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
    c.put("a", b"x" * 5)  # an oversized replacement drops the old value too
    assert "a" not in c and c.nbytes == 0


def test_answers_expire_after_the_ttl():
    now = [0.0]
    answers = new_answer_cache(1000, 60.0, timer=lambda: now[0])
    entry = (GenerateRequest(token_ids=[1, 2]), False)
    answers.put(("chat", "h"), entry)
    now[0] = 59.0
    assert answers.get(("chat", "h")) == entry
    now[0] = 61.0
    assert answers.get(("chat", "h")) is None


def test_a_zero_ttl_keeps_no_answers():
    answers = new_answer_cache(1000, 0.0)
    answers.put(("chat", "h"), (GenerateRequest(token_ids=[1]), False))
    assert len(answers) == 0
