"""Round trips of kwargs items over awkward tensors and every field layout."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tandem_wire import (
    BatchedLayout,
    FieldElem,
    FlatLayout,
    SharedLayout,
    decode_item,
    decode_item_b64,
    encode_item,
    encode_item_b64,
)

from ...support.items import assert_nested_equal


def assert_items_equal(a, b):
    assert list(a) == list(b)
    for key in a:
        assert a[key].layout == b[key].layout
        if a[key].data is None:
            assert b[key].data is None
        else:
            assert_nested_equal(a[key].data, b[key].data)


def roundtrip(item):
    out = decode_item(encode_item(item))
    assert_items_equal(item, out)
    out_b64 = decode_item_b64(encode_item_b64(item))
    assert_items_equal(item, out_b64)
    return out


RNG = np.random.default_rng(1234)

TENSORS = {
    "float32": RNG.standard_normal((6, 5), dtype=np.float32),
    "bfloat16": RNG.standard_normal((4, 3)).astype(ml_dtypes.bfloat16),
    "float16": RNG.standard_normal((3,)).astype(np.float16),
    "float64": RNG.standard_normal((2, 2)),
    "uint8": RNG.integers(0, 255, (16, 7), dtype=np.uint8),
    "int8": RNG.integers(-100, 100, (5,), dtype=np.int8),
    "int16": RNG.integers(-1000, 1000, (5,), dtype=np.int16),
    "int32": RNG.integers(-1000, 1000, (5, 1), dtype=np.int32),
    "int64": np.array([[1, 28, 28]], dtype=np.int64),
    "bool": np.array([True, False, True]),
    "empty": np.zeros((0, 1176), dtype=np.float32),
    "scalar": np.array(3.5, dtype=np.float32),
    "scalar_int": np.array(7, dtype=np.int64),
}


@pytest.mark.parametrize("name", sorted(TENSORS))
def test_tensor_roundtrip(name):
    arr = TENSORS[name]
    out = roundtrip({"x": FieldElem(arr, BatchedLayout())})
    assert out["x"].data.dtype == arr.dtype


def test_non_contiguous_tensors():
    base = np.arange(120, dtype=np.float32).reshape(10, 12)
    for arr in (base[:, ::3], base.T, base[::-1], base[2:8:2, 1:5]):
        assert not arr.flags.c_contiguous
        out = roundtrip({"x": FieldElem(arr, BatchedLayout())})
        np.testing.assert_array_equal(out["x"].data, arr)


def test_big_endian_input_becomes_little_endian():
    arr = np.arange(6, dtype=">f4").reshape(2, 3)
    out = decode_item(encode_item({"x": FieldElem(arr, BatchedLayout())}))
    assert out["x"].data.dtype == np.dtype("<f4")
    np.testing.assert_array_equal(out["x"].data, arr)


def test_layouts_roundtrip():
    pixels = np.ones((16, 12), dtype=np.float32)
    item = {
        "pixel_values": FieldElem(pixels, FlatLayout(slices=(slice(0, 16, None),))),
        "image_grid_thw": FieldElem(np.array([1, 4, 4]), BatchedLayout(keep_on_cpu=True)),
        "shared": FieldElem(np.zeros(3, np.int32), SharedLayout(batch_size=2)),
        "flat_dim1": FieldElem(
            np.ones((2, 6), np.float32),
            FlatLayout(
                slices=((slice(0, 2, None), slice(0, 3, None)), (slice(0, 2), slice(3, 6))),
                dim=1,
            ),
        ),
        "absent": FieldElem(None, BatchedLayout()),
    }
    roundtrip(item)


def test_nested_lists_and_scalars():
    item = {
        "frames": FieldElem(
            [np.zeros((2, 2), np.float32), [np.ones(3, np.int64), np.array(1.0)]], BatchedLayout()
        ),
        "fps": FieldElem(2.0, BatchedLayout()),
        "count": FieldElem(3, BatchedLayout()),
        "empty_list": FieldElem([], BatchedLayout()),
    }
    roundtrip(item)


def test_decode_is_zero_copy_view_of_buffer():
    arr = np.arange(1000, dtype=np.float32)
    buf = encode_item({"x": FieldElem(arr, BatchedLayout())})
    out = decode_item(buf)["x"].data
    assert not out.flags.owndata and not out.flags.writeable
    # The view's memory lies inside the encoded buffer.
    start = np.frombuffer(buf, np.uint8).ctypes.data
    assert start <= out.ctypes.data < start + len(buf)
