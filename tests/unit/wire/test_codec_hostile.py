"""Hostile kwargs items: every case raises its typed WireError and nothing else."""

from __future__ import annotations

import msgspec
import pytest

from tandem_wire import (
    DecodeLimits,
    InvalidFieldLayout,
    InvalidTensorData,
    MalformedBase64,
    MalformedBody,
    NestingTooDeep,
    PayloadTooLarge,
    ShapeMismatch,
    UnsupportedDtype,
    UnsupportedExtType,
    WireError,
    decode_item,
    decode_item_b64,
)

Ext = msgspec.msgpack.Ext
enc = msgspec.msgpack.encode


def item_with(data, field=("batched", {"keep_on_cpu": False})):
    return enc({"pixel_values": {"data": data, "field": list(field)}})


def tensor(dtype="float32", shape=(2,), payload=b"\0" * 8, code=3):
    return [dtype, list(shape), Ext(code, payload)]


GOOD = item_with(tensor())

CASES = [
    # (name, bytes, expected error type)
    ("empty body", b"", MalformedBody),
    ("truncated", GOOD[:-3], MalformedBody),
    ("truncated header", GOOD[:5], MalformedBody),
    ("trailing garbage", GOOD + b"\x00", MalformedBody),
    ("not msgpack", b"\xc1\xc1\xc1", MalformedBody),
    ("top level list", enc([1, 2]), InvalidTensorData),
    ("top level int", enc(5), InvalidTensorData),
    ("pickle ext", item_with(tensor(code=1)), UnsupportedExtType),
    ("cloudpickle ext", item_with(tensor(code=2)), UnsupportedExtType),
    ("pickle ext at top", enc(Ext(1, b"cos\nsystem\n(S'echo pwned'\ntR.")), UnsupportedExtType),
    ("unknown ext code", item_with(tensor(code=5)), UnsupportedExtType),
    ("timestamp ext code", item_with(tensor(code=-1)), InvalidTensorData),
    ("dtype is not a dtype", item_with(tensor(dtype="object")), UnsupportedDtype),
    ("dtype attribute name", item_with(tensor(dtype="__class__")), UnsupportedDtype),
    ("dtype numpy spelling", item_with(tensor(dtype="<f4")), UnsupportedDtype),
    ("dtype torch prefix", item_with(tensor(dtype="torch.float32")), UnsupportedDtype),
    ("dtype huge string", item_with(tensor(dtype="x" * 100000)), UnsupportedDtype),
    ("dtype int", item_with([5, [2], Ext(3, b"\0" * 8)]), InvalidTensorData),
    ("shape disagrees with bytes", item_with(tensor(shape=(3,))), ShapeMismatch),
    ("shape too small", item_with(tensor(shape=(1,))), ShapeMismatch),
    ("negative dim", item_with(tensor(shape=(-2,))), ShapeMismatch),
    ("negative dims cancel", item_with(tensor(shape=(-2, -1))), ShapeMismatch),
    ("shape not list", item_with(["float32", 2, Ext(3, b"\0" * 8)]), ShapeMismatch),
    ("shape float", item_with(["float32", [2.0], Ext(3, b"\0" * 8)]), ShapeMismatch),
    ("shape bool", item_with(["float32", [True, True], Ext(3, b"\0" * 4)]), ShapeMismatch),
    ("product overflows int64", item_with(tensor(shape=(2**62, 2**62, 16))), PayloadTooLarge),
    (
        "product wraps to 0 in int64",
        item_with(tensor(shape=(2**63, 2), payload=b"")),
        PayloadTooLarge,
    ),
    ("uint64 max dim", item_with(tensor(shape=(2**64 - 1,))), PayloadTooLarge),
    ("huge declared tensor", item_with(tensor(shape=(1 << 40,))), PayloadTooLarge),
    ("too many dims", item_with(tensor(shape=(1,) * 40, payload=b"\0" * 4)), PayloadTooLarge),
    ("bin instead of ext", item_with(["float32", [2], b"\0" * 8]), InvalidTensorData),
    ("out of band index", item_with(["float32", [2], 1]), InvalidTensorData),
    ("tensor of 2 parts", item_with(["float32", [2]]), InvalidTensorData),
    ("tensor of 4 parts", item_with(["float32", [2], Ext(3, b"\0" * 8), 1]), InvalidTensorData),
    ("data is a string", item_with("float32"), InvalidTensorData),
    ("data is a map", item_with({"a": 1}), InvalidTensorData),
    ("elem missing field", enc({"x": {"data": None}}), InvalidTensorData),
    (
        "elem extra key",
        enc({"x": {"data": None, "field": ["batched", {}], "z": 1}}),
        InvalidTensorData,
    ),
    ("elem not map", enc({"x": [1, 2]}), InvalidTensorData),
    ("non-string key", enc({1: {"data": None, "field": ["batched", {}]}}), InvalidTensorData),
    ("unknown factory", item_with(tensor(), ("pickled", {})), InvalidFieldLayout),
    ("factory not string", item_with(tensor(), (3, {})), InvalidFieldLayout),
    ("field not pair", enc({"x": {"data": None, "field": ["batched"]}}), InvalidFieldLayout),
    ("field kwargs list", enc({"x": {"data": None, "field": ["batched", []]}}), InvalidFieldLayout),
    ("unknown field kwarg", item_with(tensor(), ("batched", {"evil": 1})), InvalidFieldLayout),
    (
        "keep_on_cpu not bool",
        item_with(tensor(), ("batched", {"keep_on_cpu": 1})),
        InvalidFieldLayout,
    ),
    ("flat without slices", item_with(tensor(), ("flat", {"dim": 0})), InvalidFieldLayout),
    ("flat slices not list", item_with(tensor(), ("flat", {"slices": 3})), InvalidFieldLayout),
    (
        "flat slice too long",
        item_with(tensor(), ("flat", {"slices": [[0, 1, 1, 1]]})),
        InvalidFieldLayout,
    ),
    (
        "flat slice strings",
        item_with(tensor(), ("flat", {"slices": [["a", "b"]]})),
        InvalidFieldLayout,
    ),
    (
        "flat slice step 0",
        item_with(tensor(), ("flat", {"slices": [[0, 1, 0]]})),
        InvalidFieldLayout,
    ),
    (
        "flat slice negative step",
        item_with(tensor(), ("flat", {"slices": [[1, 0, -1]]})),
        InvalidFieldLayout,
    ),
    (
        "flat slice negative",
        item_with(tensor(), ("flat", {"slices": [[-2, None]]})),
        InvalidFieldLayout,
    ),
    (
        "flat slice reversed",
        item_with(tensor(), ("flat", {"slices": [[2, 1]]})),
        InvalidFieldLayout,
    ),
    (
        "flat slice huge",
        item_with(tensor(), ("flat", {"slices": [[0, 2**63 - 1]]})),
        InvalidFieldLayout,
    ),
    (
        "flat slices nested 3",
        item_with(tensor(), ("flat", {"slices": [[[[0, 1]]]]})),
        InvalidFieldLayout,
    ),
    (
        "flat negative dim",
        item_with(tensor(), ("flat", {"slices": [], "dim": -1})),
        InvalidFieldLayout,
    ),
    ("flat huge dim", item_with(tensor(), ("flat", {"slices": [], "dim": 99})), InvalidFieldLayout),
    ("shared no batch", item_with(tensor(), ("shared", {})), InvalidFieldLayout),
    ("shared zero batch", item_with(tensor(), ("shared", {"batch_size": 0})), InvalidFieldLayout),
    (
        "shared huge batch",
        item_with(tensor(), ("shared", {"batch_size": 2**40})),
        InvalidFieldLayout,
    ),
    ("deep nesting", item_with([[[[[[[[[[[tensor()]]]]]]]]]]]), NestingTooDeep),
]


@pytest.mark.parametrize(("name", "data", "expected"), CASES, ids=[c[0] for c in CASES])
def test_hostile_item(name, data, expected):
    with pytest.raises(expected) as info:
        decode_item(data)
    assert isinstance(info.value, WireError)
    assert info.value.type == expected.type
    assert 400 <= info.value.status_code < 500


def _deep_array(depth: int) -> bytes:
    # fixarray of one element, nested `depth` times: 1 byte per level, cheap to build.
    return b"\x81\xa1x\x82\xa4data" + b"\x91" * depth + b"\x01" + b"\xa5field\x92\xa7batched\x80"


@pytest.mark.parametrize("depth", [50, 5000, 200_000])
def test_extreme_nesting_is_refused(depth):
    with pytest.raises((NestingTooDeep, MalformedBody)):
        decode_item(_deep_array(depth))


def test_huge_declared_array_length_does_not_allocate():
    # array32 header claiming 4 billion elements, with nothing behind it.
    data = b"\x81\xa1x\x82\xa4data\xdd\xff\xff\xff\xff"
    with pytest.raises(MalformedBody):
        decode_item(data)


def test_huge_declared_bin_and_ext_lengths():
    for header in (b"\xc6\xff\xff\xff\xff", b"\xc9\xff\xff\xff\xff\x03", b"\xdf\xff\xff\xff\xff"):
        with pytest.raises(MalformedBody):
            decode_item(b"\x81\xa1x" + header)


def test_item_size_limit_checked_before_decoding():
    limits = DecodeLimits(max_item_bytes=16)
    with pytest.raises(PayloadTooLarge):
        decode_item(GOOD, limits)


def test_tensor_size_limit():
    limits = DecodeLimits(max_tensor_bytes=4)
    with pytest.raises(PayloadTooLarge):
        decode_item(GOOD, limits)


def test_tensor_count_limit():
    limits = DecodeLimits(max_tensors_per_item=3)
    with pytest.raises(PayloadTooLarge):
        decode_item(item_with([tensor()] * 4), limits)


def test_key_count_limit():
    limits = DecodeLimits(max_keys_per_item=2)
    doc = {f"k{i}": {"data": None, "field": ["batched", {}]} for i in range(3)}
    with pytest.raises(PayloadTooLarge):
        decode_item(enc(doc), limits)


@pytest.mark.parametrize("text", ["@@@@", "abc", "a" * 5, "QUJD\n", "QUJD=", "QUJD===="])
def test_malformed_base64(text):
    with pytest.raises(MalformedBase64):
        decode_item_b64(text)


def test_base64_size_checked_before_decoding():
    with pytest.raises(PayloadTooLarge):
        decode_item_b64("A" * 400, DecodeLimits(max_item_bytes=100))


def test_insecure_serialization_env_does_not_enable_pickle(monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    with pytest.raises(UnsupportedExtType):
        decode_item(item_with(tensor(code=1)))
