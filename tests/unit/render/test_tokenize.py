"""Render's tokenizer and server-info routes in-process (real vLLM processor): ``/tokenize``
counts what the chat route renders, images included; ``/detokenize`` is the tokenizer's own
decode; bad input is a typed 4xx and the service keeps serving."""

from __future__ import annotations

import pytest

from tandem_render.app import create_app
from tandem_render.settings import RenderSettings

from ...support.asgi import app_client
from ...support.images import chat_body, data_url, png_bytes

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]


@pytest.fixture
def app(qwen2_dir, qwen2_renderer):
    return create_app(RenderSettings(model=qwen2_dir, max_images_per_prompt=4), qwen2_renderer)


async def test_a_chat_with_an_image_counts_the_tokens_the_chat_route_renders(app, qwen2_dir):
    body = chat_body(qwen2_dir, [data_url(png_bytes(64, 64, seed=3))])
    async with app_client(app) as c:
        rendered = (await c.post("/v1/chat/completions/render", json=body)).json()
        tokenized = await c.post("/tokenize", json={**body, "return_token_strs": True})
    assert tokenized.status_code == 200, tokenized.text
    answer = tokenized.json()
    assert answer["tokens"] == rendered["token_ids"]
    assert answer["count"] == len(rendered["token_ids"])
    assert len(answer["token_strs"]) == answer["count"]
    assert answer["max_model_len"] > answer["count"]


async def test_a_prompt_is_the_tokenizers_own_encoding(app, qwen2_dir, qwen2_renderer):
    tokenizer = qwen2_renderer.online.renderer.get_tokenizer()
    async with app_client(app) as c:
        r = await c.post("/tokenize", json={"model": qwen2_dir, "prompt": "Hello there, world."})
        ids = r.json()["tokens"]
        back = await c.post("/detokenize", json={"model": qwen2_dir, "tokens": ids})
    assert ids == tokenizer.encode("Hello there, world.")
    assert back.json() == {"prompt": "Hello there, world."}


@pytest.mark.parametrize(
    ("path", "body", "status", "kind"),
    [
        ("/detokenize", {"tokens": [10**6]}, 400, "token_out_of_vocabulary"),
        ("/detokenize", {"tokens": "abc"}, 400, "invalid_request"),
        ("/tokenize", {"prompt": 5}, 400, "invalid_request"),
        ("/tokenize", [1, 2], 400, "invalid_request"),
        ("/tokenize", {"model": "other", "prompt": "hi"}, 404, "model_not_found"),
        (
            "/tokenize",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}
                        ],
                    }
                ]
            },
            400,
            None,
        ),
    ],
)
async def test_bad_input_is_a_typed_error_and_render_serves_on(
    app, qwen2_dir, path, body, status, kind
):
    async with app_client(app) as c:
        r = await c.post(path, json=body)
        assert r.status_code == status, r.text
        if kind is not None:
            assert r.json()["error"]["type"] == kind
        ok = await c.post("/tokenize", json={"model": qwen2_dir, "prompt": "still here"})
    assert ok.status_code == 200


async def test_version_ping_and_load(app):
    from vllm.version import __version__

    async with app_client(app) as c:
        version = await c.get("/version")
        pings = [await c.get("/ping"), await c.post("/ping")]
        load = await c.get("/load")
    assert version.json() == {"version": __version__}
    assert [p.status_code for p in pings] == [200, 200]
    assert load.json() == {"server_load": 0}  # this request is not admitted: nothing held
