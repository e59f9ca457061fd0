"""``--render inline``: render's own app inside each door worker, reached in-process.

For one-box deployments: rendering then costs no process of its own, no hop over loopback
and no second copy of render's answer on the wire. The render tier is still render's code
and routes, whole (admission, media policy, errors, every ``/render`` route): the door
sends it the same requests, to ``INLINE_RENDER_URL``, through an ASGI transport instead of
a socket. Render's work runs on the door worker's event loop (as in a render worker), so
while it renders the worker serves nothing else: fleets keep the separate render service.

The one place a service hosts another: render's package is imported only here, and only
when this mode is asked for (render never imports the door).
"""

from __future__ import annotations

import shlex
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import httpx

from tandem_http import settings_to_json

from .settings import FrontSettings

__all__ = ["INLINE", "INLINE_RENDER_URL", "inline_render_settings", "render_mounts"]

INLINE = "inline"
"""The ``--render`` value that asks for it."""

INLINE_RENDER_URL = "http://render.inline"
"""The render node's URL inside the door (no socket is behind it)."""

SHARED_FIELDS = (
    "model",
    "served_model_name",
    "tokenizer",
    "trust_remote_code",
    "chat_template",
    "default_chat_template_kwargs",
    "cohere_format",
    "tool_call_parser",
    "enable_auto_tool_choice",
    "exclude_tools_when_tool_choice_none",
    "tool_strict_level",
    "reasoning_parser",
)
"""The settings render and the door's answer side must agree on: the door's are render's."""


def inline_render_settings(front: FrontSettings, render_args: str) -> str:
    """Render's settings (JSON) for the door's workers: ``render_args`` are render's own
    command-line options (``python -m tandem_render --help``), the model and its parsing
    the door's. Raises SystemExit, with render's usage, for options render refuses."""
    from tandem_render.__main__ import parse_args

    settings = parse_args(["--model", front.model, *shlex.split(render_args)])
    settings = replace(
        settings,
        **{name: getattr(front, name) for name in SHARED_FIELDS},
        api_key=None,  # nothing reaches it but the door's own requests
        workers=front.workers,  # its byte budget is shared by as many processes
    )
    return settings_to_json(settings)


@asynccontextmanager
async def render_mounts(
    settings_json: str | None,
) -> AsyncIterator[dict[str, httpx.AsyncBaseTransport]]:
    """The door's in-process transports (httpx mounts): with render's settings, render's app
    started (its tokenizer and processor loaded) at ``INLINE_RENDER_URL``, stopped on exit;
    without, none."""
    if settings_json is None:
        yield {}
        return
    from tandem_render.app import create_app
    from tandem_render.settings import RenderSettings

    app = create_app(RenderSettings.from_json(settings_json))
    async with app.router.lifespan_context(app):
        yield {INLINE_RENDER_URL: httpx.ASGITransport(app=app)}
