"""Generate's ``--content-parts-render-url`` may name a render node on a Unix-domain socket
(``unix:/PATH``): its one client of render is tandem_client's. Here, without an engine, a
stand-in render on a real socket answers, and its answer (or its absence) reaches the caller.
(Not under tests/unit/generate: that folder's fixtures import vLLM.)"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tandem_generate.content_parts import ContentPartsResolver
from tandem_generate.errors import RenderRefused, RenderUnavailable
from tandem_generate.settings import GenerateSettings
from tandem_wire import GenerateRequest
from tests.support.unix_server import serving_on_socket

pytestmark = pytest.mark.anyio

PART = {"type": "image_url", "url": "https://example.com/cat.png"}


@pytest.fixture
def sockets() -> Iterator[Path]:
    # Short: a socket path holds at most 107 bytes, and pytest's tmp_path can be long.
    with tempfile.TemporaryDirectory(prefix="tg-", dir="/tmp") as folder:
        yield Path(folder)


def _render_refusing() -> Starlette:
    async def render(request: Request) -> Response:
        await request.body()
        error = {"type": "invalid_request", "message": "render saw it on its socket"}
        return JSONResponse({"error": error}, 400)

    return Starlette(routes=[Route("/v1/completions/render", render, methods=["POST"])])


def _resolver(url: str) -> ContentPartsResolver:
    settings = GenerateSettings(
        served_model_names=("m",), content_parts_render_url=url, content_parts_render_timeout_s=5
    )
    return ContentPartsResolver(settings, max_answer_bytes=1 << 20)


async def test_a_render_node_on_a_socket_resolves_content_parts(sockets):
    request = GenerateRequest(token_ids=[1, 2], content_parts=[PART])
    async with serving_on_socket(_render_refusing(), sockets / "render.sock") as url:
        resolver = _resolver(url)
        try:
            with pytest.raises(RenderRefused, match="render saw it on its socket"):
                await resolver.resolve(request)
        finally:
            await resolver.aclose()
    gone = _resolver(f"unix:{sockets}/render.sock")
    try:
        with pytest.raises(RenderUnavailable, match=f"unix:{sockets}/render.sock"):
            await gone.resolve(request)
    finally:
        await gone.aclose()
