"""Null kwargs entries, cache misses, cache-poisoning attempts, backpressure, hostile input."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from tandem_http import TENANT_HEADER
from tandem_wire import (
    BatchedLayout,
    FieldElem,
    FlatLayout,
    GenerateRequest,
    PlaceholderRange,
    WireFormat,
    content_id,
    decode_item,
    encode_generate_request,
    encode_item,
)

from ...support.asgi import AsgiCall, app_client
from .helpers import GREEDY, MSGPACK, generate_app, post, render, tokens

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.engine]


@pytest.fixture
def app(qwen2_engine, qwen2_dir):
    return generate_app(qwen2_engine, qwen2_dir)


def without_data(req: GenerateRequest, **changes) -> GenerateRequest:
    """The request with every item as a null entry named by its content id, as a client that
    sent the items before does (``cache_salt`` from ``changes`` is the tenant)."""
    tenant = changes.get("cache_salt", req.cache_salt) or ""
    feats = msgspec.structs.replace(
        req.features,
        mm_hashes={
            m: [content_id(tenant, d) for d in v] for m, v in req.features.kwargs_data.items()
        },
        kwargs_data={m: [None] * len(v) for m, v in req.features.kwargs_data.items()},
        mm_metadata=None,
    )
    return msgspec.structs.replace(req, features=feats, **changes)


def nulls(req: GenerateRequest) -> GenerateRequest:
    """The request with null entries under its own (render's) mm_hashes: the content ids of
    the bytes render sent."""
    feats = msgspec.structs.replace(
        req.features,
        kwargs_data={m: [None] * len(v) for m, v in req.features.kwargs_data.items()},
        mm_metadata=None,
    )
    return msgspec.structs.replace(req, features=feats)


def with_hashes(req: GenerateRequest, hashes: list[str]) -> GenerateRequest:
    feats = msgspec.structs.replace(req.features, mm_hashes={"image": hashes})
    return msgspec.structs.replace(req, features=feats)


async def test_null_kwargs_reuse_the_cached_item(app, qwen2_renderer, qwen2_dir):
    req = await render(qwen2_renderer, qwen2_dir, [11], **GREEDY)
    async with app_client(app) as c:
        first = await post(c, req, binary=True)
        again = await post(c, without_data(req), binary=True)
        assert tokens(again) == tokens(first)
        metrics = (await c.get("/metrics")).text
        # The null entry is one hit; storing the item the first request sent is neither.
        assert "tandem_generate_item_cache_hits_total 1.0" in metrics
        assert "tandem_generate_item_cache_misses_total 0.0" in metrics


def root_buffer(obj):
    """The object whose memory an array or view ultimately holds on to."""
    while True:
        if isinstance(obj, np.ndarray) and obj.base is not None:
            obj = obj.base
        elif isinstance(obj, memoryview):
            obj = obj.obj
        else:
            return obj


async def test_stored_items_hold_their_own_bytes_not_the_request_body(
    app, qwen2_renderer, qwen2_dir
):
    req = await render(qwen2_renderer, qwen2_dir, [14, 15, 16], **GREEDY)
    body = encode_generate_request(req, WireFormat.MSGPACK)
    async with app_client(app) as c:
        await post(c, req, binary=True)
    stored = list(app.state.service.items._items.values())
    assert len(stored) == 3
    for item in stored:
        for field in item.wire.values():
            held = root_buffer(field.data)
            if isinstance(held, (bytes, bytearray)):
                # Within the item's own bytes (the body of three is over three times as big).
                assert len(held) <= item.nbytes < len(body) / 2


async def test_an_item_that_is_nearly_the_whole_body_is_stored_without_a_copy_and_counted_whole(
    app, qwen2_renderer, qwen2_dir
):
    req = await render(qwen2_renderer, qwen2_dir, [17], **GREEDY)
    body = encode_generate_request(req, WireFormat.MSGPACK)
    async with app_client(app) as c:
        await post(c, req, binary=True)
    [item] = list(app.state.service.items._items.values())
    held = {id(root_buffer(f.data)): root_buffer(f.data) for f in item.wire.values()}
    [buffer] = [b for b in held.values() if isinstance(b, (bytes, bytearray))]
    # The request body itself (what arrived), and the store counts all of it.
    assert len(buffer) == len(body) <= item.nbytes


async def test_cache_miss_is_a_409_naming_the_missing_hashes(app, qwen2_renderer, qwen2_dir):
    req = await render(qwen2_renderer, qwen2_dir, [12, 13], **GREEDY)
    unknown = with_hashes(nulls(req), ["f" * 64, "e" * 64])
    async with app_client(app) as c:
        err = await post(c, unknown, expect=409)
        assert err["error"]["type"] == "mm_cache_miss"
        assert err["error"]["details"] == {"missing": {"image": ["f" * 64, "e" * 64]}}
        assert "tandem_generate_item_cache_misses_total 2.0" in (await c.get("/metrics")).text
        assert len(tokens(await post(c, req))) == 8  # the next request still works


async def test_a_reused_hash_with_other_pixels_poisons_nothing(app, qwen2_renderer, qwen2_dir):
    victim = await render(qwen2_renderer, qwen2_dir, [14], **GREEDY)
    other = await render(qwen2_renderer, qwen2_dir, [15], **GREEDY)
    victim_hash = victim.features.mm_hashes["image"][0]
    # The attacker sends other pixels under the victim's hash (same tenant: no cache_salt).
    attack = with_hashes(other, [victim_hash])
    async with app_client(app) as c:
        victim_tokens = tokens(await post(c, victim))
        other_tokens = tokens(await post(c, other))
        assert victim_tokens != other_tokens
        # The engine keys items by content: the attacker gets the tokens of what it sent...
        assert tokens(await post(c, attack)) == other_tokens
        # ...the victim's identical request is unaffected (encoder and prefix caches)...
        assert tokens(await post(c, victim)) == victim_tokens
        # ...and so is its null entry, which names its own bytes' content id.
        assert tokens(await post(c, without_data(victim))) == victim_tokens
        # Render named the item by that content id: its answer's own null entry works too.
        assert victim_hash == without_data(victim).features.mm_hashes["image"][0]
        assert tokens(await post(c, nulls(victim))) == victim_tokens
        # A null under any other name (upstream render's hash of the media, say) names no
        # bytes at all: nothing is served for it.
        stranger = "ab" * 32
        err = await post(c, with_hashes(nulls(victim), [stranger]), expect=409)
        assert err["error"]["details"] == {"missing": {"image": [stranger]}}


async def test_a_null_never_resolves_to_pixels_its_sender_did_not_send(
    qwen2_engine, qwen2_renderer, qwen2_dir
):
    # Evict the victim's item, let an attacker register other pixels under every name the
    # victim's item went by (its mm_hash and its content id), then retry the victim's null.
    victim = await render(qwen2_renderer, qwen2_dir, [22], **GREEDY)
    other = await render(qwen2_renderer, qwen2_dir, [23], **GREEDY)
    fillers = [await render(qwen2_renderer, qwen2_dir, [seed], **GREEDY) for seed in (24, 25)]
    victim_id = without_data(victim).features.mm_hashes["image"][0]
    # Room for one item: each item stored evicts the one before.
    size = len(victim.features.kwargs_data["image"][0])
    app = generate_app(qwen2_engine, qwen2_dir, item_cache_bytes=size * 3 // 2)
    async with app_client(app) as c:
        victim_tokens = tokens(await post(c, victim))
        for filler in fillers:
            await post(c, filler)
        for name in (victim.features.mm_hashes["image"][0], victim_id):
            await post(c, with_hashes(other, [name]))
        err = await post(c, without_data(victim), expect=409)
        assert err["error"]["details"] == {"missing": {"image": [victim_id]}}
        # Resent with its data, the victim gets its own answer.
        assert tokens(await post(c, victim)) == victim_tokens


async def test_items_are_scoped_by_tenant(app, qwen2_renderer, qwen2_dir):
    req = await render(qwen2_renderer, qwen2_dir, [16], **GREEDY)
    mine = msgspec.structs.replace(req, cache_salt="tenant-a" * 4)
    async with app_client(app) as c:
        await post(c, mine)
        assert len(tokens(await post(c, without_data(mine)))) == 8
        theirs = without_data(req, cache_salt="tenant-b" * 4)
        assert (await post(c, theirs, expect=409))["error"]["type"] == "mm_cache_miss"


async def test_backpressure_answers_429_instead_of_queueing(
    qwen2_engine, qwen2_renderer, qwen2_dir
):
    app = generate_app(qwen2_engine, qwen2_dir, max_pending=1)
    req = await render(qwen2_renderer, qwen2_dir, [17], **GREEDY)
    held = msgspec.structs.replace(req, stream=True, sampling_params={"max_tokens": 200})
    body = encode_generate_request(req, WireFormat.JSON)
    async with app_client(app) as c:
        # One streaming request holds the only slot, mid-generation, until its last chunk.
        stream = AsgiCall(
            app,
            "POST",
            "/inference/v1/generate",
            encode_generate_request(held, WireFormat.JSON),
            {"content-type": "application/json"},
        )
        assert await stream.status() == 200
        assert (await stream.chunk()).startswith(b"data: ")
        second = await c.post("/inference/v1/generate", content=body)
        assert second.status_code == 429 and second.json()["error"]["type"] == "overloaded"
        assert second.headers.get("retry-after") == "1"
        await stream.hang_up()  # its client went away: the slot is free, the request aborted
        assert len(tokens(await post(c, req))) == 8


def _item_with(req, **changes):
    """The request with its first item re-encoded after ``changes`` to its fields."""
    item = decode_item(req.features.kwargs_data["image"][0])
    for key, value in changes.items():
        item[key] = value
    data = encode_item(item)
    feats = msgspec.structs.replace(req.features, kwargs_data={"image": [data]})
    return msgspec.structs.replace(req, features=feats)


def _joined(a, b):
    """One request holding both prompts one after the other, with all their images."""
    shift = len(a.token_ids)
    fa, fb = a.features, b.features
    moved = [
        msgspec.structs.replace(p, offset=p.offset + shift) for p in fb.mm_placeholders["image"]
    ]
    feats = msgspec.structs.replace(
        fa,
        mm_hashes={"image": fa.mm_hashes["image"] + fb.mm_hashes["image"]},
        mm_placeholders={"image": fa.mm_placeholders["image"] + moved},
        kwargs_data={"image": fa.kwargs_data["image"] + fb.kwargs_data["image"]},
        mm_metadata=(
            {"image": fa.mm_metadata["image"] + fb.mm_metadata["image"]} if fa.mm_metadata else None
        ),
    )
    return msgspec.structs.replace(a, token_ids=a.token_ids + b.token_ids, features=feats)


def _with_ranges(req, ranges):
    feats = msgspec.structs.replace(req.features, mm_placeholders={"image": ranges})
    return msgspec.structs.replace(req, features=feats)


def _hostile_cases(req):
    ph = req.features.mm_placeholders["image"][0]
    item = decode_item(req.features.kwargs_data["image"][0])
    pixels, grid = item["pixel_values"].data, item["image_grid_thw"].data
    pickle_item = msgspec.msgpack.encode(
        {
            "pixel_values": {
                "data": ["uint8", [1], msgspec.msgpack.Ext(1, b"cos\nsystem\n.")],
                "field": ["batched", {}],
            }
        }
    )
    as_json = json.loads(encode_generate_request(req, WireFormat.JSON))

    def doc(**changes):
        return json.dumps({**as_json, **changes}).encode()

    def feats(**changes):
        return doc(features={**as_json["features"], **changes})

    cases = [
        ("malformed json", b"{oops", None, 400, "malformed_body"),
        ("malformed msgpack", b"\xc1", MSGPACK, 400, "malformed_body"),
        ("empty token_ids", doc(token_ids=[]), None, 400, "invalid_request"),
        (
            "token out of vocabulary",
            doc(token_ids=[*req.token_ids, 10**6]),
            None,
            400,
            "token_out_of_vocabulary",
        ),
        ("unknown model", doc(model="other"), None, 404, "model_not_found"),
        ("unknown output mode", doc(output_mode="words"), None, 400, "invalid_request"),
        (
            "text output mode without detokenize",
            doc(output_mode="text", sampling_params={**req.sampling_params, "detokenize": False}),
            None,
            400,
            "invalid_request",
        ),
        (
            "pickle ext in item",
            feats(kwargs_data={"image": [__import__("base64").b64encode(pickle_item).decode()]}),
            None,
            400,
            "unsupported_ext_type",
        ),
        ("not base64", feats(kwargs_data={"image": ["%%%"]}), None, 400, "malformed_base64"),
        (
            "placeholder past the end",
            feats(mm_placeholders={"image": [{"offset": len(req.token_ids) - 2, "length": 64}]}),
            None,
            400,
            "invalid_request",
        ),
        ("overlapping placeholders", None, None, 400, "invalid_request"),
        ("placeholder on text tokens", None, None, 400, "invalid_placeholders"),
        ("placeholder too short", None, None, 400, "invalid_placeholders"),
        ("is_embed disagrees", None, None, 400, "invalid_placeholders"),
        (
            "float pixels",
            _item_with(
                req,
                pixel_values=FieldElem(
                    pixels.astype(np.float32), FlatLayout(slices=(slice(0, len(pixels)),))
                ),
            ),
            None,
            400,
            "invalid_mm_item",
        ),
        (
            "pixels not matching grid",
            _item_with(
                req,
                pixel_values=FieldElem(
                    pixels[:-4], FlatLayout(slices=(slice(0, len(pixels) - 4),))
                ),
            ),
            None,
            400,
            "invalid_mm_item",
        ),
        (
            "grid of zeros",
            _item_with(req, image_grid_thw=FieldElem(np.zeros(3, np.int64), BatchedLayout())),
            None,
            400,
            "invalid_mm_item",
        ),
        (
            "wrong layout",
            _item_with(req, pixel_values=FieldElem(pixels, BatchedLayout())),
            None,
            400,
            "invalid_mm_item",
        ),
        (
            "extra key",
            _item_with(req, evil=FieldElem(np.zeros(1, np.uint8), BatchedLayout())),
            None,
            400,
            "invalid_mm_item",
        ),
        (
            "shape byte mismatch",
            feats(
                kwargs_data={
                    "image": [
                        __import__("base64")
                        .b64encode(
                            msgspec.msgpack.encode(
                                {
                                    "pixel_values": {
                                        "data": ["uint8", [9, 9], msgspec.msgpack.Ext(3, b"\0")],
                                        "field": ["batched", {}],
                                    }
                                }
                            )
                        )
                        .decode()
                    ]
                }
            ),
            None,
            400,
            "shape_mismatch",
        ),
        (
            "unknown sampling field",
            doc(sampling_params={"logits_processors": ["x"]}),
            None,
            400,
            "invalid_sampling_params",
        ),
        (
            "bad temperature",
            doc(sampling_params={"temperature": -1}),
            None,
            400,
            "invalid_sampling_params",
        ),
        (
            "n too large",
            doc(sampling_params={"n": 1000, "temperature": 1.0}),
            None,
            400,
            "invalid_sampling_params",
        ),
        (
            "max_tokens past context",
            doc(sampling_params={"max_tokens": 10**6}),
            None,
            400,
            "prompt_too_long",
        ),
        (
            "video on an image range",
            feats(
                mm_hashes={"video": as_json["features"]["mm_hashes"]["image"]},
                mm_placeholders={"video": as_json["features"]["mm_placeholders"]["image"]},
                kwargs_data={"video": as_json["features"]["kwargs_data"]["image"]},
                mm_metadata=None,
            ),
            None,
            400,
            "invalid_mm_item",
        ),
        (
            "oversized body",
            b'{"token_ids": [1], "x": "' + b"a" * 3_000_000 + b'"}',
            None,
            413,
            "payload_too_large",
        ),
        ("too many items", None, None, 400, "too_many_items"),
    ]
    built = {
        "overlapping placeholders": _with_ranges(
            req, [ph, PlaceholderRange(offset=ph.offset + 1, length=ph.length)]
        ),
        "placeholder on text tokens": _with_ranges(
            req, [PlaceholderRange(offset=0, length=ph.length)]
        ),
        "placeholder too short": _with_ranges(
            req, [PlaceholderRange(offset=ph.offset, length=ph.length - 4)]
        ),
        "is_embed disagrees": _with_ranges(
            req,
            [
                PlaceholderRange(
                    offset=ph.offset, length=ph.length, is_embed=[False] + [True] * (ph.length - 1)
                )
            ],
        ),
    }
    out = []
    for name, body, ctype, status, type_ in cases:
        body = built.get(name, body)
        if isinstance(body, GenerateRequest):
            body = encode_generate_request(body, WireFormat.JSON)
        out.append((name, body, ctype, status, type_))
    del grid
    return out


async def test_hostile_inputs_get_typed_4xx_and_the_server_keeps_serving(
    qwen2_engine, qwen2_renderer, qwen2_dir
):
    app = generate_app(qwen2_engine, qwen2_dir, max_body_bytes=2_000_000, max_items_per_prompt=2)
    req = await render(qwen2_renderer, qwen2_dir, [18], **GREEDY)
    many = await render(qwen2_renderer, qwen2_dir, [19, 20, 21], **GREEDY)
    async with app_client(app) as c:
        for name, body, ctype, status, type_ in _hostile_cases(req):
            if name == "too many items":
                body = encode_generate_request(many, WireFormat.JSON)
            headers = {"content-type": ctype} if ctype else {"content-type": "application/json"}
            r = await c.post("/inference/v1/generate", content=body, headers=headers)
            assert (r.status_code, r.json()["error"]["type"]) == (status, type_), (
                name,
                r.text[:300],
            )
            assert "Traceback" not in r.text, name
        assert (await c.get("/health")).status_code == 200
        assert len(tokens(await post(c, req))) == 8


async def test_limit_mm_per_prompt_is_enforced_by_the_service(
    qwen2_engine, qwen2_renderer, qwen2_dir
):
    # The session engine runs with --limit-mm-per-prompt image=4. Items arrive processed, so
    # vLLM's processor never counts them: the service must, as vLLM's own server does.
    assert qwen2_engine.mm_limits["image"] == 4
    app = generate_app(qwen2_engine, qwen2_dir, max_body_bytes=8_000_000, max_items_per_prompt=16)
    four = await render(qwen2_renderer, qwen2_dir, [30, 31, 32, 33], **GREEDY)
    one = await render(qwen2_renderer, qwen2_dir, [34], **GREEDY)
    five = _joined(four, one)  # render itself refuses five images (same limit)
    async with app_client(app) as c:
        r = await c.post(
            "/inference/v1/generate", content=encode_generate_request(five, WireFormat.JSON)
        )
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "too_many_items" and err["param"] == "features.mm_hashes.image"
        r = await c.post(
            "/inference/v1/generate", content=encode_generate_request(four, WireFormat.JSON)
        )
        assert r.status_code == 200, r.text


async def test_two_items_on_one_placeholder_run_are_refused(
    qwen2_engine, qwen2_renderer, qwen2_dir
):
    # Upstream render sends no is_embed, so the wire leaves overlapping ranges to the model:
    # here every embed position of the run would feed two items. Placeholders may share only
    # tokens that are no embed position of either (Gemma 3's adjacent images).
    two = await render(qwen2_renderer, qwen2_dir, [35, 35], **GREEDY)
    first = two.features.mm_placeholders["image"][0]
    assert first.is_embed is None
    same_run = _with_ranges(two, [first, first])
    app = generate_app(qwen2_engine, qwen2_dir, max_body_bytes=8_000_000)
    async with app_client(app) as c:
        err = await post(c, same_run, expect=400)
        assert err["error"]["type"] == "invalid_placeholders", err
        assert "share embed positions" in err["error"]["message"]
        assert len(tokens(await post(c, two))) == 8


async def test_held_items_are_scoped_by_api_key_too(qwen2_engine, qwen2_renderer, qwen2_dir):
    # cache_salt is caller-chosen: with API keys configured, another key naming the same salt
    # and content id still resolves nothing of the first key's.
    req = await render(qwen2_renderer, qwen2_dir, [26], **GREEDY)
    mine = msgspec.structs.replace(req, cache_salt="shared-salt" * 2)
    app = generate_app(qwen2_engine, qwen2_dir, api_key=("key-a", "key-b"))
    async with app_client(app) as c:
        c.headers["authorization"] = "Bearer key-a"
        await post(c, mine)
        c.headers["authorization"] = "Bearer key-b"
        err = await post(c, without_data(mine), expect=409)
        assert err["error"]["type"] == "mm_cache_miss"
        c.headers["authorization"] = "Bearer key-a"
        assert len(tokens(await post(c, without_data(mine)))) == 8


async def test_held_items_are_scoped_by_the_doors_tenant(qwen2_engine, qwen2_renderer, qwen2_dir):
    # Before, every caller behind a door reached this node under the door's one key: tenant B
    # learnt from a hit (not a 409) that tenant A had sent this image.
    req = await render(qwen2_renderer, qwen2_dir, [27], **GREEDY)
    app = generate_app(qwen2_engine, qwen2_dir, api_key=("door", "direct"), door_api_key="door")
    async with app_client(app) as c:
        c.headers.update({"authorization": "Bearer door", TENANT_HEADER: "tenant-a"})
        await post(c, req)
        c.headers[TENANT_HEADER] = "tenant-b"
        err = await post(c, without_data(req), expect=409)
        assert err["error"]["type"] == "mm_cache_miss"
        # A key the node does not know as a door's names no tenant: its own scope, as before.
        c.headers.update({"authorization": "Bearer direct", TENANT_HEADER: "tenant-a"})
        await post(c, without_data(req), expect=409)
        c.headers.update({"authorization": "Bearer door", TENANT_HEADER: "tenant-a"})
        assert len(tokens(await post(c, without_data(req)))) == 8


def with_metadata(
    req: GenerateRequest, metadata: list, kwargs: list | None = None
) -> GenerateRequest:
    feats = req.features
    data = feats.kwargs_data if kwargs is None else {"image": kwargs}
    changed = msgspec.structs.replace(feats, kwargs_data=data, mm_metadata={"image": metadata})
    return msgspec.structs.replace(req, features=changed)


async def test_mm_metadata_must_describe_its_item(app, qwen2_renderer, qwen2_dir):
    req = await render(qwen2_renderer, qwen2_dir, [41], **GREEDY)
    (meta,) = req.features.mm_metadata["image"]
    fields = decode_item(meta)
    assert "image_grid_thw" in fields  # render sends the grid as the item's metadata
    grid = fields["image_grid_thw"]
    wrong_grid = {**fields, "image_grid_thw": FieldElem(grid.data * 2, grid.layout)}
    unknown = {**fields, "not_a_field": FieldElem(np.zeros(3, np.int64), BatchedLayout())}
    async with app_client(app) as c:
        good = tokens(await post(c, req))  # render's own metadata agrees with its items
        for bad in (wrong_grid, unknown):
            err = await post(c, with_metadata(req, [encode_item(bad)]), expect=400)
            assert err["error"]["type"] == "invalid_mm_item"
            assert err["error"]["param"] == "features.mm_metadata.image[0]"
        # Metadata alone stands for an item only with encoder-cache transfer (upstream's rule).
        err = await post(c, with_metadata(req, [meta], kwargs=[None]), expect=400)
        assert err["error"]["param"] == "features.mm_metadata.image"
        assert "ec_transfer_params" in err["error"]["message"]
        # With them, this node still has no encoder-cache transfer to bring the embeddings.
        ec = msgspec.structs.replace(
            with_metadata(req, [meta], kwargs=[None]), ec_transfer_params={"do_remote": True}
        )
        err = await post(c, ec, expect=400)
        assert "kwargs_data" in err["error"]["message"]
        assert tokens(await post(c, req)) == good


async def test_transfer_params_reach_an_engine_without_connectors_as_upstreams_do(
    app, qwen2_renderer, qwen2_dir
):
    """``kv_transfer_params`` / ``ec_transfer_params`` go to the engine as upstream's generate
    passes them; an engine without a KV or EC connector generates as without them."""
    req = await render(qwen2_renderer, qwen2_dir, [42], **GREEDY)
    params = {"kv_transfer_params": {"do_remote_prefill": False}, "ec_transfer_params": {}}
    async with app_client(app) as c:
        plain = await post(c, req)
        answer = await post(c, msgspec.structs.replace(req, **params))
    assert tokens(answer) == tokens(plain)
    assert answer["kv_transfer_params"] is None  # no connector: nothing to hand on
