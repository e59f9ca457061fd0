"""Golden bytes: the exact wire output for fixed inputs must not drift."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tandem_wire import (
    BatchedLayout,
    FieldElem,
    FlatLayout,
    GenerateRequest,
    MultiModalFeatures,
    PlaceholderRange,
    WireFormat,
    decode_generate_request,
    decode_item,
    encode_generate_request,
    encode_item,
)

GOLDEN = Path(__file__).parent / "golden"


def golden_item():
    return {
        "pixel_values": FieldElem(
            np.array([[1, 2], [3, 4]], dtype=np.uint8), FlatLayout(slices=(slice(0, 2, None),))
        ),
        "image_grid_thw": FieldElem(
            np.array([1, 2, 2], dtype=np.int64), BatchedLayout(keep_on_cpu=True)
        ),
    }


def golden_request():
    return GenerateRequest(
        token_ids=[1, 5, 5, 2],
        request_id="r1",
        features=MultiModalFeatures(
            mm_hashes={"image": ["ab" * 32]},
            mm_placeholders={"image": [PlaceholderRange(offset=1, length=2)]},
            kwargs_data={"image": [encode_item(golden_item())]},
        ),
        sampling_params={"max_tokens": 4},
    )


def test_item_bytes():
    expected = bytes.fromhex((GOLDEN / "item.msgpack.hex").read_text().strip())
    assert encode_item(golden_item()) == expected
    item = decode_item(expected)
    assert item["image_grid_thw"].data.tolist() == [1, 2, 2]
    assert item["pixel_values"].layout == FlatLayout(slices=(slice(0, 2, None),))


def test_generate_request_json_bytes():
    expected = (GOLDEN / "generate_request.json").read_bytes().strip()
    assert encode_generate_request(golden_request(), WireFormat.JSON) == expected


def test_generate_request_msgpack_bytes():
    expected = bytes.fromhex((GOLDEN / "generate_request.msgpack.hex").read_text().strip())
    assert encode_generate_request(golden_request(), WireFormat.MSGPACK) == expected


def test_json_and_msgpack_carry_the_same_item_bytes():
    j = decode_generate_request((GOLDEN / "generate_request.json").read_bytes(), WireFormat.JSON)
    m = decode_generate_request(
        bytes.fromhex((GOLDEN / "generate_request.msgpack.hex").read_text().strip()),
        WireFormat.MSGPACK,
    )
    assert bytes(j.features.kwargs_data["image"][0]) == bytes(m.features.kwargs_data["image"][0])
    assert j.token_ids == m.token_ids and j.request_id == m.request_id
