"""The front door's admission and body caps: a request past the door's byte budget is refused
before its body is read; generate bodies are capped by what the generate nodes take (learned
from them), render-bound ones by render's cap; idle upstream connections are dropped by the
door before the nodes drop them."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tandem_front.__main__ import parse_args
from tandem_front.app import create_app
from tandem_front.upstreams import Upstreams
from tandem_http import MAX_BODY_HEADER, Drain, DrainingConfig
from tests.support.asgi import BodyCall, app_client, until

from .test_front_routing import Fleet, Node, Texts, fleet, settings

pytestmark = pytest.mark.anyio

GENERATE = "/inference/v1/generate"


class Held(Fleet):
    """The fleet, with generate requests held at the node until ``release`` is set."""

    def __init__(self, nodes: dict[str, Node]) -> None:
        super().__init__(nodes)
        self.release = asyncio.Event()
        self.arrived = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == GENERATE:
            self.arrived += 1
            await self.release.wait()
        return await super().handle_async_request(request)


def padded(size: int) -> bytes:
    """A generate body of exactly ``size`` bytes (JSON, padded with spaces)."""
    raw = json.dumps({"request_id": "r", "token_ids": [1], "sampling_params": {}}).encode()
    return raw + b" " * (size - len(raw))


@pytest.mark.parametrize(
    "path", [GENERATE, "/v1/chat/completions/render", "/v1/chat/completions", "/pause"]
)
async def test_past_the_door_s_byte_budget_a_request_is_429_before_its_body_is_read(path):
    nodes = fleet().nodes
    f = Held(nodes)
    app = create_app(settings(max_held_bytes=1000), Texts(), f)
    async with app_client(app) as c:
        holder = asyncio.create_task(c.post(GENERATE, content=padded(700)))
        await until(lambda: f.arrived == 1)
        refused = BodyCall(app, path, [b"{" + b" " * 398 + b"}"])  # 700 + 400 > 1000
        status, headers, body = await refused.answer()
        assert (status, headers["retry-after"]) == (429, "1")
        assert json.loads(body)["error"]["type"] == "overloaded"
        assert refused.asked == 0  # none of it was read, let alone buffered
        too_big = BodyCall(app, path, [b" " * 1001])  # more than the door ever holds
        assert (await too_big.answer())[0] == 413 and too_big.asked == 0
        f.release.set()
        assert (await holder).status_code == 200
        fits = BodyCall(app, GENERATE, [padded(1000)])  # the held bytes came back
        assert (await fits.answer())[0] == 200
    assert [p for n in nodes.values() for p, _, _ in n.seen if p != "/health"] == [GENERATE] * 2


async def test_the_generate_body_cap_is_learned_from_the_generate_nodes():
    f = fleet()
    for name in ("g1", "g2", "g3"):
        f.nodes[name].headers = {MAX_BODY_HEADER: "2000" if name == "g2" else "1500"}
    s = settings(max_body_bytes=1000)  # the cap until a node has told its own
    async with app_client(create_app(s, Texts(), f)) as c:
        assert (await c.post(GENERATE, content=padded(1900))).status_code == 200
        r = await c.post(GENERATE, content=padded(2001))
        assert r.status_code == 413 and r.json()["error"]["type"] == "payload_too_large"
    # An operator's --max-body-bytes is the cap, whatever the nodes take.
    fixed = parse_args(["--render", "http://r1", "--generate", "http://g1", "--model", "m",
                        "--max-body-bytes", "1000"])  # fmt: skip
    assert not fixed.follow_generate_body_cap
    assert parse_args(["--render", "http://r1", "--generate", "http://g1", "--model", "m"]
                      ).follow_generate_body_cap  # fmt: skip
    s = settings(max_body_bytes=1000, follow_generate_body_cap=False)
    f = fleet()
    f.nodes["g1"].headers = {MAX_BODY_HEADER: "2000"}
    async with app_client(create_app(s, Texts(), f)) as c:
        assert (await c.get("/health")).status_code == 200
        assert (await c.post(GENERATE, content=padded(1900))).status_code == 413


async def test_render_bound_bodies_are_capped_at_render_s_cap_unread():
    f = fleet()
    app = create_app(settings(render_max_body_bytes=1000), Texts(), f)
    async with app_client(app):
        for path in ("/v1/chat/completions/render", "/v1/chat/completions"):
            call = BodyCall(app, path, [b" " * 1001])
            assert (await call.answer())[0] == 413 and call.asked == 0
    assert not f.nodes["r1"].seen and not f.nodes["r2"].seen


def test_the_door_drops_idle_upstream_connections_before_the_nodes_do():
    s = settings()
    ups = Upstreams(s)
    # The real objects: httpx's pool, and the uvicorn config every Tandem node runs with.
    pool_expiry = ups.http._transport._pool._keepalive_expiry  # type: ignore[attr-defined]
    node_keep_alive = DrainingConfig(object(), drain=Drain()).timeout_keep_alive
    assert pool_expiry == s.upstream_keepalive_s
    assert 0 < pool_expiry < node_keep_alive
    for bad in (node_keep_alive, node_keep_alive + 1, 0):
        with pytest.raises(ValueError, match="keep-alive"):
            settings(upstream_keepalive_s=bad)
    with pytest.raises(SystemExit):
        parse_args(["--render", "http://r1", "--generate", "http://g1", "--model", "m",
                    "--upstream-keepalive-s", str(node_keep_alive)])  # fmt: skip
