"""The in-memory safetensors codec: equal to the reference implementation both ways, and every
malformed or hostile file a typed wire error (never an exception of another kind)."""

from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import pytest

from tandem_wire import (
    InvalidTensorData,
    PayloadTooLarge,
    ShapeMismatch,
    UnsupportedDtype,
    WireError,
    decode_safetensors,
    encode_safetensors,
)


def _tensors(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "image_embeds": rng.standard_normal((7, 5)).astype(ml_dtypes.bfloat16),
        "image_grid_thw": np.array([1, 2, 14], np.int64),
        "f32": rng.standard_normal((3, 2, 2)).astype(np.float32),
        "empty": np.zeros((0, 4), np.float16),
        "scalar": np.array(3, np.int32),
        "mask": np.array([True, False, True]),
    }


def test_round_trip_every_dtype_and_odd_shapes():
    tensors = _tensors()
    out = decode_safetensors(encode_safetensors(tensors, {"format": "pt"}))
    assert list(out) == list(tensors)
    for name, arr in tensors.items():
        assert out[name].dtype == arr.dtype and out[name].shape == arr.shape
        assert out[name].tobytes() == arr.tobytes()
        assert not out[name].flags.writeable  # a view into the caller's bytes


def test_reference_writer_is_read():
    torch = pytest.importorskip("torch")
    from safetensors.torch import save

    embeds = torch.randn(6, 8, dtype=torch.bfloat16)
    grid = torch.tensor([[1, 2, 12]])
    out = decode_safetensors(save({"image_embeds": embeds, "image_grid_thw": grid}))
    assert out["image_embeds"].dtype == np.dtype(ml_dtypes.bfloat16)
    assert out["image_embeds"].tobytes() == embeds.view(torch.int16).numpy().tobytes()
    assert out["image_grid_thw"].tolist() == [[1, 2, 12]]


def test_reference_reader_reads_ours():
    torch = pytest.importorskip("torch")
    from safetensors.torch import load

    tensors = _tensors()
    loaded = load(encode_safetensors(tensors))
    assert loaded["image_embeds"].dtype == torch.bfloat16
    assert loaded["image_embeds"].view(torch.int16).numpy().tobytes() == (
        tensors["image_embeds"].tobytes()
    )
    assert loaded["image_grid_thw"].tolist() == [1, 2, 14]


def _file(header: dict, data: bytes = b"", *, length: int | None = None) -> bytes:
    head = json.dumps(header).encode()
    return struct.pack("<Q", len(head) if length is None else length) + head + data


def _entry(dtype: str = "F32", shape=(2,), offsets=(0, 8)) -> dict:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


@pytest.mark.parametrize(
    ("blob", "error"),
    [
        (b"", InvalidTensorData),
        (b"\x01\x02", InvalidTensorData),
        (struct.pack("<Q", 2**64 - 1) + b"{}", InvalidTensorData),
        (_file({"a": _entry()}, b"\0" * 8, length=10_000), InvalidTensorData),
        (struct.pack("<Q", 4) + b"[1,2", InvalidTensorData),  # not JSON
        (struct.pack("<Q", 2) + b"[]", InvalidTensorData),  # not an object
        (b"PK\x03\x04" + b"\0" * 60, InvalidTensorData),  # a torch.save zip
        (b"\x80\x04\x95" + b"\0" * 60, InvalidTensorData),  # a pickle
        (_file({"a": "x"}), InvalidTensorData),
        (_file({"a": _entry(dtype="F8_E4M3")}, b"\0" * 2), UnsupportedDtype),
        (_file({"a": _entry(dtype=["F32"])}, b"\0" * 8), UnsupportedDtype),
        (_file({"a": _entry(shape=(-1,))}, b"\0" * 8), ShapeMismatch),
        (_file({"a": _entry(shape=("2",))}, b"\0" * 8), ShapeMismatch),
        (_file({"a": _entry(shape=(True,))}, b"\0" * 8), ShapeMismatch),
        (_file({"a": _entry(shape=(1,) * 9, offsets=(0, 4))}, b"\0" * 4), PayloadTooLarge),
        (_file({"a": _entry(shape=(2**40, 2**40), offsets=(0, 8))}, b"\0" * 8), PayloadTooLarge),
        (_file({"a": _entry(offsets=(0, 16))}, b"\0" * 8), InvalidTensorData),
        (_file({"a": _entry(offsets=(8, 0))}, b"\0" * 8), InvalidTensorData),
        (_file({"a": _entry(offsets=(0,))}, b"\0" * 8), InvalidTensorData),
        (_file({"a": _entry(offsets=(0, 4))}, b"\0" * 8), ShapeMismatch),
        (_file({"a": _entry(), "b": _entry()}, b"\0" * 8), InvalidTensorData),  # aliased
        (_file({"a": _entry(offsets=(8, 16))}, b"\0" * 16), InvalidTensorData),  # a hole
        (_file({"a": _entry()}, b"\0" * 12), InvalidTensorData),  # trailing bytes
        (
            _file({f"t{i}": _entry(shape=(0,), offsets=(0, 0)) for i in range(17)}),
            PayloadTooLarge,
        ),
    ],
)
def test_hostile_files_are_typed_errors(blob, error):
    with pytest.raises(error):
        decode_safetensors(blob)


def test_bounds_are_the_callers():
    blob = encode_safetensors({"a": np.zeros(64, np.float32)})
    with pytest.raises(PayloadTooLarge):
        decode_safetensors(blob, max_tensor_bytes=255)
    with pytest.raises(InvalidTensorData):
        decode_safetensors(blob, max_header_bytes=8)
    assert decode_safetensors(blob, max_tensor_bytes=256)["a"].shape == (64,)


def test_random_bytes_never_escape_as_other_errors():
    rng = np.random.default_rng(7)
    good = encode_safetensors(_tensors())
    for _ in range(300):
        blob = bytearray(good)
        for i in rng.integers(0, len(blob), size=int(rng.integers(1, 6))):
            blob[i] = int(rng.integers(0, 256))
        try:
            decode_safetensors(bytes(blob[: int(rng.integers(0, len(blob) + 1))]))
        except WireError:
            pass
