"""The render app in-process, on the real vLLM processor of the tiny Qwen2-VL model."""

from __future__ import annotations

import dataclasses
import json

import msgspec
import pytest
import zstandard

from tandem_render.app import create_app
from tandem_render.settings import RenderSettings
from tandem_wire import (
    WireFormat,
    compress_zstd,
    decode_body,
    decode_generate_request,
    decode_generate_requests,
    decode_item,
)

from ...support.asgi import app_client
from ...support.images import chat_body, data_url, png_bytes

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]

IMAGE_PAD = 1022
MSGPACK = "application/vnd.msgpack"
ZSTD = {"accept-encoding": "zstd"}


@pytest.fixture
def settings(qwen2_dir):
    # No pre-faulting of cache memory per app here: tests/unit/http/test_memory.py covers it.
    return RenderSettings(
        model=qwen2_dir,
        max_images_per_prompt=4,
        max_body_bytes=4_000_000,
        pretouch_cache_memory=False,
    )


@pytest.fixture
def app(settings, qwen2_renderer):
    return create_app(settings, renderer=qwen2_renderer)


async def render(client, body, *, binary=False, path="/v1/chat/completions/render"):
    if binary:
        r = await client.post(
            path,
            content=msgspec.msgpack.encode(body),
            headers={"content-type": MSGPACK, "accept": MSGPACK},
        )
    else:
        r = await client.post(path, json=body)
    assert r.status_code == 200, r.text
    fmt = WireFormat.MSGPACK if binary else WireFormat.JSON
    if path.startswith("/v1/completions"):
        return decode_generate_requests(r.content, fmt)
    return decode_generate_request(r.content, fmt)


async def test_chat_with_one_image(app, qwen2_dir):
    async with app_client(app) as c:
        req = await render(c, chat_body(qwen2_dir, [data_url(png_bytes())], max_tokens=7))
    feats = req.features
    (ph,) = feats.mm_placeholders["image"]
    assert req.token_ids[ph.offset : ph.offset + ph.length] == [IMAGE_PAD] * ph.length
    assert req.token_ids.count(IMAGE_PAD) == ph.length == 64
    (h,) = feats.mm_hashes["image"]
    assert len(h) == 64 and int(h, 16) >= 0
    item = decode_item(feats.kwargs_data["image"][0])
    grid = item["image_grid_thw"].data.tolist()
    assert grid == [1, 16, 16] and grid[0] * grid[1] * grid[2] // 4 == ph.length
    assert item["pixel_values"].data.dtype.name == "uint8"  # vLLM 0.32 ships raw patches
    assert req.sampling_params["max_tokens"] == 7
    assert req.request_id.startswith("chatcmpl-")


async def test_three_images_raw_bytes_and_urls_share_hashes(app, qwen2_dir):
    a, b = png_bytes(seed=1), png_bytes(seed=2)
    async with app_client(app) as c:
        req = await render(c, chat_body(qwen2_dir, [data_url(a), b, a]), binary=True)
    hashes = req.features.mm_hashes["image"]
    assert hashes[0] == hashes[2] != hashes[1]
    ranges = req.features.mm_placeholders["image"]
    assert [r.offset for r in ranges] == sorted(r.offset for r in ranges)
    assert all(isinstance(e, memoryview) for e in req.features.kwargs_data["image"])
    assert bytes(req.features.kwargs_data["image"][0]) == bytes(
        req.features.kwargs_data["image"][2]
    )


async def test_json_and_binary_bodies_carry_the_same_document(app, qwen2_dir):
    body = chat_body(qwen2_dir, [data_url(png_bytes(seed=3))])
    async with app_client(app) as c:
        j = await render(c, body)
        m = await render(c, body, binary=True)
    assert j.token_ids == m.token_ids
    assert j.features.mm_hashes == m.features.mm_hashes
    assert bytes(j.features.kwargs_data["image"][0]) == bytes(m.features.kwargs_data["image"][0])


async def test_binary_answers_are_zstd_compressed_when_asked_and_json_never(
    settings, qwen2_renderer, qwen2_dir
):
    body = chat_body(qwen2_dir, [data_url(png_bytes(seed=5))])
    packed = msgspec.msgpack.encode(body)
    binary = {"content-type": MSGPACK, "accept": MSGPACK}
    path = "/v1/chat/completions/render"

    async def post(c, content, headers):
        # As sent: httpx would inflate a zstd answer by itself.
        async with c.stream("POST", path, content=content, headers=headers) as r:
            assert r.status_code == 200
            return r.headers, b"".join([chunk async for chunk in r.aiter_raw()])

    async with app_client(create_app(settings, renderer=qwen2_renderer)) as c:
        plain = await post(c, packed, {**binary, "accept-encoding": "identity"})
        asked = await post(c, packed, {**binary, "accept-encoding": "gzip, zstd"})
        as_json = await post(c, msgspec.json.encode(body), {"accept-encoding": "zstd"})
        zipped_in = await post(
            c, compress_zstd(packed), {**binary, "content-encoding": "zstd", **ZSTD}
        )
    off = dataclasses.replace(settings, answer_zstd_level=0)
    async with app_client(create_app(off, renderer=qwen2_renderer)) as c:
        never = await post(c, packed, {**binary, **ZSTD})
    assert "content-encoding" not in plain[0] and plain[0]["vary"] == "accept-encoding"
    assert "content-encoding" not in as_json[0] and "content-encoding" not in never[0]
    for headers, frame in (asked, zipped_in):
        assert headers["content-encoding"] == "zstd"
        assert zstandard.get_frame_parameters(frame).content_size > len(frame)
    # Compressed or not, the same document (request ids aside).
    docs = [
        decode_generate_request(
            decode_body(b, h.get("content-encoding", "identity"), 1 << 26), WireFormat.MSGPACK
        )
        for h, b in (plain, asked, never, zipped_in)
    ]
    assert len({msgspec.msgpack.encode(d.features) for d in docs}) == 1


async def test_repeated_image_hits_the_item_cache(app, qwen2_dir):
    image = data_url(png_bytes(seed=4))
    async with app_client(app) as c:
        await render(c, chat_body(qwen2_dir, [image], text="one"))
        await render(c, chat_body(qwen2_dir, [image], text="two"))
        metrics = (await c.get("/metrics")).text
    # Only lookups count: the first sight is one miss, its insertion is neither.
    assert "tandem_render_item_cache_hits_total 1.0" in metrics
    assert "tandem_render_item_cache_misses_total 1.0" in metrics


async def test_identical_requests_are_answered_from_cache_with_fresh_ids(app, qwen2_dir):
    body = chat_body(qwen2_dir, [data_url(png_bytes(seed=40))], max_tokens=3)
    async with app_client(app) as c:
        first = await render(c, body)
        second = await render(c, body)
        named = await render(c, {**body, "request_id": "mine"})
        named_again = await render(c, {**body, "request_id": "mine"})
        metrics = (await c.get("/metrics")).text
    assert "tandem_render_answer_cache_hits_total 2.0" in metrics
    assert (
        second.token_ids == first.token_ids
        and second.features.mm_hashes == first.features.mm_hashes
    )
    assert second.request_id != first.request_id and second.request_id.startswith("chatcmpl-")
    assert named.request_id == named_again.request_id


async def test_answer_cache_can_be_disabled(qwen2_renderer, qwen2_dir):
    app = create_app(
        RenderSettings(model=qwen2_dir, answer_cache_ttl_s=0, pretouch_cache_memory=False),
        renderer=qwen2_renderer,
    )
    body = chat_body(qwen2_dir, [data_url(png_bytes(seed=41))])
    async with app_client(app) as c:
        await render(c, body)
        await render(c, body)
        assert "tandem_render_answer_cache_hits_total 0.0" in (await c.get("/metrics")).text


async def test_mm_processor_kwargs_change_resolution_and_hash(app, qwen2_dir):
    img = data_url(png_bytes(448, 448, seed=5))
    async with app_client(app) as c:
        big = await render(c, chat_body(qwen2_dir, [img]))
        small = await render(
            c, chat_body(qwen2_dir, [img], mm_processor_kwargs={"max_pixels": 224 * 224})
        )
    assert big.features.mm_placeholders["image"][0].length == 256
    assert small.features.mm_placeholders["image"][0].length == 64
    assert big.features.mm_hashes != small.features.mm_hashes


async def test_processor_kwargs_never_ask_for_more_than_the_model(app, qwen2_dir, qwen2_renderer):
    # The tiny Qwen2-VL's processor says max_pixels=1003520: a 32x32 PNG asking to be upscaled
    # past it is refused at screening, before the processor runs (it would cost seconds of CPU).
    assert qwen2_renderer.processor_facts.max_pixels == 1003520
    img = data_url(png_bytes(32, 32, seed=9))
    calls = []
    real = qwen2_renderer.render_chat

    async def spy(*args, **kwargs):
        calls.append(args)
        return await real(*args, **kwargs)

    qwen2_renderer.render_chat = spy
    try:
        async with app_client(app) as c:
            for kwargs in ({"min_pixels": 60_000_000}, {"max_pixels": 1003521}):
                r = await c.post(
                    "/v1/chat/completions/render",
                    json=chat_body(qwen2_dir, [img], mm_processor_kwargs=kwargs),
                )
                assert r.status_code == 400, r.text
                assert r.json()["error"]["param"] == "mm_processor_kwargs"
            # Within the bound, but four images of at least 1280 tokens each cannot fit 4096.
            r = await c.post(
                "/v1/chat/completions/render",
                json=chat_body(qwen2_dir, [img] * 4, mm_processor_kwargs={"min_pixels": 1003520}),
            )
            assert r.status_code == 400, r.text
            assert r.json()["error"]["type"] == "prompt_too_long"
            assert "min_pixels" in r.json()["error"]["message"]
            assert calls == []
            # One such image fits: it is rendered, at the size asked for.
            ok = await render(
                c, chat_body(qwen2_dir, [img], mm_processor_kwargs={"min_pixels": 200_704})
            )
            assert ok.features.mm_placeholders["image"][0].length == 256
            assert len(calls) == 1
    finally:
        del qwen2_renderer.render_chat


async def test_completion_token_ids_are_never_retokenized(app, qwen2_dir):
    ids = [1017, 359, 1019, IMAGE_PAD, 1020, 40, 41, 1019, IMAGE_PAD, 1020, 42]
    img = png_bytes(seed=6)
    body = {"model": qwen2_dir, "prompt": [ids, [5, 6, 7]], "images": [[img, img], None]}
    async with app_client(app) as c:
        first, second = await render(c, body, path="/v1/completions/render", binary=True)
    n = first.features.mm_placeholders["image"][0].length
    expected = ids[:3] + [IMAGE_PAD] * n + ids[4:8] + [IMAGE_PAD] * n + ids[9:]
    assert first.token_ids == expected
    assert second.token_ids == [5, 6, 7] and second.features is None


async def test_completion_text_prompts(app, qwen2_dir):
    body = {"model": qwen2_dir, "prompt": ["hello there", "the quick brown fox"], "max_tokens": 3}
    async with app_client(app) as c:
        reqs = await render(c, body, path="/v1/completions/render")
    assert len(reqs) == 2 and all(r.features is None for r in reqs)
    assert reqs[0].request_id.endswith("-0") and reqs[1].sampling_params["max_tokens"] == 3


async def test_models_health_metrics(app, qwen2_dir):
    async with app_client(app) as c:
        models = (await c.get("/v1/models")).json()
        assert models["data"][0]["id"] == qwen2_dir
        assert (await c.get("/health")).json() == {"status": "ok"}
        assert "tandem_render_pending" in (await c.get("/metrics")).text


async def test_api_key_on_every_route_but_health(settings, qwen2_renderer, qwen2_dir):
    from dataclasses import replace

    app = create_app(replace(settings, api_key="sekrit"), renderer=qwen2_renderer)
    async with app_client(app) as c:
        assert (await c.get("/health")).status_code == 200
        for path in ("/v1/models", "/metrics"):
            assert (await c.get(path)).status_code == 401
        r = await c.post("/v1/chat/completions/render", json=chat_body(qwen2_dir, []))
        assert r.status_code == 401 and r.json()["error"]["type"] == "unauthorized"
        ok = await c.get("/v1/models", headers={"authorization": "Bearer sekrit"})
        assert ok.status_code == 200


def _bomb_png() -> bytes:
    import struct
    import zlib

    def chunk(kind, data):
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b""))
        + chunk(b"IEND", b"")
    )


def _bad_cases(model):
    ok_img = data_url(png_bytes(seed=9))
    return [
        ("malformed json", b"{not json", None, 400, "malformed_body"),
        ("malformed msgpack", b"\xc1\xc1", MSGPACK, 400, "malformed_body"),
        ("not an object", b"[1, 2]", None, 400, "invalid_request"),
        ("unknown content type", b"x", "text/xml", 400, "invalid_request"),
        ("unknown model", chat_body("nope", [ok_img]), None, 404, "model_not_found"),
        (
            "private url",
            chat_body(model, ["http://10.0.0.1/a.png"]),
            None,
            403,
            "media_url_forbidden",
        ),
        (
            "metadata url",
            chat_body(model, ["http://169.254.169.254/latest"]),
            None,
            403,
            "media_url_forbidden",
        ),
        (
            "loopback url",
            chat_body(model, ["http://127.0.0.1:1/a.png"]),
            None,
            403,
            "media_url_forbidden",
        ),
        (
            "ftp scheme",
            chat_body(model, ["ftp://example.com/a.png"]),
            None,
            400,
            "media_scheme_not_allowed",
        ),
        (
            "file scheme",
            chat_body(model, ["file:///etc/passwd"]),
            None,
            400,
            "media_scheme_not_allowed",
        ),
        ("not an image", chat_body(model, [data_url(b"hello world")]), None, 400, "invalid_image"),
        ("bad base64", chat_body(model, ["data:image/png;base64,@@@"]), None, 400, "invalid_image"),
        (
            "decompression bomb",
            chat_body(model, [data_url(_bomb_png())]),
            None,
            413,
            "image_too_large",
        ),
        ("too many images", chat_body(model, [ok_img] * 5), None, 400, "BadRequestError"),
        ("oversized body", b'{"x": "' + b"a" * 4_100_000 + b'"}', None, 413, "payload_too_large"),
        (
            "image embeds",
            {
                "model": model,
                "messages": [
                    {"role": "user", "content": [{"type": "image_embeds", "image_embeds": "AAAA"}]}
                ],
            },
            None,
            400,
            "mm_embeds_disabled",  # without --enable-mm-embeds (tests/unit/render/test_embeds.py)
        ),
        (
            "caller uuid",
            {
                "model": model,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": ok_img}, "uuid": "x"}
                        ],
                    }
                ],
            },
            None,
            400,
            "invalid_request",
        ),
        ("missing messages", {"model": model}, None, 400, "invalid_request"),
        (
            "wrong field type",
            {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": "many"},
            None,
            400,
            "invalid_request",
        ),
        (
            "image pad count mismatch",
            {"model": model, "prompt": [1, 2], "images": [[ok_img]]},
            "completion",
            400,
            "BadRequestError",
        ),
        (
            "token out of vocabulary",
            {"model": model, "prompt": [1, 99999]},
            "completion",
            400,
            "token_out_of_vocabulary",
        ),
        (
            "prompt longer than context",
            {"model": model, "prompt": [5] * 5000},
            "completion",
            400,
            "prompt_too_long",
        ),
    ]


async def test_bad_input_gets_typed_4xx_and_the_service_keeps_serving(app, qwen2_dir):
    async with app_client(app) as c:
        for name, body, kind, status, type_ in _bad_cases(qwen2_dir):
            path = (
                "/v1/completions/render" if kind == "completion" else "/v1/chat/completions/render"
            )
            headers = {"content-type": kind} if kind not in (None, "completion") else {}
            if isinstance(body, dict):
                content = (
                    msgspec.msgpack.encode(body) if kind == MSGPACK else json.dumps(body).encode()
                )
            else:
                content = body
            r = await c.post(path, content=content, headers=headers)
            err = r.json()["error"]
            assert (r.status_code, err["type"]) == (status, type_), (name, r.text)
            assert "Traceback" not in r.text and len(err["message"]) < 400, name
        assert (await c.get("/health")).status_code == 200
        await render(c, chat_body(qwen2_dir, [data_url(png_bytes(seed=10))]))


async def test_vllm_failures_that_are_not_input_errors_are_500s_that_say_nothing(
    app, qwen2_dir, qwen2_renderer
):
    # vLLM raises ValueError/TypeError/AssertionError for its own bugs as for bad input: only
    # the input errors we can name are 400s. The failure is injected into the real renderer
    # (nothing a request can do makes vLLM fail this way on purpose).
    real = qwen2_renderer.serving.render_chat_request
    for exc in (ValueError("tensor shape [3, 4] /opt/secret.py"), TypeError("x"), AssertionError()):

        async def broken(*args, exc=exc, **kwargs):
            raise exc

        qwen2_renderer.serving.render_chat_request = broken
        try:
            async with app_client(app, raise_app_exceptions=False) as c:
                r = await c.post(
                    "/v1/chat/completions/render",
                    json=chat_body(qwen2_dir, [data_url(png_bytes(seed=11))]),
                )
        finally:
            qwen2_renderer.serving.render_chat_request = real
        err = r.json()["error"]
        assert (r.status_code, err["type"]) == (500, "internal_error"), r.text
        assert "secret" not in r.text and r.headers["x-request-id"] in err["message"]


async def test_a_body_past_the_byte_budget_is_refused_before_it_is_read(settings, qwen2_renderer):
    """--max-held-bytes: a request declaring more than a worker may hold is 413 before any of
    its body is read (the ASGI app never asks for it), and the worker keeps serving."""
    app = create_app(dataclasses.replace(settings, max_held_bytes=50_000), renderer=qwen2_renderer)
    body = json.dumps(chat_body(settings.model, [data_url(png_bytes(seed=3))])).encode()
    assert len(body) > 50_000
    reads = 0

    async def counted():
        nonlocal reads
        reads += 1
        yield body

    async with app_client(app) as c:
        r = await c.post(
            "/v1/chat/completions/render",
            content=counted(),
            headers={"content-type": "application/json", "content-length": str(len(body))},
        )
        assert (r.status_code, r.json()["error"]["type"]) == (413, "payload_too_large")
        assert reads == 0
        small = chat_body(settings.model, ["data:image/png;base64," + "A" * 8])
        assert (await c.post("/v1/chat/completions/render", json=small)).status_code == 400
