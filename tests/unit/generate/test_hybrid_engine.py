"""A hybrid model (LFM2-VL: short-conv + attention layers) on vLLM's CPU engine.

With prefix caching on, vLLM caches such a model's conv state block by block ("align" mode),
which needs chunked prefill: the engine keeps it on, where it turns it off for every other
model. A split prefill is what used to kill the CPU engine on a seeded request (vLLM's offset
rewind of a CPU generator); its workers now rewind by state, so seeds give the tokens an unsplit
prefill gives. And its image items (``spatial_shapes`` laid out flat, kept on the CPU) pass
render's metadata check.
"""

from __future__ import annotations

from dataclasses import replace

import msgspec
import pytest

from tandem_wire import (
    BatchedLayout,
    FieldElem,
    FlatLayout,
    GenerateRequest,
    decode_item,
    encode_item,
)

from ...support.asgi import app_client
from ...support.images import data_url, png_bytes
from .helpers import cpu_engine, generate_app, post, render_body, tokens

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.engine]

CHUNK = 256
"""The engine's token budget per step: the prompts below take several steps to prefill."""

LONG = [10 + (7 * i) % 800 for i in range(3 * CHUNK + 50)]
"""A text prompt three chunks and a bit long (tiny LFM2-VL token ids)."""


@pytest.fixture(scope="module")
def lfm2_dir():
    from tools.tiny_models import ensure_model

    return str(ensure_model("lfm2-vl"))


@pytest.fixture(scope="module")
def lfm2_renderer(lfm2_dir):
    from tandem_render.settings import RenderSettings
    from tandem_render.vllm_renderer import EngineRenderer

    return EngineRenderer(RenderSettings(model=lfm2_dir, max_images_per_prompt=4))


@pytest.fixture(scope="module")
async def lfm2_engine(lfm2_dir, anyio_backend):
    """The session's one LFM2-VL engine (only this module starts it; stopped after it)."""
    engine = cpu_engine(lfm2_dir, max_num_batched_tokens=CHUNK)
    yield engine
    engine.shutdown()


def seeded(salt: str, seed: int = 7) -> GenerateRequest:
    return GenerateRequest(
        token_ids=LONG,
        sampling_params={"seed": seed, "temperature": 1.0, "max_tokens": 8},
        cache_salt=salt,
    )


@pytest.mark.parametrize(("caching", "chunked"), [(None, None), (True, None), (False, False)])
def test_prefills_are_whole_on_cpu_unless_the_model_needs_them_split(lfm2_dir, caching, chunked):
    """vLLM's rule: with prefix caching on (its default), a hybrid model needs chunked
    prefill; without it, the model takes whole prefills like any other."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    from tandem_generate.engine import seed_safe_engine_args

    args = AsyncEngineArgs(model=lfm2_dir, max_model_len=4096, enable_prefix_caching=caching)
    assert seed_safe_engine_args(args).enable_chunked_prefill is chunked


def test_other_models_still_take_whole_prefills(qwen2_dir):
    from vllm.engine.arg_utils import AsyncEngineArgs

    from tandem_generate.engine import seed_safe_engine_args

    args = seed_safe_engine_args(AsyncEngineArgs(model=qwen2_dir, max_model_len=4096))
    assert args.enable_chunked_prefill is False
    assert args.max_num_batched_tokens >= 4096


def test_the_hybrid_model_keeps_chunked_prefill_and_takes_seeds(lfm2_engine):
    config = lfm2_engine.vllm_config
    assert config.scheduler_config.enable_chunked_prefill
    assert config.scheduler_config.max_num_batched_tokens == CHUNK
    assert config.cache_config.mamba_cache_mode == "align"
    assert config.parallel_config.worker_cls == "tandem_generate.vllm_worker.SeedSafeCPUWorker"
    assert lfm2_engine.seeded_sampling_safe


async def test_a_seeded_prompt_split_across_steps_gives_the_same_tokens(lfm2_engine, lfm2_dir):
    """Each salt prefills the prompt afresh in four steps (the first three's draws thrown
    away); the repeat of salt "a" hits its prefix cache and prefills the tail alone. All three
    sample the same tokens only if the thrown-away draws left the seed's stream untouched."""
    async with app_client(generate_app(lfm2_engine, lfm2_dir)) as c:
        first = tokens(await post(c, seeded("a")))
        other = tokens(await post(c, seeded("b")))
        cached = tokens(await post(c, seeded("a")))
        another_seed = tokens(await post(c, seeded("c", seed=8)))
        plain = await post(c, GenerateRequest(token_ids=LONG[:20], sampling_params={}))
    assert len(first) == 8
    assert first == other == cached
    assert another_seed != first
    assert tokens(plain)
    assert not lfm2_engine.errored


def image_chat(model: str, sizes: list[tuple[int, int]]) -> dict:
    parts = [
        {"type": "image_url", "image_url": {"url": data_url(png_bytes(w, h, seed=i))}}
        for i, (w, h) in enumerate(sizes)
    ]
    text = {"type": "text", "text": "Describe."}
    return {
        "model": model,
        "messages": [{"role": "user", "content": [*parts, text]}],
        "max_tokens": 4,
        "temperature": 0.0,
    }


@pytest.mark.parametrize("sizes", [[(448, 448)], [(448, 448), (320, 240)]])
async def test_render_answers_for_images_are_served(lfm2_engine, lfm2_renderer, lfm2_dir, sizes):
    """Render's features, its metadata included (each item's ``spatial_shapes``, flat with
    the slices of the batch it was cut from), are taken as they come, JSON and binary."""
    rendered = await render_body(lfm2_renderer, lfm2_dir, image_chat(lfm2_dir, sizes))
    assert rendered.features is not None and rendered.features.mm_metadata is not None
    async with app_client(generate_app(lfm2_engine, lfm2_dir)) as c:
        answer = await post(c, rendered)
        binary = await post(c, rendered, binary=True)
    assert len(tokens(answer)) == 4
    assert tokens(binary) == tokens(answer)


async def test_metadata_that_disagrees_with_its_item_is_refused(
    lfm2_engine, lfm2_renderer, lfm2_dir
):
    rendered = await render_body(lfm2_renderer, lfm2_dir, image_chat(lfm2_dir, [(320, 240)]))
    feats = rendered.features
    (meta,) = feats.mm_metadata["image"]
    fields = decode_item(meta)
    shapes = fields["spatial_shapes"]
    assert isinstance(shapes.layout, FlatLayout) and shapes.layout.keep_on_cpu
    flat = shapes.layout
    wrong = {
        "grid": FieldElem(shapes.data[:, ::-1].copy(), flat),
        "batched": FieldElem(shapes.data, BatchedLayout(keep_on_cpu=True)),
        "on the device": FieldElem(shapes.data, replace(flat, keep_on_cpu=False)),
        "another dim": FieldElem(shapes.data, replace(flat, dim=1)),
    }
    async with app_client(generate_app(lfm2_engine, lfm2_dir)) as c:
        for name, elem in wrong.items():
            metadata = {"image": [encode_item({**fields, "spatial_shapes": elem})]}
            bad = msgspec.structs.replace(feats, mm_metadata=metadata)
            req = msgspec.structs.replace(rendered, features=bad)
            err = await post(c, req, expect=400)
            assert err["error"]["type"] == "invalid_mm_item", name
            assert err["error"]["param"] == "features.mm_metadata.image[0]", name
        assert len(tokens(await post(c, rendered))) == 4
