"""In-process HTTP clients for ASGI apps, with the app's lifespan run around them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx


@asynccontextmanager
async def app_client(
    app, base_url: str = "http://app", **kwargs
) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=base_url, **kwargs) as c:
            yield c


class HostRouter(httpx.AsyncBaseTransport):
    """Sends each request to the in-process app named by its host (``http://render/...``)."""

    def __init__(self, apps: dict[str, object]) -> None:
        self.transports = {host: httpx.ASGITransport(app=app) for host, app in apps.items()}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.transports[request.url.host].handle_async_request(request)
