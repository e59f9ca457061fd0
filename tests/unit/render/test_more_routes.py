"""Render's derender, Responses and Messages routes in-process: bad input is a typed 4xx and
the service keeps serving; admission applies to each."""

from __future__ import annotations

import base64
import dataclasses
import json

import pytest

from tandem_render.app import PATHS, create_app
from tandem_render.settings import RenderSettings
from tandem_render.vllm_renderer import EngineRenderer

from ...support.asgi import app_client
from ...support.images import data_url, png_bytes
from ...support.parser_model import parser_model

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]

CHAT_DERENDER = PATHS["chat_derender"]
COMPLETION_DERENDER = PATHS["completion_derender"]
RESPONSES = PATHS["responses"]
MESSAGES = PATHS["messages"]


@pytest.fixture(scope="module")
def settings(tmp_path_factory):
    return RenderSettings(
        model=str(parser_model(tmp_path_factory.mktemp("models"))),
        max_images_per_prompt=2,
        pretouch_cache_memory=False,
        tool_call_parser="hermes",
        enable_auto_tool_choice=True,
        reasoning_parser="deepseek_r1",
    )


@pytest.fixture(scope="module")
def renderer(settings):
    return EngineRenderer(settings)


@pytest.fixture
def app(settings, renderer):
    return create_app(settings, renderer=renderer)


def chat_request(model: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}]}


def whole(model: str, token_ids: list[int], **extra) -> dict:
    return {
        "generate_response": {
            "request_id": "r",
            "choices": [{"index": 0, "token_ids": token_ids}],
        },
        "chat_request": chat_request(model),
        **extra,
    }


def chunk(model: str, token_ids: list[int], **extra) -> dict:
    return {
        "stream": True,
        "generate_chunk": {"request_id": "r", "choices": [{"index": 0, "token_ids": token_ids}]},
        "chat_request": chat_request(model),
        "prompt_token_ids": [1, 2],
        **extra,
    }


def image_block(source: dict) -> dict:
    return {"role": "user", "content": [{"type": "image", "source": source}]}


def bad_cases(model: str) -> list[tuple[str, str, object, int, str]]:
    """(name, path, body, status, error type)."""
    png = data_url(png_bytes(seed=5))
    return [
        ("derender body not an object", CHAT_DERENDER, [1, 2], 400, "invalid_request"),
        ("derender not JSON", CHAT_DERENDER, b"{", 400, "malformed_body"),
        ("no generate_response", CHAT_DERENDER, {"chat_request": {}}, 400, "invalid_request"),
        (
            "token id past the vocabulary",
            CHAT_DERENDER,
            whole(model, [5, 10**6]),
            400,
            "token_out_of_vocabulary",
        ),
        (
            "negative token id",
            COMPLETION_DERENDER,
            {
                "generate_responses": [
                    {"request_id": "r", "choices": [{"index": 0, "token_ids": [-1]}]}
                ]
            },
            400,
            "invalid_request",
        ),
        (
            "stream_state output ids past the vocabulary",
            CHAT_DERENDER,
            chunk(model, [5], stream_state={"output_token_ids": [99999], "output_chunk_lens": [1]}),
            400,
            "token_out_of_vocabulary",
        ),
        (
            "unknown model",
            CHAT_DERENDER,
            {**whole(model, [5]), "model": "other"},
            404,
            "model_not_found",
        ),
        (
            "parsers on, no chat_request",
            CHAT_DERENDER,
            {**whole(model, [5]), "chat_request": None},
            400,
            "BadRequestError",
        ),
        (
            "parsers on, stream without prompt ids",
            CHAT_DERENDER,
            chunk(model, [5], prompt_token_ids=None),
            400,
            "BadRequestError",
        ),
        ("responses: no input", RESPONSES, {"model": model}, 400, "invalid_request"),
        (
            "responses: previous_response_id",
            RESPONSES,
            {"model": model, "input": "hi", "previous_response_id": "resp_1"},
            400,
            "BadRequestError",
        ),
        (
            "responses: file_id image",
            RESPONSES,
            {
                "model": model,
                "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}],
            },
            400,
            "invalid_request",
        ),
        (
            "responses: a file part",
            RESPONSES,
            {
                "model": model,
                "input": [{"role": "user", "content": [{"type": "input_file", "file_url": png}]}],
            },
            400,
            "invalid_request",
        ),
        (
            "responses: three images (limit 2)",
            RESPONSES,
            {
                "model": model,
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": png}] * 3,
                    }
                ],
            },
            400,
            "BadRequestError",
        ),
        (
            "responses: image from a private address",
            RESPONSES,
            {
                "model": model,
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "http://127.0.0.1/x.png"}],
                    }
                ],
            },
            403,
            "media_url_forbidden",
        ),
        (
            "responses: not an image",
            RESPONSES,
            {
                "model": model,
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
                        ],
                    }
                ],
            },
            400,
            "invalid_image",
        ),
        (
            "messages: none",
            MESSAGES,
            {"model": model, "max_tokens": 5, "messages": []},
            400,
            "invalid_request",
        ),
        (
            "messages: image source not an object",
            MESSAGES,
            {"model": model, "max_tokens": 5, "messages": [image_block("x")]},  # type: ignore[arg-type]
            400,
            "invalid_request",
        ),
        (
            "messages: base64 source without data",
            MESSAGES,
            {"model": model, "max_tokens": 5, "messages": [image_block({"type": "base64"})]},
            400,
            "invalid_request",
        ),
        (
            "messages: a document block",
            MESSAGES,
            {
                "model": model,
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}],
            },
            400,
            "invalid_request",
        ),
        (
            "messages: no max_tokens",
            MESSAGES,
            {"model": model, "messages": [{"role": "user", "content": "hi"}]},
            400,
            "invalid_request",
        ),
        (
            # vLLM's validator calls .get() on it (an AttributeError pydantic does not wrap).
            "derender: structured_outputs not an object",
            CHAT_DERENDER,
            {
                **whole(model, [5, 6, 7]),
                "chat_request": {**chat_request(model), "structured_outputs": True},
            },
            400,
            "invalid_request",
        ),
        (
            "messages: unknown model",
            MESSAGES,
            {"model": "other", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
            404,
            "model_not_found",
        ),
    ]


async def test_bad_input_gets_typed_4xx_and_the_service_keeps_serving(app, settings):
    model = settings.model
    async with app_client(app) as c:
        wrong = []
        for name, path, body, status, type_ in bad_cases(model):
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            r = await c.post(path, content=content, headers={"content-type": "application/json"})
            err = r.json().get("error") or {}
            if (r.status_code, err.get("type")) != (status, type_):
                wrong.append((name, r.status_code, err.get("type"), r.text[:300]))
            assert "Traceback" not in r.text and len(err.get("message", "")) < 400, name
        assert wrong == []
        # Still serving, on every new route.
        r = await c.post(CHAT_DERENDER, json=whole(model, [5, 6, 7]))
        # deepseek_r1: an answer that never closes its reasoning is all reasoning.
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["reasoning"], r.text
        b64 = base64.b64encode(png_bytes(seed=6)).decode()
        source = {"type": "base64", "media_type": "image/png", "data": b64}
        r = await c.post(
            MESSAGES, json={"model": model, "max_tokens": 5, "messages": [image_block(source)]}
        )
        assert r.status_code == 200 and r.json()["features"]["mm_hashes"]["image"], r.text
        hashes = r.json()["features"]["mm_hashes"]
        part = {"type": "input_image", "image_url": data_url(png_bytes(seed=6))}
        r = await c.post(
            RESPONSES, json={"model": model, "input": [{"role": "user", "content": [part]}]}
        )
        assert r.status_code == 200, r.text
        # The same image through both routes: the same content hash.
        assert r.json()["features"]["mm_hashes"] == hashes


async def test_a_streamed_derender_carries_its_state(app, settings, renderer):
    # Two chunks through the route equal the whole answer's text: the state came back and
    # was taken up (a dropped state would restart detokenization and lose the first part).
    tokenizer = renderer.online.renderer.get_tokenizer()
    ids = tokenizer.encode("<think>hmm</think>the answer", add_special_tokens=False)
    model = settings.model
    async with app_client(app) as c:
        first = (await c.post(CHAT_DERENDER, json=chunk(model, ids[:3]))).json()
        second = await c.post(
            CHAT_DERENDER, json=chunk(model, ids[3:], stream_state=first["stream_state"])
        )
    deltas = [a["chunk"]["choices"][0]["delta"] for a in (first, second.json())]
    assert "".join(d.get("content") or "" for d in deltas) == "the answer"
    assert "".join(d.get("reasoning") or "" for d in deltas).endswith("hmm")
    assert second.json()["stream_state"]["output_token_ids"] == ids


@pytest.mark.parametrize("kind", ["chat_derender", "completion_derender", "responses", "messages"])
async def test_admission_applies_to_the_new_routes(settings, renderer, kind):
    """A body past a worker's byte budget is 413 before any of it is read: the route is
    behind the admission gate (``@admitted``), as chat and completion render are."""
    app = create_app(dataclasses.replace(settings, max_held_bytes=10_000), renderer=renderer)
    body = json.dumps({"model": settings.model, "padding": "x" * 20_000}).encode()
    reads = 0

    async def counted():
        nonlocal reads
        reads += 1
        yield body

    async with app_client(app) as c:
        r = await c.post(
            PATHS[kind],
            content=counted(),
            headers={"content-type": "application/json", "content-length": str(len(body))},
        )
    assert (r.status_code, r.json()["error"]["type"]) == (413, "payload_too_large")
    assert reads == 0


async def test_openapi_lists_every_route_with_upstreams_bodies(app):
    async with app_client(app) as c:
        doc = (await c.get("/openapi.json")).json()
    for path in PATHS.values():
        schema = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert schema, path
    derender = json.dumps(doc["paths"][CHAT_DERENDER]["post"]["requestBody"])
    assert "generate_chunk" in json.dumps(doc["components"]) and "$ref" in derender
