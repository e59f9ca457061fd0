"""Render test fixtures: one real vLLM render stack per model for the whole session."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from tools.tiny_models import ensure_model


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def qwen2_dir():
    return str(ensure_model("qwen2-vl"))


@pytest.fixture(scope="session")
def qwen2_renderer(qwen2_dir):
    from tandem_render.settings import RenderSettings
    from tandem_render.vllm_renderer import EngineRenderer

    return EngineRenderer(RenderSettings(model=qwen2_dir, max_images_per_prompt=4))


@asynccontextmanager
async def app_client(app, **kwargs) -> AsyncIterator[httpx.AsyncClient]:
    """An in-process client for ``app`` with its lifespan run around it."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://render", **kwargs) as c:
            yield c


@pytest.fixture(scope="session")
def qwen3_renderer():
    from tandem_render.settings import RenderSettings
    from tandem_render.vllm_renderer import EngineRenderer

    return EngineRenderer(RenderSettings(model=str(ensure_model("qwen3-vl"))))
