"""Client behaviour over httpx.MockTransport: errors, retries, resends, routing, sync face."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import msgspec
import numpy as np
import pytest

from tandem_client import (
    AsyncTandemClient,
    AuthenticationError,
    BadRequestError,
    CacheMissError,
    MediaError,
    ModelNotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    ServerError,
    TandemClient,
    TransportError,
)
from tandem_client.errors import error_from_response
from tandem_client.media import image_source, media_source
from tandem_client.routing import RoundRobin, rendezvous
from tandem_wire import (
    GenerateChoice,
    GenerateRequest,
    GenerateResponse,
    MultiModalFeatures,
    PlaceholderRange,
    WireFormat,
    compress_zstd,
    content_id,
    decode_body,
    decode_generate_request,
    encode_document,
    encode_generate_request,
)

pytestmark = pytest.mark.anyio

JSON = {"content-type": "application/json"}


def error(status: int, type_: str, **details) -> httpx.Response:
    body = {"error": {"type": type_, "message": "m", "code": status}}
    if details:
        body["error"]["details"] = details
    return httpx.Response(status, json=body)


def answer(request_id: str = "r", tokens=(1, 2)) -> httpx.Response:
    resp = GenerateResponse(
        request_id=request_id, choices=[GenerateChoice(index=0, token_ids=list(tokens))]
    )
    return httpx.Response(200, content=encode_document(resp, WireFormat.JSON), headers=JSON)


def image_request(hashes=("a" * 64,)) -> GenerateRequest:
    return GenerateRequest(
        token_ids=[1, 9, 9, 2] * len(hashes),
        request_id="r",
        features=MultiModalFeatures(
            mm_hashes={"image": list(hashes)},
            mm_placeholders={
                "image": [PlaceholderRange(offset=1 + 4 * i, length=2) for i in range(len(hashes))]
            },
            kwargs_data={"image": [b"item-" + h.encode()[:4] for h in hashes]},
        ),
    )


def client_with(handler, *, tells_weights: bool = False, **kwargs) -> AsyncTandemClient:
    """A client over ``handler``; the nodes' ``/weight_info`` (asked before the first request,
    and every ``fence_poll_s``) answers 404, as a node without it, unless ``tells_weights``."""
    kwargs.setdefault("binary", False)
    kwargs.setdefault("backoff_s", 0.001)

    def nodes(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/weight_info" and not tells_weights:
            return error(404, "not_found")
        return handler(request)

    return AsyncTandemClient(
        "http://render",
        kwargs.pop("generate_urls", "http://gen"),
        transport=httpx.MockTransport(nodes),
        **kwargs,
    )


@pytest.mark.parametrize(
    ("status", "type_", "cls"),
    [
        (400, "invalid_request", BadRequestError),
        (401, "unauthorized", AuthenticationError),
        (403, "admin_required", AuthenticationError),
        (404, "model_not_found", ModelNotFoundError),
        (409, "mm_cache_miss", CacheMissError),
        (413, "payload_too_large", PayloadTooLargeError),
        (413, "image_too_large", PayloadTooLargeError),
        (403, "media_url_forbidden", MediaError),
        (400, "invalid_image", MediaError),
        (429, "overloaded", OverloadedError),
        (500, "internal_error", ServerError),
        (503, "engine_not_ready", ServerError),
        (418, "teapot", BadRequestError),
    ],
)
def test_error_types_map_to_exceptions(status, type_, cls):
    exc = error_from_response(status, {"error": {"type": type_, "message": "x", "request_id": "q"}})
    assert type(exc) is cls and exc.type == type_ and exc.status_code == status
    assert exc.request_id == "q"


def test_error_without_a_body():
    exc = error_from_response(502, None)
    assert isinstance(exc, ServerError) and exc.type == "http_502"


async def test_input_errors_are_never_retried():
    calls = []

    def handler(request):
        calls.append(request)
        return error(400, "invalid_request")

    async with client_with(handler) as c:
        with pytest.raises(BadRequestError):
            await c.generate(GenerateRequest(token_ids=[1]))
    assert len(calls) == 1


async def test_429_and_503_are_retried_then_succeed():
    statuses = iter([429, 503, 200])

    def handler(request):
        status = next(statuses)
        return (
            answer()
            if status == 200
            else error(status, "overloaded" if status == 429 else "engine_not_ready")
        )

    async with client_with(handler) as c:
        result = await c.generate(GenerateRequest(token_ids=[1]))
    assert result.choices[0].token_ids == [1, 2]


async def test_retries_are_bounded():
    calls = []

    def handler(request):
        calls.append(1)
        return error(503, "engine_not_ready")

    async with client_with(handler, max_retries=2) as c:
        with pytest.raises(ServerError):
            await c.generate(GenerateRequest(token_ids=[1]))
    assert len(calls) == 3


class _RecordedSleeps:
    """The client module's ``asyncio``, whose ``sleep`` records the wait and returns at once."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __getattr__(self, name: str):
        return getattr(asyncio, name)

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)


async def test_backoff_doubles_and_no_wait_passes_30_s(monkeypatch):
    import tandem_client.client as client_module

    sleeps = _RecordedSleeps()
    monkeypatch.setattr(client_module, "asyncio", sleeps)
    async with client_with(lambda r: error(429, "overloaded"), max_retries=12, backoff_s=1.0) as c:
        with pytest.raises(OverloadedError):
            await c.generate(GenerateRequest(token_ids=[1]))
    assert len(sleeps.waits) == 12
    # Each wait is 0.5-1.5x its doubling: the first about a second, the later ones held at 30 s
    # (the twelfth unbounded would be 17-51 minutes).
    assert 0.5 <= sleeps.waits[0] <= 1.5 and 1.0 <= sleeps.waits[1] <= 3.0
    assert max(sleeps.waits) == 30.0 and sleeps.waits[-3:] == [30.0] * 3


async def test_connection_errors_are_retried_then_raise_transport_error():
    calls = []

    def handler(request):
        calls.append(1)
        raise httpx.ConnectError("refused", request=request)

    async with client_with(handler, max_retries=1) as c:
        with pytest.raises(TransportError):
            await c.generate(GenerateRequest(token_ids=[1]))
    assert len(calls) == 2


async def test_items_are_sent_once_and_resent_on_a_cache_miss():
    bodies = []
    names = []
    keys = []
    miss_next = {"value": False}

    def handler(request):
        doc = json.loads(request.content)
        bodies.append(doc["features"]["kwargs_data"]["image"])
        names.append(doc["features"]["mm_hashes"]["image"])
        keys.append(request.headers.get("x-tandem-route-key"))
        if miss_next["value"] and doc["features"]["kwargs_data"]["image"][0] is None:
            miss_next["value"] = False
            return error(409, "mm_cache_miss", missing={"image": names[-1]})
        return answer()

    async with client_with(handler) as c:
        req = image_request()
        await c.generate(req)
        await c.generate(req)
        miss_next["value"] = True  # the node restarted and lost the item
        await c.generate(req)
    assert bodies[0][0] is not None  # first time: the data
    assert bodies[1] == [None]  # then: "you hold this"
    assert bodies[2] == [None] and bodies[3][0] is not None  # 409, then resent with data
    # A null is named by the content id of the bytes sent before, never by render's hash.
    sent = base64.b64decode(bodies[0][0])
    assert names[1] == names[2] == [content_id("", sent)]
    assert names[0] == names[3] == req.features.mm_hashes["image"]
    # Every attempt is routed by render's hash, whatever the body names (see the front door).
    assert keys == [req.features.mm_hashes["image"][0]] * 4


async def test_a_miss_for_items_we_did_send_is_raised():
    def handler(request):
        return error(409, "mm_cache_miss", missing={"image": ["b" * 64]})

    async with client_with(handler) as c:
        with pytest.raises(CacheMissError) as info:
            await c.generate(image_request())
    assert info.value.missing == {"image": ["b" * 64]}


async def test_binary_transport_sends_msgpack_and_reads_msgpack():
    seen = {}

    def handler(request):
        seen["ctype"] = request.headers["content-type"]
        req = decode_generate_request(request.content, WireFormat.MSGPACK)
        assert bytes(req.features.kwargs_data["image"][0]).startswith(b"item-")
        resp = GenerateResponse(request_id="r", choices=[GenerateChoice(index=0, token_ids=[7])])
        return httpx.Response(
            200,
            content=encode_document(resp, WireFormat.MSGPACK),
            headers={"content-type": "application/vnd.msgpack"},
        )

    async with client_with(handler, binary=True) as c:
        result = await c.generate(image_request())
    assert seen["ctype"] == "application/vnd.msgpack" and result.choices[0].token_ids == [7]


async def test_chat_posts_render_output_through_unchanged():
    rendered = encode_generate_request(image_request(), WireFormat.MSGPACK)
    posted = {}

    def handler(request):
        if request.url.path.endswith("/render"):
            body = msgspec.msgpack.decode(request.content)
            part = body["messages"][0]["content"][0]
            assert part == {"type": "image_bytes", "image_bytes": b"\x89PNGraw"}
            return httpx.Response(
                200, content=rendered, headers={"content-type": "application/vnd.msgpack"}
            )
        posted["body"] = request.content
        return answer()

    async with client_with(handler, binary=True, model="m") as c:
        messages = [{"role": "user", "content": [{"type": "image", "image": b"\x89PNGraw"}]}]
        await c.chat(messages)
    assert posted["body"] == rendered  # byte for byte: zero conversion


async def test_generate_routing_follows_the_item_hash():
    urls = ["http://g1", "http://g2", "http://g3"]
    hits = []

    def handler(request):
        hits.append(f"http://{request.url.host}")
        return answer()

    async with client_with(handler, generate_urls=urls) as c:
        for h in ("a", "b", "c", "d", "a", "b"):
            await c.generate(image_request((h * 64,)))
    assert hits[0] == hits[4] and hits[1] == hits[5]
    assert hits == [rendezvous(h * 64, urls) for h in "abcdab"]


async def test_control_calls_carry_the_admin_key_and_the_rest_the_inference_key(tmp_path):
    seen = []

    def handler(request):
        seen.append((request.url.path, request.headers["authorization"]))
        if request.url.path == "/inference/v1/generate":
            return answer()
        return httpx.Response(200, json={"weight_version": "v"})

    async with client_with(
        handler, tells_weights=True, api_key="k", admin_api_key="a", weight_dir=tmp_path
    ) as c:
        await c.generate(image_request())
        await c.pause()
        await c.resume()
        await c.update_weights({"w": np.zeros(2, "float32")}, version="v")
        await c.weight_versions()
    # The update asks the nodes' versions around its steps (fencing): read-only, inference key.
    keys = dict(seen)
    assert [p for p, _ in seen if p != "/weight_info"] == [
        "/inference/v1/generate",
        "/pause",
        "/resume",
        "/start_weight_update",
        "/update_weights",
        "/finish_weight_update",
    ]
    assert keys == {
        "/inference/v1/generate": "Bearer k",
        "/pause": "Bearer a",
        "/resume": "Bearer a",
        "/start_weight_update": "Bearer a",
        "/update_weights": "Bearer a",
        "/finish_weight_update": "Bearer a",
        "/weight_info": "Bearer k",
    }
    assert {k for p, k in seen if p == "/weight_info"} == {"Bearer k"}
    seen.clear()
    async with client_with(handler, api_key="k") as c:  # no admin key: the one key it has
        await c.pause()
    assert seen == [("/pause", "Bearer k")]


def test_rendezvous_moves_only_the_keys_of_a_removed_node():
    urls = ["http://a", "http://b", "http://c", "http://d"]
    keys = [f"k{i}" for i in range(400)]
    before = {k: rendezvous(k, urls) for k in keys}
    after = {k: rendezvous(k, urls[:-1]) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert all(before[k] == "http://d" for k in moved)
    assert 50 < len(moved) < 150  # about a quarter


def test_round_robin():
    rr = RoundRobin(["a", "b"])
    assert [rr.pick() for _ in range(4)] == ["a", "b", "a", "b"]


def test_image_sources():
    from PIL import Image

    img = Image.new("RGB", (4, 4))
    assert image_source("https://x/y.png", binary=True) == "https://x/y.png"
    assert image_source(b"raw", binary=True) == b"raw"
    assert image_source(b"raw", binary=False) == "data:image/png;base64,cmF3"
    assert image_source(img, binary=True).startswith(b"\x89PNG")


def test_media_sources():
    assert media_source("https://x/v.mp4", binary=False) == "https://x/v.mp4"
    assert media_source(memoryview(b"raw"), binary=True) == b"raw"
    assert media_source(b"raw", binary=False) == "data:application/octet-stream;base64,cmF3"
    with pytest.raises(TypeError):
        media_source(3, binary=True)  # type: ignore[arg-type]


@pytest.mark.parametrize("binary", [True, False])
async def test_render_completion_sends_videos_and_audios_per_prompt(binary):
    seen = []

    def handler(request):
        seen.append(request)
        body = encode_document([image_request()] * 2, WireFormat.JSON)
        return httpx.Response(200, content=body, headers=JSON)

    async with client_with(handler, binary=binary) as client:
        answers = await client.render_completion(
            [[1, 2], [3]],
            images=[["https://x/i.png"], None],
            videos=[[b"mp4"], None],
            audios=[None, ["https://x/a.wav", b"wav"]],
        )
    assert len(answers) == 2
    (request,) = seen
    assert request.url.path == "/v1/completions/render"
    body = msgspec.msgpack.decode(request.content) if binary else json.loads(request.content)

    def sent(data: bytes) -> bytes | str:  # raw in msgpack, a data URL in JSON
        if binary:
            return data
        return "data:application/octet-stream;base64," + base64.b64encode(data).decode()

    assert body["images"] == [["https://x/i.png"], None]
    assert body["videos"] == [[sent(b"mp4")], None]
    assert body["audios"] == [None, ["https://x/a.wav", sent(b"wav")]]


def test_sync_face():
    def handler(request):
        return answer(tokens=(5, 6))

    with TandemClient(
        "http://render", "http://gen", transport=httpx.MockTransport(handler), binary=False
    ) as c:
        assert c.generate(GenerateRequest(token_ids=[1])).choices[0].token_ids == [5, 6]


async def test_rollout_shapes_and_logprobs():
    def handler(request):
        if request.url.path == "/v1/completions/render":
            body = json.loads(request.content)
            assert body["n"] == 2 and body["logprobs"] == 1
            assert body["images"] == [["data:image/png;base64,cmF3"], None]
            reqs = [
                GenerateRequest(token_ids=list(p), request_id=f"r{i}")
                for i, p in enumerate(body["prompt"])
            ]
            return httpx.Response(200, content=encode_document(reqs, WireFormat.JSON), headers=JSON)
        doc = json.loads(request.content)
        from tandem_wire import ChoiceLogprobs, TokenLogprob, TokenLogprobContent

        def lp(t):
            return TokenLogprobContent(
                token_id=t,
                logprob=-0.5,
                top_logprobs=[
                    TokenLogprob(token_id=t, logprob=-0.5),
                    TokenLogprob(token_id=t + 1, logprob=-1.5),
                ],
            )

        choices = [
            GenerateChoice(
                index=i,
                token_ids=[10 + i, 20 + i],
                logprobs=ChoiceLogprobs(content=[lp(10 + i), lp(20 + i)]),
                finish_reason="length",
            )
            for i in (1, 0)
        ]
        resp = GenerateResponse(request_id=doc["request_id"], choices=choices)
        return httpx.Response(200, content=encode_document(resp, WireFormat.JSON), headers=JSON)

    async with client_with(handler) as c:
        result = await c.rollout(
            [[1, 2], [3]], images=[[b"raw"], None], n=2, logprobs=1, progress=False
        )
    assert result.prompt_ids == [[1, 2], [3]]
    assert result.completion_ids == [[10, 20], [11, 21], [10, 20], [11, 21]]  # sorted by index
    assert result.logprobs[0] == [[-0.5, -1.5], [-0.5, -1.5]]
    assert result.logprob_token_ids[1] == [[11, 12], [21, 22]]
    assert result.finish_reasons == ["length"] * 4


# -- zstd compression: negotiated per node, never sent to a node that did not ask -------------

MSGPACK = {"content-type": "application/vnd.msgpack"}


def big_request(hashes=("b" * 64,)) -> GenerateRequest:
    """An image request whose item is large (and compressible) enough to be compressed."""
    req = image_request(hashes)
    data = [bytes(range(200)) * 500 + h.encode() for h in hashes]  # distinct items
    feats = msgspec.structs.replace(req.features, kwargs_data={"image": data})
    return msgspec.structs.replace(req, features=feats)


def zstd_node(seen: list, *, advertise: bool = True, refuse: bool = False):
    """A generate node that records (path, content-encoding, body as sent); it advertises zstd
    in its answers (as Tandem's services do) or not (as upstream vLLM), and may refuse it."""

    def handler(request):
        headers = {"accept-encoding": "zstd"} if advertise else {}
        coding = request.headers.get("content-encoding")
        seen.append((request.url.path, coding, request.content))
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"}, headers=headers)
        if coding and refuse:
            body = {"error": {"type": "unsupported_content_encoding", "message": "m"}}
            return httpx.Response(415, json=body, headers=headers)
        return answer()

    return handler


async def test_generate_bodies_are_compressed_toward_a_node_that_advertises_zstd():
    seen: list = []
    async with client_with(zstd_node(seen), binary=True, compression="zstd") as c:
        for h in "bcd":
            await c.generate(big_request((h * 64,)))
    assert [p for p, _, _ in seen].count("/health") == 1  # asked once per node
    posts = [(coding, body) for p, coding, body in seen if p == "/inference/v1/generate"]
    for (coding, body), h in zip(posts, "bcd", strict=True):
        plain = encode_generate_request(big_request((h * 64,)), WireFormat.MSGPACK)
        assert coding == "zstd" and len(body) < len(plain) // 4
        assert decode_body(body, "zstd", len(plain)) == plain


async def test_a_node_that_does_not_advertise_zstd_never_gets_a_compressed_body():
    seen: list = []
    async with client_with(zstd_node(seen, advertise=False), binary=True, compression="zstd") as c:
        await c.generate(big_request())
        await c.generate(big_request(("c" * 64,)))
    posts = [(coding, body) for p, coding, body in seen if p == "/inference/v1/generate"]
    assert [coding for coding, _ in posts] == [None, None]
    assert posts[0][1] == encode_generate_request(big_request(), WireFormat.MSGPACK)


async def test_a_415_resends_the_body_plain_and_stops_compressing():
    seen: list = []
    async with client_with(zstd_node(seen, refuse=True), binary=True, compression="zstd") as c:
        first = await c.generate(big_request())
        await c.generate(big_request(("c" * 64,)))
    assert first.choices[0].token_ids == [1, 2]
    codings = [coding for p, coding, _ in seen if p == "/inference/v1/generate"]
    assert codings == ["zstd", None, None]


async def test_small_bodies_and_json_clients_are_never_compressed():
    seen: list = []
    async with client_with(zstd_node(seen), binary=True, compression="zstd") as c:
        await c.generate(image_request())  # a few dozen bytes
    async with client_with(zstd_node(seen), binary=False, compression="zstd") as c:
        await c.generate(big_request())  # JSON stays upstream's exchange
    assert [coding for p, coding, _ in seen if p != "/health"] == [None, None]


async def test_a_compressed_render_answer_goes_to_generate_as_it_came():
    rendered = encode_generate_request(big_request(), WireFormat.MSGPACK)
    frame = compress_zstd(rendered)
    seen: list = []
    node = zstd_node(seen)
    render_asked = {}

    def handler(request):
        if request.url.path.endswith("/render"):
            render_asked["accept-encoding"] = request.headers.get("accept-encoding")
            headers = {**MSGPACK, "content-encoding": "zstd"}
            return httpx.Response(200, stream=httpx.ByteStream(frame), headers=headers)
        return node(request)

    async with client_with(handler, binary=True, compression="zstd", model="m") as c:
        await c.chat([{"role": "user", "content": "hi"}])
    assert render_asked["accept-encoding"] == "zstd"
    (post,) = [(coding, body) for p, coding, body in seen if p == "/inference/v1/generate"]
    assert post == ("zstd", frame)  # not decompressed and compressed again


async def test_without_compression_nothing_is_asked_or_sent_compressed():
    seen: list = []
    node = zstd_node(seen)
    render_asked = {}

    def handler(request):
        if request.url.path.endswith("/render"):
            render_asked["accept-encoding"] = request.headers.get("accept-encoding")
            body = encode_generate_request(big_request(), WireFormat.MSGPACK)
            return httpx.Response(200, content=body, headers=MSGPACK)
        return node(request)

    async with client_with(handler, binary=True, model="m") as c:
        await c.chat([{"role": "user", "content": "hi"}])
    assert render_asked["accept-encoding"] == "identity"
    assert [(p, coding) for p, coding, _ in seen] == [("/inference/v1/generate", None)]


async def test_a_compressed_answer_over_the_cap_is_refused_before_it_is_inflated():
    bomb = compress_zstd(bytes(256 * 1024 * 1024))

    def handler(request):
        headers = {**MSGPACK, "content-encoding": "zstd"}
        return httpx.Response(200, stream=httpx.ByteStream(bomb), headers=headers)

    async with client_with(
        handler, binary=True, compression="zstd", model="m", max_answer_bytes=1 << 20
    ) as c:
        with pytest.raises(PayloadTooLargeError):
            await c.render_chat([{"role": "user", "content": "hi"}])


def test_an_unknown_compression_is_refused():
    with pytest.raises(ValueError):
        AsyncTandemClient("http://r", "http://g", compression="gzip")
