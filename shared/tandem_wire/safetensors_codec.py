"""safetensors bytes <-> named numpy tensors, in memory, with the checks untrusted bytes need.

The format: an 8-byte little-endian header length, a JSON header ``{name: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__": {...}}``, then the tensors' raw little-endian
bytes, which the header's offsets must tile exactly. Nothing in it can run code (no pickle, no
``torch.load``); everything is bounded and checked before an array is made. bfloat16 comes out as
``ml_dtypes.bfloat16`` (the safetensors package's numpy face cannot read it).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import Any

import msgspec
import numpy as np

from .dtypes import numpy_dtype, wire_dtype_name
from .errors import InvalidTensorData, PayloadTooLarge, ShapeMismatch, UnsupportedDtype

__all__ = ["SAFETENSORS_DTYPES", "decode_safetensors", "encode_safetensors"]

SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}
"""safetensors dtype tags -> wire (torch) dtype names; any other tag is refused."""
_WIRE_TO_TAG = {v: k for k, v in SAFETENSORS_DTYPES.items()}

_MAX_NDIM = 8
_MAX_NAME = 256


def encode_safetensors(
    tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None
) -> bytes:
    """One safetensors file holding ``tensors`` (numpy arrays; ``ml_dtypes.bfloat16`` for bf16)."""
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    arrays = []
    offset = 0
    for name, arr in tensors.items():
        a = np.asarray(arr, order="C")  # (ascontiguousarray would make a 0-d tensor 1-d)
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        header[name] = {
            "dtype": _WIRE_TO_TAG[wire_dtype_name(a.dtype)],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + a.nbytes],
        }
        arrays.append(a)
        offset += a.nbytes
    head = msgspec.json.encode(header)
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned, as the reference writer
    return b"".join(
        [struct.pack("<Q", len(head)), head, *(a.reshape(-1).view(np.uint8).data for a in arrays)]
    )


def decode_safetensors(
    buf: bytes | bytearray | memoryview,
    *,
    max_tensors: int = 16,
    max_header_bytes: int = 64 * 1024,
    max_tensor_bytes: int = 128 * 1024 * 1024,
) -> dict[str, np.ndarray]:
    """Name -> tensor of a safetensors file held in memory.

    Arrays are read-only views into ``buf`` (they keep it alive; possibly unaligned). Every
    failure is a typed WireError: a header that is not JSON or not the format, more than
    ``max_tensors`` tensors, a dtype outside the allowlist, offsets that do not tile the data
    exactly, byte counts that disagree with shapes, a tensor over ``max_tensor_bytes``.
    """
    view = memoryview(buf).cast("B")
    if view.nbytes < 8:
        raise InvalidTensorData("not a safetensors file: shorter than its header length")
    (n,) = struct.unpack("<Q", view[:8])
    if n > min(max_header_bytes, view.nbytes - 8):
        raise InvalidTensorData(
            f"not a safetensors file: header length {min(n, 2**63)} is out of range "
            f"(at most {max_header_bytes} bytes, inside the file)"
        )
    try:
        header = msgspec.json.decode(view[8 : 8 + n])
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        raise InvalidTensorData("not a safetensors file: its header is not JSON") from None
    if not isinstance(header, dict):
        raise InvalidTensorData("not a safetensors file: its header is not an object")
    header.pop("__metadata__", None)
    if len(header) > max_tensors:
        raise PayloadTooLarge(f"{len(header)} tensors in one file; at most {max_tensors}")
    data = view[8 + n :]
    spans: list[tuple[int, int, str]] = []
    out: dict[str, np.ndarray] = {}
    for name, entry in header.items():
        shown = name[:_MAX_NAME]
        dtype, shape, begin, end = _entry(shown, entry, max_tensor_bytes)
        if not 0 <= begin <= end <= data.nbytes:
            raise InvalidTensorData(f"tensor {shown!r}: data offsets outside the file")
        if math.prod(shape) * dtype.itemsize != end - begin:
            raise ShapeMismatch(f"tensor {shown!r}: byte count does not match its shape")
        spans.append((begin, end, shown))
        out[name] = np.frombuffer(data[begin:end], dtype=dtype).reshape(shape)
    # The offsets tile the data exactly: no overlaps (one byte read as two tensors), no holes,
    # nothing after the last tensor.
    at = 0
    for begin, end, shown in sorted(spans):
        if begin != at:
            raise InvalidTensorData(f"tensor {shown!r}: data offsets overlap or leave a gap")
        at = end
    if at != data.nbytes:
        raise InvalidTensorData("not a safetensors file: bytes after the last tensor")
    return out


def _entry(name: str, entry: Any, max_tensor_bytes: int) -> tuple[np.dtype, list[int], int, int]:
    if not isinstance(entry, dict):
        raise InvalidTensorData(f"tensor {name!r}: malformed header entry")
    tag, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(tag, str) or tag not in SAFETENSORS_DTYPES:
        raise UnsupportedDtype(f"tensor {name!r}: unsupported dtype {str(tag)[:16]!r}")
    dtype = numpy_dtype(SAFETENSORS_DTYPES[tag])
    if not (isinstance(shape, list) and all(_is_count(d) for d in shape)):
        raise ShapeMismatch(f"tensor {name!r}: shape must be a list of non-negative integers")
    if len(shape) > _MAX_NDIM:
        raise PayloadTooLarge(f"tensor {name!r} has {len(shape)} dimensions, limit {_MAX_NDIM}")
    nbytes = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    if nbytes > max_tensor_bytes:
        raise PayloadTooLarge(f"tensor {name!r} of {nbytes} bytes exceeds {max_tensor_bytes}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        raise InvalidTensorData(f"tensor {name!r}: data_offsets must be [begin, end]")
    return dtype, shape, offsets[0], offsets[1]


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0
