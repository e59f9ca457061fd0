"""A service's ``/openapi.json``: FastAPI's route list with the wire bodies' JSON Schemas added.

The routes read raw bodies (JSON or msgpack wire documents), so FastAPI cannot see their shape;
each service names the JSON Schema of each POST body and this module puts them into the document
(OpenAPI 3.1, whose schemas are JSON Schema), with the typed error body on every 4xx/5xx answer.
Schema-driven tools (client generators, fuzzers such as schemathesis) read it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response

from tandem_wire import ErrorBody

__all__ = ["OPENAPI_PATH", "REF_TEMPLATE", "BodySchemas", "install_openapi", "openapi_document"]

OPENAPI_PATH = "/openapi.json"
REF_TEMPLATE = "#/components/schemas/{name}"
"""Where every shared definition lives in the document (``{model}`` for pydantic)."""

JSON_TYPE = "application/json"


@dataclass
class BodySchemas:
    """Request-body schemas by POST path, and the definitions they refer to."""

    bodies: dict[str, dict[str, Any]] = field(default_factory=dict)
    components: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def of_structs(cls, types: Mapping[str, Any]) -> BodySchemas:
        """Schemas of msgspec types (JSON mode), by path."""
        paths = list(types)
        schemas, components = msgspec.json.schema_components(
            [types[p] for p in paths], ref_template=REF_TEMPLATE
        )
        return cls(dict(zip(paths, schemas, strict=True)), components)

    @classmethod
    def of_json_schemas(cls, schemas: Mapping[str, dict[str, Any]]) -> BodySchemas:
        """Schemas already made (pydantic's ``model_json_schema``), their ``$defs`` refs
        pointing at :data:`REF_TEMPLATE` already; the ``$defs`` move into the components."""
        out = cls()
        for path, schema in schemas.items():
            body = dict(schema)
            out._add_components(body.pop("$defs", {}))
            out.bodies[path] = body
        return out

    def merged(self, other: BodySchemas) -> BodySchemas:
        """Both sets; a definition name given two different schemas is a programming error."""
        out = BodySchemas(dict(self.bodies), dict(self.components))
        out._add_components(other.components)
        out.bodies.update(other.bodies)
        return out

    def prefixed(self, prefix: str) -> BodySchemas:
        """The same schemas with every definition renamed ``prefix + name`` (references
        rewritten), so that two services' definitions of one name can sit side by side."""
        old = REF_TEMPLATE.format(name="")
        renamed = {old + name: old + prefix + name for name in self.components}

        def walk(node: Any) -> Any:
            if isinstance(node, dict):
                return {k: renamed.get(v, v) if k == "$ref" else walk(v) for k, v in node.items()}
            if isinstance(node, list):
                return [walk(v) for v in node]
            return node

        return BodySchemas(
            {path: walk(body) for path, body in self.bodies.items()},
            {prefix + name: walk(schema) for name, schema in self.components.items()},
        )

    def _add_components(self, defs: Mapping[str, dict[str, Any]]) -> None:
        for name, schema in defs.items():
            if self.components.setdefault(name, schema) != schema:
                raise ValueError(f"two different schemas named {name!r}")


def openapi_document(app: FastAPI, schemas: BodySchemas) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``app``'s routes with ``schemas`` filled in."""
    doc = get_openapi(
        title=app.title, version=_version(), openapi_version="3.1.0", routes=app.routes
    )
    errors = BodySchemas.of_structs({"": ErrorBody})
    all_schemas = schemas.merged(BodySchemas(components=errors.components))
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    components.update(all_schemas.components)
    error_answer = {"content": {JSON_TYPE: {"schema": errors.bodies[""]}}}
    for path, methods in doc.get("paths", {}).items():
        for method, op in methods.items():
            op.setdefault("responses", {}).update(
                {
                    "4XX": {"description": "Typed refusal", **error_answer},
                    "5XX": {"description": "Typed failure", **error_answer},
                }
            )
            body = schemas.bodies.get(path) if method == "post" else None
            if body is None:
                continue
            # JSON only: the msgpack form has the same fields, with bytes where JSON has base64.
            op["requestBody"] = {"required": True, "content": {JSON_TYPE: {"schema": body}}}
    return doc


def install_openapi(app: FastAPI, schemas: Callable[[Request], Awaitable[BodySchemas]]) -> None:
    """Serve ``GET /openapi.json``; ``schemas`` is asked on the first call (it may need what
    the app builds at start-up) and the document is kept."""
    cached: list[bytes] = []

    @app.get(OPENAPI_PATH, include_in_schema=False)
    async def openapi(request: Request) -> Response:
        if not cached:
            doc = openapi_document(app, await schemas(request))
            cached.append(json.dumps(doc, separators=(",", ":")).encode())
        return Response(cached[0], media_type=JSON_TYPE)


def _version() -> str:
    try:
        return version("tandem")
    except PackageNotFoundError:
        return "0"
