"""The KV-cache events a node publishes, read as llm-d's scheduler reads them: every block that
overlaps an image carries the name render answered for it, and the block keys a scheduler
computes from render's answer alone (vLLM's own hashing, sha256_cbor) are the events' keys.

Run against our pair (render + generate) in every wire form, and against upstream's pair
(``vllm launch render`` + ``vllm serve --enable-scale-out``) as the reference; one pair at a
time (module-scoped, parametrized: the first pair stops before the second starts).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
import pytest

from tandem_wire import (
    MSGPACK_CONTENT_TYPE,
    WIRE_TRANSFORMS_HEADER,
    GenerateRequest,
    WireFormat,
    content_id,
    decode_generate_request,
    encode_generate_request,
)
from tools.servers import (
    ServerProcess,
    serving,
    tandem_generate,
    tandem_render,
    upstream_render,
    upstream_serve,
)
from tools.tiny_models import ensure_model

from ..support.images import data_url, png_bytes
from ..support.kv_events import (
    Item,
    Subscriber,
    block_keys,
    kv_event_args,
    local_endpoint,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.vllm,
    pytest.mark.engine,
    pytest.mark.own_fleet,  # an engine of its own (with KV events): before the shared fleet
]

TOPIC = "kv@127.0.0.1@tiny"


@dataclass
class Pair:
    kind: str
    model: str
    render: str
    generate: str
    events: Subscriber
    names: set[str] = field(default_factory=set)
    """Every item name render answered in this module."""


def start(kind: str, model: str, endpoint: str) -> dict[str, ServerProcess]:
    events = kv_event_args(endpoint, TOPIC)
    if kind == "tandem":
        return {"render": tandem_render(model), "generate": tandem_generate(model, None, *events)}
    return {"render": upstream_render(model), "generate": upstream_serve(model, *events)}


@pytest.fixture(scope="module", params=["tandem", "upstream"])
def pair(request) -> Iterator[Pair]:
    model = str(ensure_model("qwen2-vl"))
    endpoint = local_endpoint()
    procs = start(request.param, model, endpoint)
    with serving(procs.values(), timeout=300):
        events = Subscriber(endpoint)
        try:
            found = Pair(request.param, model, procs["render"].url, procs["generate"].url, events)
            events.connected(lambda text: last_block(found, text_prompt(found, text)))
            yield found
        finally:
            events.close()


def chat(model: str, before: str, seed: int, salt: str | None = None) -> dict[str, Any]:
    """A chat whose image follows text of its own, so the blocks over the image are new."""
    content = [
        {"type": "text", "text": before},
        {"type": "image_url", "image_url": {"url": data_url(png_bytes(112, 112, seed=seed))}},
        {"type": "text", "text": "What is in it? Answer in one word."},
    ]
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 1,
        "temperature": 0.0,
    }
    if salt is not None:
        body["cache_salt"] = salt
    return body


def rendered(pair: Pair, body: dict[str, Any], form: str) -> tuple[bytes, WireFormat]:
    """Render's answer in ``form``: json, msgpack, or msgpack with the model's transforms."""
    headers = {}
    fmt = WireFormat.JSON if form == "json" else WireFormat.MSGPACK
    if fmt is WireFormat.MSGPACK:
        headers["accept"] = MSGPACK_CONTENT_TYPE
    if form == "transforms":
        headers[WIRE_TRANSFORMS_HEADER] = "*"
    r = httpx.post(
        f"{pair.render}/v1/chat/completions/render", json=body, headers=headers, timeout=120
    )
    assert r.status_code == 200, r.text[:1500]
    return r.content, fmt


def generated(pair: Pair, raw: bytes, fmt: WireFormat) -> None:
    r = httpx.post(
        f"{pair.generate}/inference/v1/generate",
        content=raw,
        headers={"content-type": fmt.content_type},
        timeout=120,
    )
    assert r.status_code == 200, r.text[:1500]


def text_prompt(pair: Pair, text: str) -> GenerateRequest[Any]:
    body = {"model": pair.model, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
    raw, fmt = rendered(pair, body, "json")
    generated(pair, raw, fmt)
    return decode_generate_request(raw, fmt)


def items(req: GenerateRequest[Any]) -> list[Item]:
    feats = req.features
    assert feats is not None
    return sorted(
        (
            Item(name, r.offset, r.length)
            for modality, names in feats.mm_hashes.items()
            for name, r in zip(names, feats.mm_placeholders[modality], strict=True)
        ),
        key=lambda i: i.offset,
    )


def last_block(pair: Pair, req: GenerateRequest[Any]) -> int:
    return block_keys(req.token_ids, items(req) if req.features else [], req.cache_salt)[
        -1
    ].event_hash


def assert_events_name_renders_items(pair: Pair, req: GenerateRequest[Any]) -> None:
    """The prompt's blocks, keyed from render's answer, are the ones the node stored, and
    those over an image carry exactly render's names for its items."""
    names = {i.name for i in items(req)}
    pair.names |= names
    blocks = block_keys(req.token_ids, items(req), req.cache_salt)
    last = blocks[-1].event_hash
    assert pair.events.wait_for(last), (
        f"the prompt's last block ({last:x}) was never stored: "
        f"{len(pair.events.stored)} blocks seen"
    )
    over_items = [b for b in blocks if b.items]
    assert {n for b in over_items for n in b.items} == names
    for block in over_items:
        assert block.event_hash in pair.events.stored
        assert pair.events.extra_keys(block.event_hash) == block.extra_keys


def tandem_only(pair: Pair) -> None:
    if pair.kind != "tandem":
        pytest.skip("upstream's generate takes JSON bodies, every item with its data")


@pytest.mark.parametrize("form", ["json", "msgpack", "transforms"])
def test_a_fresh_image(pair, form):
    if form != "json":
        tandem_only(pair)
    raw, fmt = rendered(pair, chat(pair.model, f"A first look ({form}).", seed=1), form)
    generated(pair, raw, fmt)
    assert_events_name_renders_items(pair, decode_generate_request(raw, fmt))


def test_a_repeated_image_in_a_new_prompt(pair):
    raw, fmt = rendered(pair, chat(pair.model, "The same picture, asked again.", seed=1), "json")
    generated(pair, raw, fmt)
    assert_events_name_renders_items(pair, decode_generate_request(raw, fmt))


def test_a_salted_image(pair):
    body = chat(pair.model, "A tenant's own look.", seed=1, salt="tenant-b")
    raw, fmt = rendered(pair, body, "json")
    generated(pair, raw, fmt)
    req = decode_generate_request(raw, fmt)
    assert_events_name_renders_items(pair, req)
    if pair.kind == "tandem":
        # The tenant is part of the name: its blocks never meet another tenant's.
        (data,) = req.features.kwargs_data["image"]
        assert req.features.mm_hashes["image"] == [content_id("tenant-b", data)]


def test_null_entries_for_items_the_node_holds(pair):
    tandem_only(pair)
    raw, fmt = rendered(pair, chat(pair.model, "Held already, sent as null.", seed=1), "msgpack")
    req = decode_generate_request(raw, fmt)
    feats = req.features
    nulls = {m: [None] * len(v) for m, v in (feats.kwargs_data or {}).items()}
    # As tandem_client sends them: the metadata goes with the data it describes.
    held_feats = msgspec.structs.replace(feats, kwargs_data=nulls, mm_metadata=None)
    held = msgspec.structs.replace(req, features=held_feats)
    generated(pair, encode_generate_request(held, fmt), fmt)
    assert_events_name_renders_items(pair, req)


def test_no_event_names_an_item_render_did_not(pair):
    named = {
        key[0]
        for h in pair.events.stored
        for key in pair.events.extra_keys(h) or ()
        if isinstance(key, list)
    }
    assert named and named <= pair.names


def test_the_node_says_where_it_publishes(pair):
    r = httpx.get(f"{pair.generate}/kv_event_sources", timeout=30)
    assert r.status_code == 200, r.text
    (source,) = r.json().values()
    assert source["enable_kv_cache_events"] is True and source["publisher"] == "zmq"
    assert (source["endpoint"], source["topic"]) == (pair.events.endpoint, TOPIC)
