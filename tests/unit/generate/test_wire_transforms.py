"""Wire transforms end to end: an elided image gives the engine the very tensor (same greedy
tokens and logprobs as without elision), repeats cost their hash only, and lying or unknown
declarations are typed 4xx (the real engine; few generations)."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from tandem_client import AsyncTandemClient
from tandem_vllm.wire_transforms import PatchRowDelta, TemporalDedup
from tandem_wire import (
    FieldElem,
    FieldTransform,
    FlatLayout,
    GenerateRequest,
    WireFormat,
    decode_item,
    encode_generate_request,
    encode_item,
)

from ...support.asgi import app_client
from .helpers import GREEDY, MSGPACK, generate_app, post, render, tokens
from .test_client_e2e import GENERATE, Router, image_chat

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.engine]

DEDUP = TemporalDedup.name
DELTA = PatchRowDelta.name
PIXELS = "pixel_values"
UNSUPPORTED = "unsupported_wire_transform"
INVALID = "invalid_mm_item"


def sent_pixels(exchange) -> list[FieldElem | None]:
    return [
        None if d is None else decode_item(d)["pixel_values"]
        for d in exchange.kwargs_data()["image"]
    ]


def logprobs(answer) -> list[float]:
    return [c.logprob for c in answer.choices[0].logprobs.content]


async def test_elided_images_give_the_engine_the_same_tensor(
    qwen2_engine, qwen2_renderer, qwen2_dir
):
    from tandem_render.app import create_app as create_render_app
    from tandem_render.settings import RenderSettings

    router = Router()
    render_app = create_render_app(
        RenderSettings(model=qwen2_dir, max_images_per_prompt=8), qwen2_renderer
    )
    gen_app = generate_app(qwen2_engine, qwen2_dir)
    clients = {
        "elided": AsyncTandemClient(  # the default: binary, render asked for transforms
            "http://render", "http://generate", model=qwen2_dir, transport=router
        ),
        "whole": AsyncTandemClient(
            "http://render",
            "http://generate",
            model=qwen2_dir,
            transport=router,
            wire_transforms=None,
        ),
        "json": AsyncTandemClient(  # upstream's JSON: never elided, whatever it asks
            "http://render", "http://generate", model=qwen2_dir, transport=router, binary=False
        ),
        "delta": AsyncTandemClient(  # compressing: row deltas, which pay only under a coding
            "http://render",
            "http://generate",
            model=qwen2_dir,
            transport=router,
            compression="zstd",
        ),
    }
    import httpx

    ask = {"temperature": 0.0, "max_tokens": 8, "logprobs": True}
    async with app_client(render_app), app_client(gen_app):
        router.transports["render"] = httpx.ASGITransport(app=render_app)
        router.transports["generate"] = httpx.ASGITransport(app=gen_app)
        answers, items = {}, {}
        for name, client in clients.items():
            answers[name] = await client.chat(image_chat(61), **ask)
            (items[name],) = sent_pixels(router.sent_to(GENERATE)[-1])
        repeat = await clients["elided"].chat(image_chat(61), **ask)
        for client in clients.values():
            await client.aclose()

    exchanges = router.sent_to(GENERATE)
    assert [e.status for e in exchanges] == [200] * 5
    # What went over the wire: half the pixel bytes, declared; whole tensors otherwise.
    assert items["elided"].transform == FieldTransform(
        DEDUP, {"channels": 3, "temporal_patch_size": 2}
    )
    assert items["whole"].transform is None and items["json"].transform is None
    assert items["delta"].transform == FieldTransform(
        DELTA, {"channels": 3, "temporal_patch_size": 2, "frames": 1}
    )
    assert exchanges[3].content_encoding == "zstd"
    whole = items["whole"].data
    assert items["elided"].data.nbytes * 2 == whole.nbytes
    assert items["json"].data.tobytes() == whole.tobytes()
    assert len(exchanges[0].body) < len(exchanges[1].body) - whole.nbytes // 2 + 200
    # What the engine computed from it: the same, to the last logprob bit.
    reference = answers["whole"]
    for name in ("elided", "json", "delta"):
        assert answers[name].choices[0].token_ids == reference.choices[0].token_ids, name
        assert logprobs(answers[name]) == logprobs(reference), name
    # A repeat of a held image costs its hash only.
    assert sent_pixels(exchanges[4]) == [None]
    assert len(exchanges[4].body) < 4000
    assert repeat.choices[0].token_ids == reference.choices[0].token_ids


def _declared(req: GenerateRequest, key: str, data, transform) -> GenerateRequest:
    item = decode_item(req.features.kwargs_data["image"][0])
    old = item[key]
    item[key] = FieldElem(
        data if data is not None else old.data,
        FlatLayout(slices=(slice(0, len(data)),)) if data is not None else old.layout,
        transform,
    )
    feats = msgspec.structs.replace(req.features, kwargs_data={"image": [encode_item(item)]})
    return msgspec.structs.replace(req, features=feats)


async def test_unknown_or_lying_declarations_are_typed_4xx(qwen2_engine, qwen2_renderer, qwen2_dir):
    req = await render(qwen2_renderer, qwen2_dir, [62], transforms=frozenset({"*"}), **GREEDY)
    sent = decode_item(req.features.kwargs_data["image"][0])["pixel_values"]
    assert sent.transform is not None
    half = np.asarray(sent.data)
    whole = np.concatenate([half.reshape(-1, 3, 1, 196)] * 2, axis=2).reshape(len(half), -1)
    good = dict(sent.transform.params)

    def t(name=DEDUP, **params):
        return FieldTransform(name, {**good, **params})

    narrow = half[:, :392].copy()  # two channels' worth: rebuilt, then refused by width
    cases = [
        ("unknown name", PIXELS, None, t("qwen_vl.temporal_dedup/v2"), UNSUPPORTED),
        ("on another key", "image_grid_thw", None, t(), UNSUPPORTED),
        ("another factor", PIXELS, None, t(temporal_patch_size=3), INVALID),
        ("another width", PIXELS, None, t(channels=2), INVALID),
        ("declared on the whole tensor", PIXELS, whole, t(), INVALID),
        ("rows lost", PIXELS, half[:-4], t(), INVALID),
        ("rows of a narrower tensor", PIXELS, narrow, t(channels=2), INVALID),
        ("delta of 3 frames", PIXELS, None, t(DELTA, frames=3), INVALID),
        ("delta without frames", PIXELS, None, t(DELTA), INVALID),
        ("delta of the whole tensor", PIXELS, whole, t(DELTA, frames=1), INVALID),
    ]
    app = generate_app(qwen2_engine, qwen2_dir)
    headers = {"content-type": MSGPACK, "accept": MSGPACK}
    async with app_client(app) as c:
        for name, key, data, transform, type_ in cases:
            body = encode_generate_request(_declared(req, key, data, transform), WireFormat.MSGPACK)
            r = await c.post("/inference/v1/generate", content=body, headers=headers)
            error = msgspec.msgpack.decode(r.content)["error"]
            assert (r.status_code, error["type"]) == (400, type_), (name, error)
        # The node keeps serving, and the honest declaration is taken.
        assert (await c.get("/health")).status_code == 200
        assert len(tokens(await post(c, req, binary=True))) == 8
