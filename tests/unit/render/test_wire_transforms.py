"""Render's wire transforms: applied only to binary answers that ask for them, exact, and never
in upstream's JSON (the real Qwen2-VL processor, in-process)."""

from __future__ import annotations

import msgspec
import pytest

from tandem_render.app import create_app
from tandem_render.settings import RenderSettings
from tandem_vllm.wire_transforms import PatchRowDelta, TemporalDedup
from tandem_wire import (
    BODY_CODING_HEADER,
    WIRE_TRANSFORMS_HEADER,
    WireFormat,
    content_id,
    decode_generate_request,
    decode_generate_requests,
    decode_item,
)

from ...support.asgi import app_client
from ...support.images import chat_body, data_url, png_bytes

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]

MSGPACK = "application/vnd.msgpack"
DEDUP = TemporalDedup.name
DELTA = PatchRowDelta.name


@pytest.fixture
def app(qwen2_dir, qwen2_renderer):
    settings = RenderSettings(model=qwen2_dir, max_images_per_prompt=4, pretouch_cache_memory=False)
    return create_app(settings, renderer=qwen2_renderer)


def body(model, seed=0, **extra):
    return chat_body(model, [data_url(png_bytes(448, 448, seed=seed))], request_id="r1", **extra)


async def post(c, doc, *, binary, transforms=None, path="/v1/chat/completions/render", zstd=False):
    headers = {"accept": MSGPACK} if binary else {}
    if transforms is not None:
        headers[WIRE_TRANSFORMS_HEADER] = transforms
    if zstd:
        headers[BODY_CODING_HEADER] = "zstd"
    r = await c.post(path, json=doc, headers=headers)
    assert r.status_code == 200, r.text
    return r.content


def items(raw, binary, path="chat"):
    fmt = WireFormat.MSGPACK if binary else WireFormat.JSON
    reqs = decode_generate_requests(raw, fmt) if path == "completion" else None
    req = reqs[0] if reqs else decode_generate_request(raw, fmt)
    return [bytes(e) for e in req.features.kwargs_data["image"]]


async def test_binary_answers_elide_exactly_when_asked(app, qwen2_dir, qwen2_renderer):
    async with app_client(app) as c:
        plain = await post(c, body(qwen2_dir), binary=True)
        elided = await post(c, body(qwen2_dir), binary=True, transforms="*")
        named = await post(c, body(qwen2_dir), binary=True, transforms=f"x/v1, {DEDUP}")
        other = await post(c, body(qwen2_dir), binary=True, transforms="x/v1")
    (full,) = items(plain, True)
    (half,) = items(elided, True)
    assert items(named, True) == [half] and items(other, True) == [full]
    sent, whole = decode_item(half), decode_item(full)
    # Bytes on the wire: half the pixel bytes are gone, less the declaration's few dozen.
    pixel_bytes = whole["pixel_values"].data.nbytes
    assert pixel_bytes // 2 - 100 < len(plain) - len(elided) <= pixel_bytes // 2
    assert len(half) < len(full) // 2 + 200
    assert sent["pixel_values"].transform.name == DEDUP
    assert whole["pixel_values"].transform is None
    back, _ = qwen2_renderer.wire_transforms.decode_item(sent)
    assert back["pixel_values"].data.tobytes() == whole["pixel_values"].data.tobytes()
    # Everything but the item is the same document, and each names its item by the bytes it
    # goes as (the identity generate keys it by).
    a, b = (
        decode_generate_request(plain, WireFormat.MSGPACK),
        decode_generate_request(elided, WireFormat.MSGPACK),
    )
    assert (a.token_ids, a.features.mm_placeholders) == (b.token_ids, b.features.mm_placeholders)
    assert a.features.mm_hashes == {"image": [content_id("", full)]}
    assert b.features.mm_hashes == {"image": [content_id("", half)]}


async def test_json_answers_stay_upstream_bytes_whatever_the_header(app, qwen2_dir):
    async with app_client(app) as c:
        plain = await post(c, body(qwen2_dir, seed=1), binary=False)
        asked = await post(c, body(qwen2_dir, seed=1), binary=False, transforms="*")
    assert asked == plain
    assert decode_item(items(asked, False)[0])["pixel_values"].transform is None


async def test_completions_elide_too(app, qwen2_dir):
    doc = {"model": qwen2_dir, "prompt": "Describe.", "images": [[data_url(png_bytes(seed=2))]]}
    doc["prompt"] = "<|vision_start|><|image_pad|><|vision_end|>Describe."
    async with app_client(app) as c:
        raw = await post(c, doc, binary=True, transforms="*", path="/v1/completions/render")
    (entry,) = items(raw, True, "completion")
    assert decode_item(entry)["pixel_values"].transform.name == DEDUP


async def test_caches_keep_elided_and_whole_items_apart(app, qwen2_dir):
    # Same body, same image: the answer cache and the item cache must not hand one caller's
    # form to the other.
    doc = body(qwen2_dir, seed=3)
    async with app_client(app) as c:
        first = items(await post(c, doc, binary=True, transforms="*"), True)
        second = items(await post(c, doc, binary=True), True)
        doc2 = {**doc, "request_id": "r2"}  # another body: only the item cache can hit
        third = items(await post(c, doc2, binary=True), True)
        fourth = items(await post(c, doc2, binary=True, transforms="*"), True)
    assert decode_item(first[0])["pixel_values"].transform is not None
    assert decode_item(second[0])["pixel_values"].transform is None
    assert third == second and fourth == first
    assert msgspec.msgpack.decode(first[0]) != msgspec.msgpack.decode(second[0])


async def test_row_deltas_go_to_callers_that_compress_or_name_them(app, qwen2_dir, qwen2_renderer):
    async with app_client(app) as c:
        star = await post(c, body(qwen2_dir, seed=4), binary=True, transforms="*")
        coded = await post(c, body(qwen2_dir, seed=4), binary=True, transforms="*", zstd=True)
        named = await post(c, body(qwen2_dir, seed=4), binary=True, transforms=DELTA)
        elided = await post(c, body(qwen2_dir, seed=4), binary=True, transforms=DEDUP, zstd=True)
    declared = {
        label: decode_item(items(raw, True)[0])["pixel_values"]
        for label, raw in (("star", star), ("coded", coded), ("named", named), ("elided", elided))
    }
    assert {k: e.transform.name for k, e in declared.items()} == {
        "star": DEDUP,  # a caller that does not compress gains nothing from deltas
        "coded": DELTA,
        "named": DELTA,
        "elided": DEDUP,
    }
    # The delta form is the same size, and undoes to the very pixels the elided form carries.
    assert declared["coded"].data.nbytes == declared["star"].data.nbytes
    transforms = qwen2_renderer.wire_transforms
    back = {k: transforms.decode_item({"pixel_values": e})[0] for k, e in declared.items()}
    pixels = {k: b["pixel_values"].data.tobytes() for k, b in back.items()}
    assert pixels["coded"] == pixels["star"]
