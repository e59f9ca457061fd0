"""A stand-in render or generate node as a process, for door tests that need real processes but
no engine: ``python -m tests.support.standin_node --host 127.0.0.2 --port P --version v1``.

It answers /health; /weight_info with its version (changed by /update_weight_version, as
generate's); /inference/v1/generate with ``{"node": HOST, "request_id": ...}``; and /seen with
the request ids it generated for, in order."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


def create_app(host: str, version: str) -> Starlette:
    state = {"version": version, "seen": []}

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def weight_info(request: Request) -> Response:
        return JSONResponse({"weight_version": state["version"]})

    async def update_weight_version(request: Request) -> Response:
        state["version"] = (await request.json())["new_version"]
        return JSONResponse({})

    async def generate(request: Request) -> Response:
        request_id = (await request.json())["request_id"]
        state["seen"].append(request_id)
        return JSONResponse({"node": host, "request_id": request_id})

    async def seen(request: Request) -> Response:
        return JSONResponse(state["seen"])

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/weight_info", weight_info),
            Route("/update_weight_version", update_weight_version, methods=["POST"]),
            Route("/inference/v1/generate", generate, methods=["POST"]),
            Route("/seen", seen),
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--version", default="v1")
    args = p.parse_args(argv)
    uvicorn.run(create_app(args.host, args.version), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
