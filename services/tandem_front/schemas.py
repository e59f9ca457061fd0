"""The front door's body schemas, as the nodes behind it publish theirs (``/openapi.json``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import httpx

from tandem_http.openapi import JSON_TYPE, OPENAPI_PATH, BodySchemas

from .errors import UpstreamError, UpstreamUnavailable
from .upstreams import Node, Upstreams

__all__ = ["upstream_body_schemas"]

# The door's own OpenAI routes take the bodies of the render routes they are built on.
_OWN_ROUTES = {
    "/v1/chat/completions": "/v1/chat/completions/render",
    "/v1/completions": "/v1/completions/render",
}


async def upstream_body_schemas(
    ups: Upstreams, render_paths: Iterable[str], generate_paths: Iterable[str]
) -> BodySchemas:
    """Render's schemas for ``render_paths`` and the door's OpenAI routes, generate's for
    ``generate_paths`` (those it gives a body)."""
    render = await _document(ups, ups.render_order())
    generate = await _document(ups, ups.generate_order(OPENAPI_PATH))
    render_bodies = {p: _body(render, p) for p in render_paths}
    render_bodies.update({own: _body(render, path) for own, path in _OWN_ROUTES.items()})
    generate_bodies = {p: _body(generate, p) for p in generate_paths}
    # The two services may define one name differently (vLLM's pydantic request models on
    # render, msgspec's view of its SamplingParams on generate): each keeps its own namespace.
    return (
        _schemas(render, render_bodies)
        .prefixed("render.")
        .merged(_schemas(generate, generate_bodies).prefixed("generate."))
    )


def _schemas(doc: dict[str, Any], bodies: dict[str, dict[str, Any] | None]) -> BodySchemas:
    components = doc.get("components", {}).get("schemas", {})
    return BodySchemas({p: b for p, b in bodies.items() if b is not None}, dict(components))


async def _document(ups: Upstreams, nodes: Sequence[Node]) -> dict[str, Any]:
    for node in nodes:
        try:
            answer = await ups.http.get(node.url + OPENAPI_PATH)
        except httpx.HTTPError:
            continue
        if answer.status_code == 200:
            try:
                doc = answer.json()
            except ValueError:
                raise UpstreamError(f"{node.url} answered an unreadable schema") from None
            if isinstance(doc, dict):
                return doc
    tier = nodes[0].tier if nodes else "upstream"
    raise UpstreamUnavailable(f"no {tier} node answered {OPENAPI_PATH}")


def _body(doc: dict[str, Any], path: str) -> dict[str, Any] | None:
    try:
        schema = doc["paths"][path]["post"]["requestBody"]["content"][JSON_TYPE]
    except (KeyError, TypeError):
        return None
    return schema.get("schema") if isinstance(schema, dict) else None
