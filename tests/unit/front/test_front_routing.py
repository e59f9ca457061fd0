"""The front door in-process: pass-through bytes, affinity, failover, refusals passed on
unchanged, control fan-out and health. The nodes here are small stand-ins that record what
reached them (real render and generate nodes run in tests/integration/test_front_door.py)."""

from __future__ import annotations

import json

import httpx
import msgspec
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tandem_client.routing import ROUTE_KEY_HEADER, rendezvous_order
from tandem_front.app import create_app
from tandem_front.settings import FrontSettings
from tandem_http import Drain
from tandem_http.draining import DrainGate
from tandem_wire import compress_zstd
from tandem_wire.control import CONTROL_ROUTES
from tests.support.asgi import app_client

pytestmark = pytest.mark.anyio

HASH = "ab" * 32


class Node:
    """A stand-in node: answers as told, records every request's path and exact body."""

    def __init__(self, name: str, status: int = 200, headers: dict | None = None) -> None:
        self.name = name
        self.status = status
        self.headers = headers or {}
        self.seen: list[tuple[str, bytes, dict]] = []
        self.answer: dict = {"node": name}

    async def handle(self, request: Request) -> Response:
        body = await request.body()
        if request.url.path == "/weight_info" and request.method == "GET":
            # The door's own poll of versions (fencing), not a request of the test's.
            return JSONResponse({"weight_version": "default"})
        self.seen.append((request.url.path, body, dict(request.headers)))
        if request.url.path == "/inference/v1/generate" and self.status == 200:
            return JSONResponse(self.answer)
        if request.url.path == "/is_paused" and self.status == 200:
            return JSONResponse({"is_paused": False})
        if self.status >= 400:
            err = {
                "error": {
                    "type": "mm_cache_miss" if self.status == 409 else "overloaded",
                    "message": f"from {self.name}",
                }
            }
            return JSONResponse(err, self.status, headers=self.headers)
        return JSONResponse({"node": self.name, "reset": True}, headers=self.headers)

    def app(self) -> Starlette:
        paths = ["/health", "/inference/v1/generate", "/v1/chat/completions/render"]
        paths += [r.path for r in CONTROL_ROUTES]
        return Starlette(routes=[Route(p, self.handle, methods=["GET", "POST"]) for p in paths])


class Fleet(httpx.AsyncBaseTransport):
    """Routes by host to the stand-in nodes; hosts in ``down`` refuse connections."""

    def __init__(self, nodes: dict[str, Node]) -> None:
        self.nodes = nodes
        self.down: set[str] = set()
        self.transports = {h: httpx.ASGITransport(app=n.app()) for h, n in nodes.items()}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        return await self.transports[request.url.host].handle_async_request(request)


class Texts:
    """The OpenAI routes are not exercised here."""


def settings(**kw) -> FrontSettings:
    base = dict(
        render_urls=("http://r1", "http://r2"),
        generate_urls=("http://g1", "http://g2", "http://g3"),
        model="m",
        enable_control_routes=True,
    )
    return FrontSettings(**{**base, **kw})


def fleet(**status) -> Fleet:
    names = ("r1", "r2", "g1", "g2", "g3")
    return Fleet({n: Node(n, status.get(n, 200)) for n in names})


def generate_body(request_id: str = "req-1", hashes: list[str] | None = None) -> dict:
    body: dict = {"request_id": request_id, "token_ids": [1, 2, 3], "sampling_params": {}}
    if hashes:
        body["features"] = {
            "mm_hashes": {"image": hashes},
            "mm_placeholders": {"image": [{"offset": 0, "length": 1}]},
            "kwargs_data": {"image": [None]},
        }
    return body


def winner(key: str, s: FrontSettings) -> str:
    return httpx.URL(rendezvous_order(key, list(s.generate_urls))[0]).host


async def test_generate_goes_to_the_first_item_hash_node_with_the_exact_bytes():
    s = settings()
    f = fleet()
    for fmt, encode in (("application/json", json.dumps), ("application/msgpack", None)):
        doc = generate_body(hashes=[HASH, "cd" * 32])
        raw = json.dumps(doc).encode() if encode else msgspec.msgpack.encode(doc)
        async with app_client(create_app(s, Texts(), f)) as c:
            r = await c.post("/inference/v1/generate", content=raw, headers={"content-type": fmt})
        assert r.status_code == 200
        node = f.nodes[winner(HASH, s)]
        assert r.json() == {"node": node.name}
        path, body, headers = node.seen[-1]
        assert (path, body) == ("/inference/v1/generate", raw)
        assert headers["content-type"] == fmt


async def test_a_zstd_body_is_routed_by_what_it_holds_and_passed_on_still_compressed():
    s = settings()
    f = fleet()
    doc = generate_body("trl-1", hashes=[HASH])  # a TRL-shaped id: the door reads it too
    frame = compress_zstd(msgspec.msgpack.encode(doc))
    headers = {"content-type": "application/msgpack", "content-encoding": "zstd"}
    async with app_client(create_app(s, Texts(), f)) as c:
        r = await c.post("/inference/v1/generate", content=frame, headers=headers)
        bomb = await c.post(
            "/inference/v1/generate",
            content=compress_zstd(bytes(s.max_body_bytes + 1)),
            headers=headers,
        )
        control = await c.post(
            "/reset_prefix_cache",
            content=compress_zstd(b"{}"),
            headers={"content-encoding": "zstd"},
        )
    assert r.status_code == 200
    assert r.headers["accept-encoding"] == "zstd"
    (body, sent), *_ = [(b, h) for p, b, h in f.nodes[winner(HASH, s)].seen if "generate" in p]
    assert (body, sent["content-encoding"]) == (frame, "zstd")
    assert bomb.status_code == 413 and bomb.json()["error"]["type"] == "payload_too_large"
    # A control body is decoded by the door and fanned out plain.
    assert control.status_code == 200
    for name in ("g1", "g2", "g3"):
        path, body, sent = f.nodes[name].seen[-1]
        assert (path, body) == ("/reset_prefix_cache", b"{}") and "content-encoding" not in sent


async def test_tandem_clients_route_key_header_wins_over_the_body():
    # A repeat from tandem_client names its held items by content id in the body; the header
    # carries render's hash, so the repeat reaches the node the data went to.
    s = settings()
    f = fleet()
    async with app_client(create_app(s, Texts(), f)) as c:
        for key in ("k1", "k2", "k3", "k4", "k5", "k6"):
            r = await c.post(
                "/inference/v1/generate",
                json=generate_body(hashes=["ef" * 32]),
                headers={ROUTE_KEY_HEADER: key},
            )
            assert r.json() == {"node": winner(key, s)}


async def test_text_only_requests_route_by_request_id_like_tandem_client():
    s = settings()
    f = fleet()
    async with app_client(create_app(s, Texts(), f)) as c:
        for rid in ("a", "b", "c", "d", "e", "f"):
            r = await c.post("/inference/v1/generate", json=generate_body(rid))
            assert r.json() == {"node": winner(rid, s)}


async def test_an_unreachable_node_moves_only_its_share_to_the_next_in_order():
    s = settings()
    f = fleet()
    keys = [f"{i:02x}" * 32 for i in range(30)]
    async with app_client(create_app(s, Texts(), f)) as c:
        before = {}
        for k in keys:
            r = await c.post("/inference/v1/generate", json=generate_body(hashes=[k]))
            before[k] = r.json()["node"]
        f.down.add("g2")
        for k in keys:
            r = await c.post("/inference/v1/generate", json=generate_body(hashes=[k]))
            after = r.json()["node"]
            order = [httpx.URL(u).host for u in rendezvous_order(k, list(s.generate_urls))]
            if before[k] == "g2":
                assert after == order[1]  # the next in this key's order
            else:
                assert after == before[k]  # every other key stays put
        metrics = (await c.get("/metrics")).text
    assert 'tandem_front_upstream_retries_total{tier="generate"}' in metrics
    assert any(before[k] == "g2" for k in keys)


@pytest.mark.parametrize("status", [409, 429, 503])
async def test_refusals_pass_through_unchanged(status):
    s = settings(generate_urls=("http://g1",))
    f = fleet()
    f.nodes["g1"].status = status
    f.nodes["g1"].headers = {"retry-after": "3"}
    async with app_client(create_app(s, Texts(), f)) as c:
        r = await c.post("/inference/v1/generate", json=generate_body(hashes=[HASH]))
    assert r.status_code == status
    assert r.headers["retry-after"] == "3"
    assert r.json()["error"]["message"] == "from g1"
    assert len(f.nodes["g1"].seen) == 1  # not retried: the node answered


async def test_a_draining_node_s_refusal_moves_the_request_to_the_next_node():
    s = settings()
    f = fleet()
    key = "d1" * 32
    first, second = (httpx.URL(u).host for u in rendezvous_order(key, list(s.generate_urls))[:2])
    # The first node of this key's order is shutting down (tandem_http's drain, as it runs).
    drain = Drain()
    drain.start()
    f.transports[first] = httpx.ASGITransport(app=DrainGate(f.nodes[first].app(), drain))
    raw = json.dumps(generate_body(hashes=[key])).encode()
    async with app_client(create_app(s, Texts(), f)) as c:
        r = await c.post("/inference/v1/generate", content=raw)
    assert r.status_code == 200
    assert r.json() == {"node": second}
    assert f.nodes[first].seen == []  # refused before the node's own app ran
    assert f.nodes[second].seen[-1][1] == raw


async def test_every_node_down_is_a_typed_503():
    s = settings()
    f = fleet()
    f.down |= {"g1", "g2", "g3"}
    async with app_client(create_app(s, Texts(), f)) as c:
        r = await c.post("/inference/v1/generate", json=generate_body())
    assert r.status_code == 503
    assert r.json()["error"]["type"] == "upstream_unavailable"


async def test_render_routes_stream_the_body_to_a_render_node_and_fail_over():
    s = settings()
    f = fleet()
    f.down.add("r1")
    raw = b'{"messages": []}'
    async with app_client(create_app(s, Texts(), f)) as c:
        for _ in range(3):
            r = await c.post(
                "/v1/chat/completions/render",
                content=raw,
                headers={"content-type": "application/json", "authorization": "Bearer x"},
            )
            assert r.status_code == 200 and r.json()["node"] == "r2"
    path, body, headers = f.nodes["r2"].seen[-1]
    assert (path, body) == ("/v1/chat/completions/render", raw)
    assert "authorization" not in headers  # the caller's key is not the upstream's


async def test_upstream_key_is_sent_and_the_front_key_is_required():
    s = settings(api_key="front", upstream_api_key="tiers")
    f = fleet()
    async with app_client(create_app(s, Texts(), f)) as c:
        r = await c.post("/inference/v1/generate", json=generate_body())
        assert r.status_code == 401
        r = await c.post(
            "/inference/v1/generate",
            json=generate_body("x"),
            headers={"authorization": "Bearer front"},
        )
        assert r.status_code == 200
    _, _, headers = f.nodes[winner("x", s)].seen[-1]
    assert headers["authorization"] == "Bearer tiers"


async def test_control_routes_reach_every_generate_node():
    s = settings()
    f = fleet()
    async with app_client(create_app(s, Texts(), f)) as c:
        r = await c.post("/reset_prefix_cache")
    assert r.status_code == 200
    assert [n["url"] for n in r.json()["nodes"]] == ["http://g1", "http://g2", "http://g3"]
    for name in ("g1", "g2", "g3"):
        assert [p for p, _, _ in f.nodes[name].seen] == ["/reset_prefix_cache"]
    assert not f.nodes["r1"].seen and not f.nodes["r2"].seen


async def test_control_partial_failure_names_the_failed_nodes():
    s = settings()
    f = fleet(g2=429)
    f.down.add("g3")
    async with app_client(create_app(s, Texts(), f)) as c:
        r = await c.post("/pause")
    assert r.status_code == 502
    err = r.json()["error"]
    assert err["type"] == "control_partial_failure"
    assert "http://g2" in err["message"] and "http://g3" in err["message"]
    assert {x["url"] for x in err["details"]["failed"]} == {"http://g2", "http://g3"}
    assert err["details"]["succeeded"] == ["http://g1"]
    assert [p for p, _, _ in f.nodes["g1"].seen] == ["/pause"]  # it did reach the others


async def test_is_paused_is_an_error_when_a_node_does_not_tell():
    # A trainer waits on /is_paused for the fleet to be quiet: a node that cannot be asked
    # must not count as an unpaused one.
    f = fleet()
    f.down.add("g3")
    async with app_client(create_app(settings(), Texts(), f)) as c:
        r = await c.get("/is_paused")
    assert r.status_code == 502
    err = r.json()["error"]
    assert err["type"] == "control_partial_failure"
    assert [x["url"] for x in err["details"]["failed"]] == ["http://g3"]


async def test_control_refused_the_same_way_everywhere_is_that_refusal():
    f = fleet(g1=429, g2=429, g3=429)
    async with app_client(create_app(settings(), Texts(), f)) as c:
        r = await c.post("/reset_prefix_cache")
    assert r.status_code == 429 and r.json()["error"]["type"] == "overloaded"


async def test_state_changing_control_needs_an_admin_key_or_the_flag():
    f = fleet()
    s = settings(enable_control_routes=False)
    async with app_client(create_app(s, Texts(), f)) as c:
        r = await c.post("/reset_prefix_cache")
        assert r.status_code == 403
        assert r.json()["error"]["type"] == "control_routes_disabled"
        assert not any(n.seen for n in f.nodes.values())
        # Read-only ones are served, combined over the nodes.
        r = await c.get("/is_paused")
    assert r.status_code == 200 and r.json() == {"is_paused": False}
    # An inference key alone is no admin key: refused unless the operator opens the routes.
    auth = {"authorization": "Bearer k"}
    for enabled, status in ((False, 403), (True, 200)):
        keyed = settings(enable_control_routes=enabled, api_key="k")
        f = fleet()
        async with app_client(create_app(keyed, Texts(), f)) as c:
            r = await c.post("/reset_prefix_cache", headers=auth)
        assert r.status_code == status, enabled
        assert bool(f.nodes["g1"].seen) is enabled
        if not enabled:
            assert r.json()["error"]["type"] == "admin_required"


async def test_health_names_the_missing_tier():
    f = fleet()
    f.down |= {"g1", "g2", "g3"}
    async with app_client(create_app(settings(), Texts(), f)) as c:
        r = await c.get("/health")
        assert r.status_code == 503
        assert r.json()["error"]["type"] == "upstream_unavailable"
        assert r.json()["error"]["details"]["missing"] == ["generate"]
    f.down = {"r1"}
    async with app_client(create_app(settings(), Texts(), f)) as c:
        r = await c.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok", "render": 1, "generate": 3}


LOGPROBS = {
    "choices": [
        {
            "index": 0,
            "token_ids": [5],
            "logprobs": {
                "content": [
                    {
                        "token_id": 5,
                        "logprob": -0.5,
                        "top_logprobs": [{"token_id": 5, "logprob": -0.5}],
                    }
                ]
            },
        }
    ]
}


@pytest.mark.parametrize(
    ("mode", "request_id", "header", "trl"),
    [
        ("auto", "trl-0123", None, True),
        ("auto", "mine", None, False),
        ("auto", "mine", "trl", True),
        ("vllm-0.32", "trl-0123", None, False),
        ("trl", "mine", None, True),
        ("trl", "mine", "vllm-0.32", False),
    ],
)
async def test_logprobs_in_the_shape_trl_parses(mode, request_id, header, trl):
    s = settings(generate_urls=("http://g1",), logprobs_format=mode)
    f = fleet()
    f.nodes["g1"].answer = LOGPROBS
    headers = {"x-tandem-logprobs-format": header} if header else {}
    async with app_client(create_app(s, Texts(), f)) as c:
        r = await c.post("/inference/v1/generate", json=generate_body(request_id), headers=headers)
    entry = r.json()["choices"][0]["logprobs"]["content"][0]
    if trl:
        from trl.generation.vllm_client import parse_logprobs

        assert entry["token"] == "token_id:5" and entry["token_id"] == 5
        assert entry["top_logprobs"][0]["token"] == "token_id:5"
        assert parse_logprobs([r.json()["choices"][0]["logprobs"]]) == ([[[-0.5]]], [[[5]]])
    else:
        assert r.content == json.dumps(LOGPROBS, separators=(",", ":")).encode()


async def test_server_info_is_one_nodes_answer_asked_of_one_node():
    # Each node's config is the same model's: asking every node only multiplied the config
    # (and whatever it carried) by the fleet. The next node answers when the first cannot.
    f = fleet()
    async with app_client(create_app(settings(), Texts(), f)) as c:
        r = await c.get("/server_info")
        assert r.status_code == 200 and r.json()["node"] == "g1"
        assert [len(f.nodes[n].seen) for n in ("g1", "g2", "g3")] == [1, 0, 0]
        f.down.add("g1")
        r = await c.get("/server_info")
        assert r.status_code == 200 and r.json()["node"] == "g2"
    assert [len(f.nodes[n].seen) for n in ("g1", "g2", "g3")] == [1, 1, 0]
