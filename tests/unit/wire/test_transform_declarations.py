"""Wire-transform declarations on kwargs fields: bytes, round trips, and hostile forms.

The codec reads and writes the declaration only; applying a transform is model code
(tests/unit/vllm_adapters/test_wire_transforms.py).
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest

from tandem_wire import (
    ANY_WIRE_TRANSFORM,
    BatchedLayout,
    FieldElem,
    FieldTransform,
    FlatLayout,
    InvalidTensorData,
    accepted_wire_transforms,
    decode_item,
    encode_item,
)

GOLDEN = Path(__file__).parent / "golden"
Ext = msgspec.msgpack.Ext


PARAMS = {"channels": 1, "temporal_patch_size": 2}


def declared_item(params=None):
    return {
        "pixel_values": FieldElem(
            np.array([[1, 2], [3, 4]], dtype=np.uint8),
            FlatLayout(slices=(slice(0, 2, None),)),
            FieldTransform("qwen_vl.temporal_dedup/v1", params or PARAMS),
        ),
        "image_grid_thw": FieldElem(
            np.array([1, 2, 2], dtype=np.int64), BatchedLayout(keep_on_cpu=True)
        ),
    }


def test_declared_item_bytes_are_pinned_and_round_trip():
    expected = bytes.fromhex((GOLDEN / "item_transform.msgpack.hex").read_text().strip())
    assert encode_item(declared_item()) == expected
    item = decode_item(expected)
    assert item["pixel_values"].transform == FieldTransform("qwen_vl.temporal_dedup/v1", PARAMS)
    assert item["pixel_values"].data.tolist() == [[1, 2], [3, 4]]  # as sent, not undone
    assert item["image_grid_thw"].transform is None


def test_undeclared_fields_keep_upstream_bytes():
    # The third key is written only with a declaration: every other item is upstream's layout.
    item = declared_item()
    plain = {k: FieldElem(e.data, e.layout) for k, e in item.items()}
    raw = msgspec.msgpack.decode(encode_item(plain))
    assert all(set(elem) == {"data", "field"} for elem in raw.values())
    assert set(msgspec.msgpack.decode(encode_item(item))["pixel_values"]) == {
        "data",
        "field",
        "transform",
    }


def test_param_order_does_not_change_the_bytes():
    # Content ids hash item bytes: one declaration must have one encoding.
    a = encode_item(declared_item({"channels": 3, "temporal_patch_size": 2}))
    b = encode_item(declared_item({"temporal_patch_size": 2, "channels": 3}))
    assert a == b


def elem_with(transform):
    return msgspec.msgpack.encode(
        {
            "pixel_values": {
                "data": ["uint8", [2], Ext(3, b"\x01\x02")],
                "field": ["batched", {}],
                "transform": transform,
            }
        }
    )


@pytest.mark.parametrize(
    "transform",
    [
        "qwen_vl.temporal_dedup/v1",
        ["qwen_vl.temporal_dedup/v1"],
        ["qwen_vl.temporal_dedup/v1", {}, 1],
        [5, {}],
        ["", {}],
        ["x" * 65, {}],
        ["t", []],
        ["t", {"k": -1}],
        ["t", {"k": True}],
        ["t", {"k": 1.5}],
        ["t", {"k": "2"}],
        ["t", {"k": 1 << 40}],
        ["t", {"": 1}],
        ["t", {"k" * 65: 1}],
        ["t", {f"k{i}": 1 for i in range(17)}],
        ["t", {"k": [1]}],
    ],
    ids=repr,
)
def test_malformed_declarations_are_invalid_tensor_data(transform):
    with pytest.raises(InvalidTensorData):
        decode_item(elem_with(transform))


def test_other_extra_keys_are_still_refused():
    raw = msgspec.msgpack.encode(
        {"pixel_values": {"data": None, "field": ["batched", {}], "transforms": ["t", {}]}}
    )
    with pytest.raises(InvalidTensorData):
        decode_item(raw)


@pytest.mark.parametrize(
    ("header", "names"),
    [
        (None, set()),
        ("", set()),
        ("*", {ANY_WIRE_TRANSFORM}),
        ("qwen_vl.temporal_dedup/v1", {"qwen_vl.temporal_dedup/v1"}),
        (" a ,b,, a", {"a", "b"}),
    ],
)
def test_accepted_wire_transforms_header(header, names):
    assert accepted_wire_transforms(header) == names
