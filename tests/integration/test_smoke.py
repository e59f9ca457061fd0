"""`make check`'s end-to-end request: render, generate and the door as processes, one chat with
an image through the OpenAI SDK, answered with the tokens ``tandem_client``'s render ->
generate gives for the same chat (the door added nothing and lost nothing on the way)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tandem_client import TandemClient
from tools.servers import serving, tandem_front, tandem_generate, tandem_render
from tools.tiny_models import ensure_model

from ..support.images import data_url, png_bytes

pytestmark = [
    pytest.mark.integration,
    pytest.mark.vllm,
    pytest.mark.engine,
    pytest.mark.own_fleet,  # an engine of its own: run before the shared fleet exists
]

GREEDY = {"max_tokens": 8, "temperature": 0.0}


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[str, str, str, str]]:
    """The model folder and the URLs of render, generate and the door over them."""
    model = str(ensure_model("qwen2-vl"))
    render, generate = tandem_render(model), tandem_generate(model)
    door = tandem_front(model, render.url, generate.url)
    with serving([render, generate, door], timeout=300):
        yield model, render.url, generate.url, door.url


def test_an_image_chat_through_the_door_is_render_then_generate(stack) -> None:
    import openai

    model, render, generate, door = stack
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": data_url(png_bytes(seed=7))}},
                {"type": "text", "text": "What is in this image?"},
            ],
        }
    ]
    sdk = openai.OpenAI(base_url=f"{door}/v1", api_key="unused", timeout=120, max_retries=0)
    answer = sdk.chat.completions.create(
        model=model, messages=messages, extra_body={"return_token_ids": True}, **GREEDY
    )
    with TandemClient(render, generate, model=model) as client:
        request = client.render_chat(messages, **GREEDY)
        direct = client.generate(request)
    (choice,) = answer.choices
    assert choice.model_extra is not None
    assert choice.model_extra["token_ids"] == direct.choices[0].token_ids
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == len(request.token_ids)
    assert choice.message.content
