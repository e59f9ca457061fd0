"""An ASGI app served by uvicorn on a Unix-domain socket, in the test's own event loop: a real
socket between the door or tandem_client and a stand-in node, with no process to start."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import uvicorn


@asynccontextmanager
async def serving_on_socket(app, path: Path) -> AsyncIterator[str]:
    """Serve ``app`` on the socket ``path`` until the block ends; yields the node's URL
    (``unix:PATH``)."""
    config = uvicorn.Config(app, uds=str(path), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve())
    try:
        for _ in range(2000):
            if server.started or task.done():
                break
            await asyncio.sleep(0.005)
        if task.done():
            task.result()  # the reason it did not start
        assert server.started, f"uvicorn did not start on {path}"
        yield f"unix:{path}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # uvicorn.Server leaves its socket file (uvicorn.run removes it)
