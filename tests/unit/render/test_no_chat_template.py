"""A model without a chat template (Whisper's, a base model's): a chat is vllm serve's typed 400,
never a 500, and the model's completions still render."""

from __future__ import annotations

import json
import shutil

import pytest

from tandem_render.app import create_app
from tandem_render.settings import RenderSettings
from tandem_render.vllm_renderer import EngineRenderer

from ...support.asgi import app_client

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]


@pytest.fixture(scope="module")
def untemplated_dir(qwen2_dir, tmp_path_factory):
    """The tiny Qwen2-VL with its chat template taken out (vLLM has no fallback for it)."""
    out = tmp_path_factory.mktemp("untemplated") / "model"
    shutil.copytree(qwen2_dir, out)
    (out / "chat_template.jinja").unlink()
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config), encoding="utf-8")
    return str(out)


async def test_a_chat_is_refused_as_vllm_serve_refuses_it_and_completions_render(untemplated_dir):
    settings = RenderSettings(model=untemplated_dir, pretouch_cache_memory=False)
    app = create_app(settings, EngineRenderer(settings))
    chat = {"model": untemplated_dir, "messages": [{"role": "user", "content": "hi"}]}
    async with app_client(app) as c:
        refused = await c.post("/v1/chat/completions/render", json=chat)
        served = await c.post(
            "/v1/completions/render", json={"model": untemplated_dir, "prompt": "hi"}
        )
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["type"] == "BadRequestError" and "chat template" in error["message"]
    assert served.status_code == 200 and served.json()[0]["token_ids"], served.text
