"""Greedy tokens from render -> generate equal transformers' own processor + generate."""

from __future__ import annotations

import io

import pytest

from ...support.asgi import app_client
from ...support.images import png_bytes
from .helpers import generate_app, post, render, tokens

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.engine]


def transformers_greedy(model_dir: str, image_bytes: bytes, n: int) -> tuple[list[int], list[int]]:
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    image = Image.open(io.BytesIO(image_bytes)).convert("RGB")
    processor = AutoProcessor.from_pretrained(model_dir)
    content = [{"type": "image", "image": image}, {"type": "text", "text": "Describe."}]
    inputs = processor.apply_chat_template(
        [{"role": "user", "content": content}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
    )
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.bfloat16)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=n, do_sample=False)
    prompt = inputs["input_ids"][0].tolist()
    return prompt, out[0, len(prompt) :].tolist()


async def test_qwen2_vl_greedy_tokens_equal_transformers(qwen2_engine, qwen2_renderer, qwen2_dir):
    image = png_bytes(seed=31)
    hf_prompt, hf_tokens = transformers_greedy(qwen2_dir, image, 10)
    req = await render(qwen2_renderer, qwen2_dir, [31], temperature=0.0, max_tokens=10)
    assert req.token_ids == hf_prompt  # same template, tokenizer and placeholder expansion
    async with app_client(generate_app(qwen2_engine, qwen2_dir)) as c:
        assert tokens(await post(c, req, binary=True)) == hf_tokens
