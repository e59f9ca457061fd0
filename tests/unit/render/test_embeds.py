"""image_embeds content parts on render: safetensors only, checked against the model before
vLLM sees them, placeholders expanded by vLLM's own processor, tensors carried unchanged."""

from __future__ import annotations

import io

import msgspec
import numpy as np
import pybase64
import pytest

from tandem_http import BadRequest, MmEmbedsDisabled, VllmBadRequest
from tandem_render.app import create_app
from tandem_render.embeds import EmbedsSpec, decode_embeds_part
from tandem_render.errors import InvalidEmbeds
from tandem_render.prepare import MEDIA_URL_PREFIX, ItemLimit, RequestLimits, prepare_chat
from tandem_render.settings import RenderSettings
from tandem_wire import (
    InvalidTensorData,
    MalformedBase64,
    PayloadTooLarge,
    WireFormat,
    decode_generate_request,
    decode_item,
    encode_safetensors,
)

from ...support.asgi import app_client
from ...support.embeds import BF16, embeds_chat, embeds_part, random_embeds
from ...support.images import data_url, png_bytes

IMAGE_PAD = 1022
MSGPACK = "application/vnd.msgpack"
SPEC = EmbedsSpec(
    values_key="image_embeds", grid_key="image_grid_thw", hidden_size=128, merge_size=2,
    max_rows=64,
)  # fmt: skip
LIMITS = RequestLimits(
    item_limits={"image": ItemLimit(2), "video": ItemLimit(1)},
    mm_kwargs_allowlist=frozenset(),
    max_kwargs_pixels=1_000_000,
    embeds_enabled=True,
    embeds={"image": SPEC},
)


def _b64(tensors: dict) -> str:
    return pybase64.b64encode(encode_safetensors(tensors)).decode()


def _decode(part: dict, spec: EmbedsSpec = SPEC) -> dict[str, np.ndarray]:
    return decode_embeds_part(part["image_embeds"], spec, "part")


# --------------------------------------------------------------------------- the part itself


@pytest.mark.parametrize("form", ["file", "dict"])
@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("dtype", [BF16, np.float16, np.float32])
def test_each_form_and_dtype_is_read_exactly(form, binary, dtype):
    values = random_embeds(16, dtype=dtype)
    out = _decode(embeds_part(values, [1, 8, 8], form=form, binary=binary))
    assert out["image_embeds"].dtype == values.dtype  # never cast here: generate knows its dtype
    assert out["image_embeds"].tobytes() == values.tobytes()
    assert out["image_grid_thw"].tolist() == [1, 8, 8]
    assert out["image_grid_thw"].dtype == np.int64


def test_grid_as_one_row_and_as_int32_is_normalised():
    values = random_embeds(4)
    out = _decode(embeds_part(values, np.array([[1, 4, 4]], np.int32)))
    assert out["image_grid_thw"].tolist() == [1, 4, 4]
    assert out["image_grid_thw"].dtype == np.int64


def _file_part(**tensors) -> dict:
    return {"type": "image_embeds", "image_embeds": _b64(tensors)}


GOOD_GRID = np.array([1, 4, 4])


@pytest.mark.parametrize(
    ("part", "error"),
    [
        (_file_part(image_embeds=random_embeds(4, hidden=64), image_grid_thw=GOOD_GRID),
         InvalidEmbeds),  # hidden size
        (_file_part(image_embeds=np.zeros((4, 128), np.int8), image_grid_thw=GOOD_GRID),
         InvalidEmbeds),  # not floats
        (_file_part(image_embeds=np.zeros((4, 128), np.float64), image_grid_thw=GOOD_GRID),
         InvalidEmbeds),  # float64: would be rounded twice on its way to the model's dtype
        (_file_part(image_embeds=random_embeds(5), image_grid_thw=GOOD_GRID),
         InvalidEmbeds),  # rows vs grid
        (_file_part(image_embeds=random_embeds(3), image_grid_thw=np.array([1, 3, 4])),
         InvalidEmbeds),  # h not a multiple of the merge size
        (_file_part(image_embeds=random_embeds(4), image_grid_thw=np.array([0, 4, 4])),
         InvalidEmbeds),
        (_file_part(image_embeds=random_embeds(4), image_grid_thw=np.array([1.0, 4, 4])),
         InvalidEmbeds),  # a float grid
        (_file_part(image_embeds=random_embeds(4), image_grid_thw=np.array([1, 4, 4, 1])),
         InvalidEmbeds),
        (_file_part(image_embeds=random_embeds(4)[None], image_grid_thw=GOOD_GRID),
         InvalidEmbeds),  # batched (1, rows, hidden)
        (_file_part(image_embeds=random_embeds(68), image_grid_thw=np.array([1, 4, 68])),
         InvalidEmbeds),  # more rows than the context
        (_file_part(image_embeds=random_embeds(0), image_grid_thw=GOOD_GRID), InvalidEmbeds),
        (_file_part(image_embeds=random_embeds(4)), InvalidEmbeds),  # no grid
        (_file_part(image_embeds=random_embeds(4), image_grid_thw=GOOD_GRID, x=GOOD_GRID),
         InvalidEmbeds),  # an extra tensor
        ({"type": "image_embeds", "image_embeds": {"image_embeds": _b64(
            {"a": random_embeds(4), "b": random_embeds(4)}), "image_grid_thw": [1, 4, 4]}},
         InvalidEmbeds),  # two tensors where one is due
        ({"type": "image_embeds", "image_embeds": {"image_embeds": _b64(
            {"a": random_embeds(4)}), "image_grid_thw": [1, 4, True]}}, InvalidEmbeds),
        ({"type": "image_embeds", "image_embeds": {"image_embeds": _b64(
            {"a": random_embeds(4)}), "image_grid_thw": [1, 4, 2**40]}}, InvalidEmbeds),
        ({"type": "image_embeds", "image_embeds": {"image_embeds": _b64(
            {"a": random_embeds(4)})}}, InvalidEmbeds),  # dict without the grid
        ({"type": "image_embeds", "image_embeds": {"image_embeds": [0.5] * 128,
            "image_grid_thw": [1, 2, 2]}}, InvalidEmbeds),  # embeddings as JSON numbers
        ({"type": "image_embeds", "image_embeds": None}, InvalidEmbeds),
        ({"type": "image_embeds", "image_embeds": 12}, InvalidEmbeds),
        ({"type": "image_embeds", "image_embeds": "@@not base64@@"}, MalformedBase64),
        ({"type": "image_embeds", "image_embeds": "AAAA"}, InvalidTensorData),
        ({"type": "image_embeds", "image_embeds": "A" * 200_000}, PayloadTooLarge),
    ],
)  # fmt: skip
def test_bad_parts_are_typed_errors(part, error):
    with pytest.raises(error):
        _decode(part)


def test_upstream_torch_save_payloads_are_refused_not_loaded():
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    torch.save(torch.zeros(4, 128), buf)  # what vLLM's own client helper (tensor2base64) sends
    part = {"type": "image_embeds", "image_embeds": pybase64.b64encode(buf.getvalue()).decode()}
    with pytest.raises(InvalidTensorData):
        _decode(part)


# --------------------------------------------------------------------------- request screening


def _chat(*parts):
    return {"messages": [{"role": "user", "content": list(parts)}]}


def test_parts_become_tokens_naming_checked_tensors():
    a, b = random_embeds(4, seed=1), random_embeds(16, seed=2)
    prepared = prepare_chat(
        _chat(embeds_part(a, [1, 4, 4]), {"type": "text", "text": "hi"},
              embeds_part(b, [1, 8, 8], form="dict")),
        LIMITS,
    )  # fmt: skip
    parts = prepared.body["messages"][0]["content"]
    assert parts[0]["type"] == parts[2]["type"] == "image_embeds"
    tensors = prepared.embed_tensors()
    for part, values in ((parts[0], a), (parts[2], b)):
        urls = part["image_embeds"]
        assert set(urls) == {"image_embeds", "image_grid_thw"}
        assert all(u.startswith(MEDIA_URL_PREFIX) for u in urls.values())
        assert tensors[urls["image_embeds"]].tobytes() == values.tobytes()
    assert len(tensors) == 4 and prepared.media == []


def test_disabled_unsupported_mixed_and_counted():
    part = embeds_part(random_embeds(4), [1, 4, 4])
    with pytest.raises(MmEmbedsDisabled):
        prepare_chat(_chat(part), RequestLimits({}, frozenset(), 1))
    with pytest.raises(BadRequest):  # enabled, but no spec: the model takes none
        prepare_chat(_chat(part), RequestLimits({}, frozenset(), 1, embeds_enabled=True))
    image = {"type": "image_url", "image_url": {"url": "data:x"}}
    with pytest.raises(BadRequest, match="mixed"):
        prepare_chat(_chat(part, image), LIMITS)
    with pytest.raises(VllmBadRequest, match="At most 2 image"):
        prepare_chat(_chat(part, part, part), LIMITS)
    with pytest.raises(BadRequest, match="uuid"):
        prepare_chat(_chat({**part, "uuid": "mine"}), LIMITS)


# --------------------------------------------------------------------------- the app, on vLLM


@pytest.fixture
def settings(qwen2_dir):
    return RenderSettings(
        model=qwen2_dir,
        max_images_per_prompt=4,
        max_body_bytes=4_000_000,
        pretouch_cache_memory=False,
        enable_mm_embeds=True,
    )


async def _post(client, body, *, binary=False):
    if binary:
        headers = {"content-type": MSGPACK, "accept": MSGPACK}
        return await client.post(
            "/v1/chat/completions/render", content=msgspec.msgpack.encode(body), headers=headers
        )
    return await client.post("/v1/chat/completions/render", json=body)


@pytest.mark.anyio
@pytest.mark.vllm
async def test_app_expands_placeholders_and_carries_the_tensors(settings, qwen2_renderer):
    model = settings.model
    values = random_embeds(16, seed=5)
    forms = [
        (embeds_part(values, [1, 8, 8]), False),
        (embeds_part(values, [1, 8, 8], form="dict"), False),
        (embeds_part(values, [[1, 8, 8]], binary=True), True),
    ]
    answers = []
    async with app_client(create_app(settings, renderer=qwen2_renderer)) as c:
        for part, binary in forms:
            r = await _post(c, embeds_chat(model, part, max_tokens=5), binary=binary)
            assert r.status_code == 200, r.text
            fmt = WireFormat.MSGPACK if binary else WireFormat.JSON
            answers.append(decode_generate_request(r.content, fmt))
    first = answers[0]
    (ph,) = first.features.mm_placeholders["image"]
    assert ph.length == 16 and ph.is_embed is None  # one token per row: 1 * 8 * 8 / 2**2
    assert first.token_ids[ph.offset : ph.offset + ph.length] == [IMAGE_PAD] * 16
    assert first.token_ids[ph.offset - 1] == 1019 and first.token_ids[ph.offset + 16] == 1020
    item = decode_item(first.features.kwargs_data["image"][0])
    assert set(item) == {"image_embeds", "image_grid_thw"}
    assert item["image_embeds"].data.tobytes() == values.tobytes()
    assert item["image_embeds"].data.dtype == BF16
    assert item["image_grid_thw"].data.tolist() == [1, 8, 8]
    for other in answers[1:]:  # same tensors in any form: same tokens, same content hash
        assert other.token_ids == first.token_ids
        assert other.features.mm_hashes == first.features.mm_hashes


@pytest.mark.anyio
@pytest.mark.vllm
async def test_app_refuses_bad_parts_with_typed_4xx_and_keeps_serving(
    settings, qwen2_renderer, qwen2_dir
):
    cases = [
        (_file_part(image_embeds=random_embeds(4, hidden=64), image_grid_thw=GOOD_GRID), 400,
         "invalid_mm_embeds"),
        (_file_part(image_embeds=random_embeds(5), image_grid_thw=GOOD_GRID), 400,
         "invalid_mm_embeds"),
        (_file_part(image_embeds=random_embeds(3), image_grid_thw=np.array([1, 3, 4])), 400,
         "invalid_mm_embeds"),
        ({"type": "image_embeds", "image_embeds": "AAAA"}, 400, "invalid_tensor_data"),
        ({"type": "image_embeds", "image_embeds": "@@"}, 400, "malformed_base64"),
        (_file_part(image_embeds=np.zeros((4, 128), np.float64), image_grid_thw=GOOD_GRID),
         400, "invalid_mm_embeds"),
    ]  # fmt: skip
    good = embeds_chat(qwen2_dir, embeds_part(random_embeds(4), [1, 4, 4]))
    async with app_client(create_app(settings, renderer=qwen2_renderer)) as c:
        for part, status, type_ in cases:
            r = await _post(c, embeds_chat(qwen2_dir, part))
            assert (r.status_code, r.json()["error"]["type"]) == (status, type_), r.text
        mixed = embeds_chat(qwen2_dir, embeds_part(random_embeds(4), [1, 4, 4]))
        mixed["messages"][0]["content"].append(
            {"type": "image_url", "image_url": {"url": data_url(png_bytes())}}
        )
        r = await _post(c, mixed)
        assert (r.status_code, r.json()["error"]["type"]) == (400, "invalid_request")
        assert (await _post(c, good)).status_code == 200


@pytest.mark.anyio
@pytest.mark.vllm
async def test_app_without_the_flag_refuses_embeddings(settings, qwen2_renderer, qwen2_dir):
    from dataclasses import replace

    off = replace(settings, enable_mm_embeds=False)
    body = embeds_chat(qwen2_dir, embeds_part(random_embeds(4), [1, 4, 4]))
    async with app_client(create_app(off, renderer=qwen2_renderer)) as c:
        r = await _post(c, body)
    assert (r.status_code, r.json()["error"]["type"]) == (400, "mm_embeds_disabled")


@pytest.mark.vllm
def test_vllm_embedding_fetches_serve_only_checked_tensors():
    # Defence in depth: whatever string reaches vLLM's embedding fetch (upstream: base64 ->
    # torch.load), only tensors this request's parts were checked into come back.
    from tandem_render.errors import MediaSchemeNotAllowed
    from tandem_render.media_connector import PrefetchedMediaConnector
    from tandem_render.render_call import RenderCall, bound

    connector = object.__new__(PrefetchedMediaConnector)  # the fetches use no instance state
    values = random_embeds(4)
    token = f"{MEDIA_URL_PREFIX}0/image_embeds"
    upstream = pybase64.b64encode(encode_safetensors({"image_embeds": values})).decode()
    for fetch in (connector.fetch_image_embedding, connector.fetch_audio_embedding):
        with pytest.raises(MediaSchemeNotAllowed):
            fetch(token)  # outside a render call
    with bound(RenderCall(embeds={token: values})):
        got = connector.fetch_image_embedding(token)
        assert got.float().numpy().tobytes() == (values.astype(np.float32).tobytes())
        for fetch in (connector.fetch_image_embedding, connector.fetch_video_embedding):
            with pytest.raises(MediaSchemeNotAllowed):
                fetch(upstream)
