"""Precomputed image embeddings through render -> generate, on the session's real CPU engine.

Parity is with vLLM's own path: the same tensors handed to the engine as LLM.generate hands
them (``parse_model_prompt`` -> the engine's renderer -> ``generate``), and with the image
itself: the tiny model's own vision tower (transformers, on the CPU) turned into embeddings
must give the tokens the image gives. Every bad item is a typed 4xx and the engine keeps
serving.
"""

from __future__ import annotations

import copy
import io

import msgspec
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from tandem_render.media import MediaLoader
from tandem_render.metrics import RenderMetrics
from tandem_render.service import RenderService
from tandem_render.settings import RenderSettings
from tandem_wire import (
    BatchedLayout,
    FieldElem,
    FlatLayout,
    GenerateRequest,
    WireFormat,
    decode_item,
    encode_item,
)

from ...support.asgi import app_client
from ...support.embeds import BF16, embeds_chat, embeds_part, random_embeds
from ...support.images import png_bytes
from .helpers import generate_app, post, render, tokens

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.engine]

TEXT = "Describe."
N = 10


async def render_embeds(renderer, model: str, values: np.ndarray, grid, **sampling):
    """Our render service's answer (in-process) for a chat with one image_embeds part."""
    rs = RenderSettings(model=model, max_images_per_prompt=8, enable_mm_embeds=True)
    service = RenderService(
        rs, renderer, MediaLoader(rs.media_policy()), RenderMetrics.create(CollectorRegistry())
    )
    body = embeds_chat(model, embeds_part(values, grid), text=TEXT, **sampling)
    return await service.render_chat(msgspec.json.encode(body), WireFormat.JSON)


async def vllm_own_tokens(engine, model_dir: str, values: np.ndarray, grid) -> tuple[list, list]:
    """(prompt ids, greedy tokens) of vLLM's own embedding path on the same engine: the steps
    LLM.generate takes (vllm/entrypoints/common/offline.py ``_preprocess_cmpl``)."""
    import torch
    from transformers import AutoTokenizer
    from vllm import SamplingParams
    from vllm.renderers.inputs.preprocess import parse_model_prompt

    from tandem_vllm.items import numpy_to_tensor

    tok = AutoTokenizer.from_pretrained(model_dir)
    content = [{"type": "image"}, {"type": "text", "text": TEXT}]
    text = tok.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    mm = {
        "image_embeds": numpy_to_tensor(np.array(values)),
        "image_grid_thw": torch.tensor([grid], dtype=torch.int64),
    }
    llm = engine.llm
    prompt = {"prompt": text, "multi_modal_data": {"image": mm}}
    parsed = parse_model_prompt(llm.model_config, prompt)
    (engine_input,) = llm.renderer.render_cmpl([parsed], llm.renderer.default_cmpl_tok_params)
    params = SamplingParams(temperature=0.0, max_tokens=N)
    final = None
    async for out in llm.generate(engine_input, params, f"vllm-own-{id(values)}"):
        final = out
    assert final is not None
    return list(final.prompt_token_ids), list(final.outputs[0].token_ids)


@pytest.fixture
def app(qwen2_engine, qwen2_dir):
    return generate_app(qwen2_engine, qwen2_dir)


@pytest.mark.parametrize("dtype", [BF16, np.float32], ids=["bf16", "f32"])
async def test_tokens_equal_vllm_own_embedding_path(
    app, qwen2_engine, qwen2_renderer, qwen2_dir, dtype
):
    # f32 values that bf16 cannot hold: generate's cast must be the one the model makes.
    values = random_embeds(64, seed=3, dtype=np.float32).astype(dtype)
    if dtype == np.float32:
        values = values + np.float32(1e-4)
    grid = [1, 16, 16]
    req = await render_embeds(
        qwen2_renderer, qwen2_dir, values, grid, temperature=0.0, max_tokens=N
    )
    own_prompt, own_tokens = await vllm_own_tokens(qwen2_engine, qwen2_dir, values, grid)
    assert req.token_ids == own_prompt  # same template and placeholder expansion
    async with app_client(app) as c:
        ours = tokens(await post(c, req, binary=True))
        assert ours == own_tokens and len(ours) == N
        # And the embeddings matter: others give other tokens.
        other = await render_embeds(
            qwen2_renderer, qwen2_dir, random_embeds(64, seed=4), grid, temperature=0.0,
            max_tokens=N,
        )  # fmt: skip
        assert tokens(await post(c, other)) != ours


def vision_tower_embeds(model_dir: str, image: bytes) -> tuple[np.ndarray, list[int]]:
    """What the tiny model's own vision tower (transformers, CPU, bf16) makes of the image."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from tandem_vllm.items import tensor_to_numpy

    processor = AutoProcessor.from_pretrained(model_dir)
    inputs = processor.image_processor(
        images=[Image.open(io.BytesIO(image)).convert("RGB")], return_tensors="pt"
    )
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.bfloat16)
    with torch.no_grad():
        out = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
    (embeds,) = out.pooler_output
    return tensor_to_numpy(embeds), inputs["image_grid_thw"][0].tolist()


async def test_vision_tower_embeddings_give_the_image_tokens(app, qwen2_renderer, qwen2_dir):
    image = png_bytes(seed=41)
    values, grid = vision_tower_embeds(qwen2_dir, image)
    assert values.shape == (64, 128) and values.dtype == BF16 and grid == [1, 16, 16]
    as_image = await render(qwen2_renderer, qwen2_dir, [41], temperature=0.0, max_tokens=N)
    as_embeds = await render_embeds(
        qwen2_renderer, qwen2_dir, values, grid, temperature=0.0, max_tokens=N
    )
    assert as_embeds.token_ids == as_image.token_ids
    async with app_client(app) as c:
        assert tokens(await post(c, as_embeds, binary=True)) == tokens(
            await post(c, as_image, binary=True)
        )


# --------------------------------------------------------------------------- hostile items


def _item(values: np.ndarray, grid, **extra) -> bytes:
    item = {
        "image_embeds": FieldElem(values, FlatLayout(slices=(slice(0, len(values)),))),
        "image_grid_thw": FieldElem(np.asarray(grid, np.int64), BatchedLayout(keep_on_cpu=True)),
        **extra,
    }
    return encode_item(item)


def _with_item(req: GenerateRequest, data: bytes, length: int | None = None) -> GenerateRequest:
    feats = req.features
    changes: dict = {"kwargs_data": {"image": [data]}, "mm_metadata": None}
    token_ids = req.token_ids
    if length is not None:  # a prompt with `length` placeholders where the rendered one was
        (ph,) = feats.mm_placeholders["image"]
        pad = token_ids[ph.offset]
        token_ids = [*token_ids[: ph.offset], *[pad] * length, *token_ids[ph.offset + ph.length :]]
        changes["mm_placeholders"] = {"image": [msgspec.structs.replace(ph, length=length)]}
    return msgspec.structs.replace(
        req, token_ids=token_ids, features=msgspec.structs.replace(feats, **changes)
    )


async def test_bad_embedding_items_are_typed_4xx_and_the_engine_keeps_serving(
    app, qwen2_renderer, qwen2_dir
):
    values = random_embeds(16, seed=7)
    req = await render_embeds(qwen2_renderer, qwen2_dir, values, [1, 8, 8], max_tokens=4)
    pixels = decode_item(
        (await render(qwen2_renderer, qwen2_dir, [1])).features.kwargs_data["image"][0]
    )["pixel_values"]
    cases = [
        ("hidden size", _with_item(req, _item(random_embeds(16, hidden=64), [1, 8, 8])),
         "invalid_mm_item"),
        ("rows vs grid", _with_item(req, _item(random_embeds(15), [1, 8, 8])),
         "invalid_mm_item"),
        ("integer embeddings", _with_item(req, _item(np.zeros((16, 128), np.int8), [1, 8, 8])),
         "invalid_mm_item"),
        ("float64", _with_item(req, _item(np.zeros((16, 128), np.float64), [1, 8, 8])),
         "invalid_mm_item"),
        # 5 x 12 patches: 15 rows and 15 tokens agree, but no 2 x 2 merge tiles the grid.
        ("grid the merge cannot divide", _with_item(req, _item(random_embeds(15), [1, 5, 12]), 15),
         "invalid_mm_item"),
        ("grid of two rows", _with_item(req, _item(values, [[1, 8, 8], [1, 8, 8]])),
         "invalid_mm_item"),
        ("pixels and embeddings", _with_item(req, _item(values, [1, 8, 8], pixel_values=pixels)),
         "invalid_mm_item"),
        ("placeholders vs rows", _with_item(req, _item(values, [1, 8, 8]), 12),
         "invalid_placeholders"),
    ]  # fmt: skip
    # The same grid on a pixel item took the engine down before the merge check (the vision
    # tower cannot tile 5 x 12 patches 2 x 2): one request killed the node.
    image = await render(qwen2_renderer, qwen2_dir, [1], max_tokens=4)
    bad_pixels = encode_item(
        {
            "pixel_values": FieldElem(np.zeros((60, 1176), np.uint8), FlatLayout((slice(0, 60),))),
            "image_grid_thw": FieldElem(np.array([1, 5, 12]), BatchedLayout(keep_on_cpu=True)),
        }
    )
    cases.append(("pixel grid the merge cannot divide", _with_item(image, bad_pixels, 15),
                  "invalid_mm_item"))  # fmt: skip
    async with app_client(app) as c:
        for name, bad, type_ in cases:
            answer = await post(c, bad, expect=400)
            assert answer["error"]["type"] == type_, name
        good = await post(c, req, binary=True)
        assert len(tokens(good)) == 4
        assert len(tokens(await post(c, image, binary=True))) == 4


async def test_embedding_items_need_the_engine_flag(qwen2_engine, qwen2_renderer, qwen2_dir):
    # The service reads vLLM's enable_mm_embeds once, from the engine it was started with.
    off = copy.copy(qwen2_engine)
    off.accepts_mm_embeds = False
    req = await render_embeds(qwen2_renderer, qwen2_dir, random_embeds(16), [1, 8, 8])
    async with app_client(generate_app(off, qwen2_dir)) as c:
        answer = await post(c, req, expect=400)
        assert answer["error"]["type"] == "mm_embeds_disabled"
        image = await render(qwen2_renderer, qwen2_dir, [2], max_tokens=2)
        assert len(tokens(await post(c, image))) == 2  # pixels still served
    assert qwen2_engine.accepts_mm_embeds  # the session engine is started with the flag


async def test_f32_items_are_cast_once_to_the_model_dtype(app, qwen2_renderer, qwen2_dir):
    # bf16 values sent as f32 (exact) give the very tokens of the bf16 item.
    values = random_embeds(16, seed=9)
    req = await render_embeds(
        qwen2_renderer, qwen2_dir, values, [1, 8, 8], temperature=0.0, max_tokens=6
    )
    wide = _with_item(req, _item(values.astype(np.float32), [1, 8, 8]))
    async with app_client(app) as c:
        assert tokens(await post(c, wide)) == tokens(await post(c, req, binary=True))


async def test_client_chat_sends_embeddings_once(qwen2_engine, qwen2_renderer, qwen2_dir):
    """tandem_client passes an image_embeds part through as bytes (msgpack), and the item
    reaches the generate node once: the second chat sends a null the node resolves."""
    from contextlib import AsyncExitStack

    import httpx

    from tandem_client import AsyncTandemClient
    from tandem_render.app import create_app as create_render_app
    from tandem_wire import encode_safetensors

    from .test_client_e2e import GENERATE, Router

    values = random_embeds(16, seed=11)
    blob = encode_safetensors({"image_embeds": values, "image_grid_thw": np.array([1, 8, 8])})
    part = {"type": "image_embeds", "image_embeds": blob}
    messages = [{"role": "user", "content": [part, {"type": "text", "text": TEXT}]}]
    settings = RenderSettings(model=qwen2_dir, max_images_per_prompt=8, enable_mm_embeds=True)
    router = Router()
    async with AsyncExitStack() as exits:
        for host, app in (
            ("render", create_render_app(settings, qwen2_renderer)),
            ("generate", generate_app(qwen2_engine, qwen2_dir)),
        ):
            await exits.enter_async_context(app.router.lifespan_context(app))
            router.transports[host] = httpx.ASGITransport(app=app)
        client = AsyncTandemClient(
            "http://render", "http://generate", model=qwen2_dir, transport=router
        )
        exits.push_async_callback(client.aclose)
        first = await client.chat(messages, temperature=0.0, max_tokens=6)
        again = await client.chat(messages, temperature=0.0, max_tokens=6)
    assert again.choices[0].token_ids == first.choices[0].token_ids
    full, held = router.sent_to(GENERATE)
    assert (full.status, held.status) == (200, 200)
    (item,) = full.kwargs_data()["image"]
    assert item is not None
    assert decode_item(item)["image_embeds"].data.tobytes() == values.tobytes()
    assert held.kwargs_data() == {"image": [None]}
