"""Nodes on Unix-domain sockets (``unix:/PATH``): the URLs checked, and tandem_client's HTTP
client reaching stand-in nodes served by uvicorn on real sockets."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tandem_client import AsyncTandemClient, TransportError
from tandem_client.discovery import parse_node_spec
from tandem_client.unix_nodes import node_client, unix_socket_path
from tests.support.standin_node import create_app as standin
from tests.support.unix_server import serving_on_socket

pytestmark = pytest.mark.anyio


@pytest.fixture
def sockets() -> Iterator[Path]:
    # Short: a socket path holds at most 107 bytes, and pytest's tmp_path can be long.
    with tempfile.TemporaryDirectory(prefix="tu-", dir="/tmp") as folder:
        yield Path(folder)


def test_unix_node_urls_are_node_specs():
    spec = parse_node_spec("unix:/run/tandem/generate.sock/")
    assert (spec.text, spec.scheme, spec.name) == ("unix:/run/tandem/generate.sock", "unix", None)
    assert unix_socket_path("unix:/run/tandem/Gen_1.sock") == "/run/tandem/Gen_1.sock"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("unix:", "absolute path"),
        ("unix:run/generate.sock", "absolute path"),
        ("unix:///run/generate.sock", "one slash"),
        ("unix://host/run/generate.sock", "one slash"),
        ("unix:/run/my generate.sock", "letters, digits"),
        ("unix:/run/gen.sock?x=1", "letters, digits"),
        ("unix:/run/gen%2F.sock", "letters, digits"),
        ("unix:/run/../gen.sock", r"\.\. segment"),
        ("unix:/run//gen.sock", "empty"),
        ("unix:/" + "s" * 107, "107 bytes"),
        ("dns+unix:/run/gen.sock", "not a node URL"),
    ],
)
def test_malformed_unix_urls_are_refused_saying_why(url, why):
    with pytest.raises(ValueError, match=why):
        parse_node_spec(url)


def test_the_client_refuses_a_malformed_unix_render_url():
    with pytest.raises(ValueError, match="absolute path"):
        AsyncTandemClient("unix:render.sock", "http://g")


def _echo() -> Starlette:
    async def echo(request: Request) -> Response:
        body = await request.body()
        return JSONResponse(
            {
                "path": request.url.path,
                "query": request.url.query,
                "host": request.headers.get("host"),
                "body": body.decode(),
            }
        )

    return Starlette(routes=[Route("/{rest:path}", echo, methods=["GET", "POST"])])


async def test_requests_reach_each_socket_with_their_route_query_and_streamed_body(sockets):
    async def chunks():
        yield b"first,"
        yield b"second"

    async with (
        serving_on_socket(_echo(), sockets / "a.sock") as a,
        serving_on_socket(standin("b", "v9"), sockets / "b.sock") as b,
        node_client([a, b], httpx.Limits()) as http,
    ):
        r = await http.post(f"{a}/v1/chat/completions/render?x=1&y=2", content=chunks())
        assert r.json() == {
            "path": "/v1/chat/completions/render",
            "query": "x=1&y=2",
            "host": "localhost",
            "body": "first,second",
        }
        assert str(r.request.url) == f"{a}/v1/chat/completions/render?x=1&y=2"
        assert (await http.get(f"{b}/weight_info")).json() == {"weight_version": "v9"}
        with pytest.raises(httpx.UnsupportedProtocol, match="no node of this client"):
            await http.get(f"unix:{sockets}/other.sock/health")


async def test_tandem_client_asks_each_node_on_its_socket(sockets):
    async with (
        serving_on_socket(standin("g1", "v1"), sockets / "g1.sock") as g1,
        serving_on_socket(standin("g2", "v2"), sockets / "g2.sock") as g2,
        AsyncTandemClient(f"unix:{sockets}/render.sock", [g1, g2], max_retries=0) as client,
    ):
        assert await client.weight_versions() == {g1: "v1", g2: "v2"}


async def test_a_socket_nobody_listens_on_is_a_transport_error_naming_the_node(sockets):
    gone = f"unix:{sockets}/gone.sock"
    async with AsyncTandemClient(gone, [gone], max_retries=0, control_timeout_s=2) as client:
        with pytest.raises(TransportError, match=f"{gone}/weight_info"):
            await client.weight_versions()
