"""The front door over nodes on Unix-domain sockets (``unix:/PATH``): stand-in nodes served
by uvicorn on real sockets, the door in-process. Routing, fan-out, health, failover, the body
cap a node tells, and the node named as given in answers and metrics."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tandem_client.routing import rendezvous_order
from tandem_front.app import create_app
from tandem_front.settings import FrontSettings
from tandem_http import MAX_BODY_HEADER
from tests.support.asgi import app_client
from tests.support.unix_server import serving_on_socket

pytestmark = pytest.mark.anyio


class Texts:
    """The OpenAI routes are not exercised here."""


@pytest.fixture
def sockets() -> Iterator[Path]:
    # Short: a socket path holds at most 107 bytes, and pytest's tmp_path can be long.
    with tempfile.TemporaryDirectory(prefix="tf-", dir="/tmp") as folder:
        yield Path(folder)


def node(name: str, seen: list[tuple[str, str]], cap: int | None = None) -> Starlette:
    """A stand-in node that records (name, path) of what reached it; ``cap``: the body cap it
    tells on every answer."""
    headers = {MAX_BODY_HEADER: str(cap)} if cap else {}

    async def handle(request: Request) -> Response:
        await request.body()
        if request.url.path == "/weight_info":
            return JSONResponse({"weight_version": "v1"}, headers=headers)
        seen.append((name, request.url.path))
        return JSONResponse({"node": name}, headers=headers)

    paths = ["/health", "/weight_info", "/inference/v1/generate", "/reset_prefix_cache"]
    paths += ["/v1/chat/completions/render"]
    return Starlette(routes=[Route(p, handle, methods=["GET", "POST"]) for p in paths])


async def _serve(stack: AsyncExitStack, sockets: Path, seen: list, **caps: int | None) -> list:
    return [
        await stack.enter_async_context(
            serving_on_socket(node(name, seen, cap), sockets / f"{name}.sock")
        )
        for name, cap in caps.items()
    ]


def _settings(render: list[str], generate: list[str]) -> FrontSettings:
    return FrontSettings(
        render_urls=tuple(render),
        generate_urls=tuple(generate),
        model="m",
        enable_control_routes=True,
    )


async def test_the_door_routes_fans_out_and_checks_health_over_sockets(sockets):
    seen: list[tuple[str, str]] = []
    async with AsyncExitStack() as stack:
        r1, g1, g2 = await _serve(stack, sockets, seen, r1=None, g1=None, g2=None)
        s = _settings([r1], [g1, g2])
        async with app_client(create_app(s, Texts())) as c:
            health = await c.get("/health")
            rendered = await c.post("/v1/chat/completions/render", json={"messages": []})
            answers = {}
            for rid in ("a", "b", "c", "d", "e", "f"):
                body = {"request_id": rid, "token_ids": [1], "sampling_params": {}}
                answers[rid] = (await c.post("/inference/v1/generate", json=body)).json()
            fanned = await c.post("/reset_prefix_cache")
            metrics = (await c.get("/metrics")).text
    assert health.status_code == 200 and health.json()["generate"] == 2
    assert rendered.json() == {"node": "r1"}
    by_url = {g1: "g1", g2: "g2"}
    for rid, answer in answers.items():
        # The rendezvous order over the URLs as given, as tandem_client computes it.
        assert answer == {"node": by_url[rendezvous_order(rid, [g1, g2])[0]]}
    assert {a["node"] for a in answers.values()} == {"g1", "g2"}
    assert [n["url"] for n in fanned.json()["nodes"]] == [g1, g2]
    assert {("g1", "/reset_prefix_cache"), ("g2", "/reset_prefix_cache")} <= set(seen)
    assert f'node="{g1}"' in metrics and f'node="{r1}"' in metrics


async def test_a_socket_nobody_listens_on_fails_over_and_is_named(sockets):
    seen: list[tuple[str, str]] = []
    gone = f"unix:{sockets}/gone.sock"
    async with AsyncExitStack() as stack:
        (live,) = await _serve(stack, sockets, seen, live=None)
        async with app_client(create_app(_settings([gone, live], [gone, live]), Texts())) as c:
            for rid in ("a", "b", "c", "d"):
                body = {"request_id": rid, "token_ids": [1], "sampling_params": {}}
                r = await c.post("/inference/v1/generate", json=body)
                assert r.json() == {"node": "live"}
    async with app_client(create_app(_settings([gone], [gone]), Texts())) as c:
        body = {"request_id": "a", "token_ids": [1], "sampling_params": {}}
        r = await c.post("/inference/v1/generate", json=body)
    assert r.status_code == 503
    assert r.json()["error"]["type"] == "upstream_unavailable"
    assert gone in r.json()["error"]["message"]


async def test_the_body_cap_a_socket_node_tells_is_the_doors(sockets):
    seen: list[tuple[str, str]] = []
    async with AsyncExitStack() as stack:
        r1, g1, g2 = await _serve(stack, sockets, seen, r1=None, g1=4000, g2=None)
        async with app_client(create_app(_settings([r1], [g1, g2]), Texts())) as c:
            await c.get("/health")
            body = {"request_id": "a", "token_ids": [1], "sampling_params": {}, "pad": ""}
            fits = await c.post("/inference/v1/generate", json={**body, "pad": "x" * 3000})
            over = await c.post("/inference/v1/generate", json={**body, "pad": "x" * 5000})
    assert fits.status_code == 200
    assert over.status_code == 413 and over.json()["error"]["type"] == "payload_too_large"
