"""``--render inline``: render's own app inside the door (real vLLM processor, tiny model),
generate standing in; what generate receives is what the render service would have sent."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
import pytest

from tandem_front.__main__ import parse_args
from tandem_front.app import create_app
from tandem_front.inline_render import INLINE_RENDER_URL, inline_render_settings
from tandem_render.app import create_app as create_render_app
from tandem_render.settings import RenderSettings
from tandem_wire import MSGPACK_CONTENT_TYPE, WIRE_TRANSFORMS_HEADER
from tests.support.asgi import app_client
from tests.support.images import chat_body, data_url, png_bytes

from .test_front_proxy_failures import Texts
from .test_front_routing import settings

pytestmark = pytest.mark.anyio


class Generate(httpx.AsyncBaseTransport):
    """A generate node that records each request and answers one token."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":  # health and weight polls: not part of these tests
            return httpx.Response(404)
        gen = msgspec.msgpack.decode(await request.aread())
        self.received.append(gen)
        choice = {"index": 0, "token_ids": [5], "finish_reason": "length"}
        return httpx.Response(200, json={"request_id": gen["request_id"], "choices": [choice]})


def _door(model: str, render_args: str = "") -> tuple[Any, Generate]:
    base = settings(render_urls=(INLINE_RENDER_URL,), generate_urls=("http://g1",), model=model)
    door = settings(
        render_urls=(INLINE_RENDER_URL,),
        generate_urls=("http://g1",),
        model=model,
        inline_render=inline_render_settings(base, render_args),
    )
    generate = Generate()
    return create_app(door, Texts(), generate), generate


async def test_generate_gets_what_the_render_service_renders(qwen2_dir):
    body = chat_body(qwen2_dir, [data_url(png_bytes(64, 64, seed=7))], max_tokens=3)
    door, generate = _door(qwen2_dir)
    async with app_client(door) as c:
        r = await c.post("/v1/chat/completions", json=body)
        # Render's own routes are the door's too, answered by the render app inside it.
        rendered_by_door = await c.post("/v1/chat/completions/render", json=body)
    assert r.status_code == 200, r.text
    async with app_client(create_render_app(RenderSettings(model=qwen2_dir))) as render:
        # As the door asks the render service: the model's wire transforms, for generate.
        answer = await render.post(
            "/v1/chat/completions/render",
            json=body,
            headers={"accept": MSGPACK_CONTENT_TYPE, WIRE_TRANSFORMS_HEADER: "*"},
        )
    rendered = msgspec.msgpack.decode(answer.content)
    (sent,) = generate.received
    assert sent["token_ids"] == rendered["token_ids"]
    assert sent["features"]["mm_hashes"] == rendered["features"]["mm_hashes"]
    assert sent["features"]["kwargs_data"] == rendered["features"]["kwargs_data"]
    assert sent["sampling_params"]["max_tokens"] == 3
    assert rendered_by_door.json()["token_ids"] == rendered["token_ids"]


async def test_renders_refusals_are_typed_and_the_door_serves_on(qwen2_dir):
    images = [data_url(png_bytes(32, 32, seed=s)) for s in range(3)]
    door, generate = _door(qwen2_dir, "--max-images-per-prompt 2")
    async with app_client(door) as c:
        refused = await c.post("/v1/chat/completions", json=chat_body(qwen2_dir, images))
        served = await c.post("/v1/chat/completions", json=chat_body(qwen2_dir, images[:2]))
    error = refused.json()["error"]
    assert refused.status_code == 400 and (error["type"], error["param"]) == (
        "BadRequestError",
        "image",
    )
    assert served.status_code == 200 and len(generate.received) == 1


def test_the_command_line_asks_for_it_with_renders_own_options(qwen2_dir):
    s = parse_args(
        [
            *("--model", qwen2_dir, "--generate", "http://g1", "--render", "inline"),
            *("--render-args", "--max-images-per-prompt 3 --api-key ignored"),
            *("--served-model-name", "tiny", "--reasoning-parser", "qwen3"),
        ]
    )
    assert s.render_urls == (INLINE_RENDER_URL,)
    render = RenderSettings.from_json(s.inline_render or "")
    assert render.max_images_per_prompt == 3
    # The model and its parsing are the door's; nothing but the door reaches it: no key.
    assert (render.model, render.served_model_name) == (qwen2_dir, ("tiny",))
    assert render.reasoning_parser == "qwen3" and render.api_key is None


def test_render_args_without_inline_are_refused(qwen2_dir, capsys):
    with pytest.raises(SystemExit):
        parse_args(
            [
                *("--model", qwen2_dir, "--generate", "http://g1", "--render", "http://r1"),
                *("--render-args", "--max-images-per-prompt 3"),
            ]
        )
    assert "--render-args is for --render inline" in capsys.readouterr().err
