"""Render names each item it sends by its content id; items without bytes keep their names."""

from __future__ import annotations

import blake3

from tandem_wire import MultiModalFeatures, PlaceholderRange, content_id, named_by_content


def features(data: dict[str, list[bytes | None]] | None) -> MultiModalFeatures[bytes | None]:
    names = {"image": ["vllm-a", "vllm-b"], "audio": ["vllm-c"]}
    ranges = {
        "image": [PlaceholderRange(offset=0, length=4), PlaceholderRange(offset=8, length=4)],
        "audio": [PlaceholderRange(offset=16, length=2)],
    }
    return MultiModalFeatures(mm_hashes=names, mm_placeholders=ranges, kwargs_data=data)


def test_the_content_id_is_blake3_of_tenant_zero_and_bytes():
    assert content_id("t", b"item") == blake3.blake3(b"t\x00item").hexdigest()
    assert content_id("", b"item") != content_id("t", b"item")


def test_items_sent_are_named_by_their_bytes_and_tenant():
    named = named_by_content(features({"image": [b"a", None], "audio": [b"c"]}), "t")
    assert named.mm_hashes == {
        "image": [content_id("t", b"a"), "vllm-b"],  # a null keeps its name
        "audio": [content_id("t", b"c")],
    }
    assert named.kwargs_data == {"image": [b"a", None], "audio": [b"c"]}


def test_hashes_only_keep_their_names():
    assert named_by_content(features(None), "t").mm_hashes == features(None).mm_hashes
