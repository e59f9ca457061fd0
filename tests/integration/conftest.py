"""Integration fixtures: real services started as processes, once per module."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
