"""The door over a DNS name (``dns+http://``) whose addresses change while it runs: requests
reach a node that joins, none reach a node that left, only the changed node's keys move, and
a node at another weight version gets no work until it reports the fleet's. DNS is a fake
resolver handed to the app; the nodes are in-process stand-ins that record what reached them."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tandem_client.routing import rendezvous_order
from tandem_front.app import create_app
from tandem_front.settings import FrontSettings
from tests.support.asgi import app_client

pytestmark = pytest.mark.anyio

NAME = "generate.test"
KEYS = [f"req-{i}" for i in range(60)]


class StandIn:
    """A generate node: answers generate with its address, /weight_info with ``version``."""

    def __init__(self, address: str, version: str) -> None:
        self.address = address
        self.version = version
        self.generated: list[str] = []  # request ids, in order
        self.control: list[str] = []

    async def handle(self, request: Request) -> Response:
        path = request.url.path
        if path == "/inference/v1/generate":
            self.generated.append((await request.json())["request_id"])
            return JSONResponse({"node": self.address})
        if path == "/weight_info":
            return JSONResponse({"weight_version": self.version})
        self.control.append(path)
        return JSONResponse({})

    def app(self) -> Starlette:
        paths = ["/health", "/inference/v1/generate", "/weight_info", "/pause"]
        return Starlette(routes=[Route(p, self.handle, methods=["GET", "POST"]) for p in paths])


class Network(httpx.AsyncBaseTransport):
    """Every stand-in at its address, whether DNS names it or not, and a resolver for NAME."""

    def __init__(self, addresses: list[str], version: str = "v1") -> None:
        self.nodes: dict[str, StandIn] = {}
        self.transports: dict[str, httpx.ASGITransport] = {}
        self.answer: list[str] | Exception = []
        for a in addresses:
            self.start(a, version)
        self.answer = list(addresses)
        self.lookups = 0
        self.down: set[str] = set()
        self.connects: list[str] = []

    def start(self, address: str, version: str) -> StandIn:
        node = self.nodes[address] = StandIn(address, version)
        self.transports[address] = httpx.ASGITransport(app=node.app())
        return node

    async def resolve(self, name: str, port: int) -> list[str]:
        assert (name, port) == (NAME, 8200)
        self.lookups += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return list(self.answer)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.connects.append(request.url.host)
        if request.url.host in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        return await self.transports[request.url.host].handle_async_request(request)


def settings(**kw) -> FrontSettings:
    base = dict(
        render_urls=("http://render",),
        generate_urls=(f"dns+http://{NAME}:8200",),
        model="m",
        enable_control_routes=True,
        discovery_interval_s=3600.0,  # the tests resolve again by hand, except one
    )
    return FrontSettings(**{**base, **kw})


def door(net: Network, **kw):
    return app_client(create_app(settings(**kw), object(), net, resolve=net.resolve))


async def placement(c: httpx.AsyncClient) -> dict[str, str]:
    """Which node each key's request reached (text-only requests route by request id)."""
    out = {}
    for key in KEYS:
        r = await c.post(
            "/inference/v1/generate",
            json={"request_id": key, "token_ids": [1, 2], "sampling_params": {}},
        )
        assert r.status_code == 200, r.text
        out[key] = r.json()["node"]
    return out


async def resolve_again(app) -> None:
    await app.state.node_watch.refresh()


async def test_a_node_that_joins_the_name_gets_only_the_keys_it_wins():
    net = Network(["10.0.0.1", "10.0.0.2"])
    app = create_app(settings(), object(), net, resolve=net.resolve)
    async with app_client(app) as c:
        before = await placement(c)
        assert set(before.values()) == {"10.0.0.1", "10.0.0.2"}
        net.start("10.0.0.3", "v1")
        net.answer = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
        await resolve_again(app)
        after = await placement(c)
    moved = {k for k in KEYS if after[k] != before[k]}
    assert moved, "no request reached the new node"
    assert {after[k] for k in moved} == {"10.0.0.3"}  # a key moves only to the new node
    assert net.nodes["10.0.0.3"].generated == sorted(moved, key=KEYS.index)


async def test_a_node_that_leaves_the_name_gets_no_more_work_and_only_its_keys_move():
    net = Network(["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    app = create_app(settings(), object(), net, resolve=net.resolve)
    async with app_client(app) as c:
        before = await placement(c)
        assert "10.0.0.2" in before.values()
        net.answer = ["10.0.0.1", "10.0.0.3"]  # it still answers: only DNS dropped it
        await resolve_again(app)
        served = len(net.nodes["10.0.0.2"].generated)
        after = await placement(c)
    assert len(net.nodes["10.0.0.2"].generated) == served
    for key in KEYS:
        if before[key] != "10.0.0.2":
            assert after[key] == before[key], key


async def test_nodes_that_stay_keep_their_state_a_cool_down_included():
    net = Network(["10.0.0.1", "10.0.0.2"])
    app = create_app(settings(), object(), net, resolve=net.resolve)
    async with app_client(app) as c:
        before = await placement(c)
        three = [f"http://10.0.0.{i}:8200" for i in (1, 2, 3)]
        key = next(k for k in KEYS if rendezvous_order(k, three)[0] == three[0])
        assert before[key] == "10.0.0.1"
        body = {"request_id": key, "token_ids": [1], "sampling_params": {}}
        net.down.add("10.0.0.1")
        assert (await c.post("/inference/v1/generate", json=body)).json()["node"] == "10.0.0.2"
        net.start("10.0.0.3", "v1")
        net.answer = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
        await resolve_again(app)
        net.connects.clear()
        await c.post("/inference/v1/generate", json=body)
    # Still cooling down: not tried first (a node rebuilt by the re-resolution would be).
    assert net.connects[0] != "10.0.0.1"


async def test_a_failed_or_empty_lookup_keeps_the_last_nodes():
    net = Network(["10.0.0.1", "10.0.0.2"])
    app = create_app(settings(), object(), net, resolve=net.resolve)
    async with app_client(app) as c:
        before = await placement(c)
        for answer in (OSError("no server"), []):
            net.answer = answer
            await resolve_again(app)
            assert await placement(c) == before
        assert net.lookups == 3


async def test_a_new_node_at_another_weight_version_gets_no_work_until_it_reports_the_fleets():
    net = Network(["10.0.0.1", "10.0.0.2"], version="step-7")
    app = create_app(settings(), object(), net, resolve=net.resolve)
    async with app_client(app) as c:
        before = await placement(c)
        fresh = net.start("10.0.0.3", "base")  # a new pod: the model's own weights
        net.answer = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
        await resolve_again(app)
        assert await placement(c) == before
        assert fresh.generated == []
        # It still hears control calls (the trainer's next update brings it level).
        assert (await c.post("/pause")).status_code == 200
        assert fresh.control == ["/pause"]
        info = (await c.get("/weight_info")).json()
        assert {n["url"]: n["weight_version"] for n in info["nodes"]}["http://10.0.0.3:8200"] == (
            "base"
        )

        fresh.version = "step-7"
        await resolve_again(app)
        after = await placement(c)
    assert fresh.generated and {after[k] for k in fresh.generated} == {"10.0.0.3"}


async def test_the_door_looks_the_name_up_again_on_its_own():
    net = Network(["10.0.0.1"])
    async with door(net, discovery_interval_s=0.02) as c:
        await placement(c)
        new = net.start("10.0.0.2", "v1")
        net.answer = ["10.0.0.1", "10.0.0.2"]
        for _ in range(500):  # up to ~10 s; it takes about two intervals
            await asyncio.sleep(0.02)
            await placement(c)
            if new.generated:
                break
    assert new.generated


async def test_the_first_lookup_s_nodes_serve_when_they_hold_the_same_weights():
    net = Network(["10.0.0.1", "10.0.0.2"], version="a")
    async with door(net) as c:
        assert set((await placement(c)).values()) == {"10.0.0.1", "10.0.0.2"}
    # On two sets of weights, only one set serves, the same on every router.
    net = Network(["10.0.0.1", "10.0.0.2", "10.0.0.3"], version="a")
    net.nodes["10.0.0.2"].version = "b"
    async with door(net) as c:
        await c.get("/weight_info")
        assert set((await placement(c)).values()) == {"10.0.0.1", "10.0.0.3"}


def test_bad_node_specs_are_refused_with_the_entry_named():
    for spec in ("dns+https://g:8200", "dns+http://g", "ftp://g", "dns+http://g:8200/x"):
        with pytest.raises(ValueError, match="g"):
            settings(generate_urls=(spec,))


async def test_a_node_that_leaves_takes_its_metric_series_with_it():
    # Every address a name ever had was a label set kept for the door's life.
    net = Network(["10.0.0.1", "10.0.0.2"])
    app = create_app(settings(), object(), net, resolve=net.resolve)
    gone = 'node="http://10.0.0.2:8200"'
    async with app_client(app) as c:
        await placement(c)
        net.down.add("10.0.0.2")  # its error series too, beside its latency ones
        await placement(c)
        assert gone in (await c.get("/metrics")).text
        net.answer = ["10.0.0.1"]
        await resolve_again(app)
        text = (await c.get("/metrics")).text
        metrics = app.state.forwarder.metrics
    assert gone not in text
    assert 'node="http://10.0.0.1:8200"' in text
    for metric in (metrics.upstream_latency, metrics.upstream_errors):
        assert all("http://10.0.0.2:8200" not in labels for labels in metric._metrics)
