"""The kwargs-item codec: KwargsItem <-> vLLM's msgpack item layout, with safe decoding.

One item is a msgpack map ``{key: {"data": <nested>, "field": [factory, kwargs]}}`` where a
tensor is ``[dtype_name, shape, Ext(3, raw little-endian bytes)]``; this is the layout vLLM's
``MsgpackEncoder`` writes for a ``MultiModalKwargsItem`` with every tensor inline.

Our one extension, written only for a binary receiver that asked for it: a field may carry a
third key, ``"transform": [name, {param: int}]`` (``FieldTransform``), saying ``data`` is in a
model-aware wire form. Upstream's decoder never sees it; an older Tandem receiver refuses it
(``invalid_tensor_data``), a current one that does not apply that transform answers
``unsupported_wire_transform``.
"""

from __future__ import annotations

import binascii
import math
from typing import Any

import msgspec
import numpy as np
import pybase64

from .dtypes import numpy_dtype, wire_dtype_name
from .errors import (
    InvalidFieldLayout,
    InvalidTensorData,
    MalformedBase64,
    MalformedBody,
    NestingTooDeep,
    PayloadTooLarge,
    ShapeMismatch,
    UnsupportedExtType,
    WireError,
)
from .items import (
    BatchedLayout,
    FieldElem,
    FieldLayout,
    FieldTransform,
    FlatLayout,
    KwargsItem,
    NestedTensors,
    SharedLayout,
)
from .limits import DEFAULT_LIMITS, DecodeLimits

__all__ = [
    "RAW_TENSOR_EXT",
    "encode_item",
    "decode_item",
    "encode_item_b64",
    "decode_item_b64",
    "b64decode_item_bytes",
]

RAW_TENSOR_EXT = 3
"""The msgpack extension code for raw tensor bytes; the only extension ever accepted."""

_MAX_SLICES = 1 << 16
_MAX_TRANSFORM_NAME = 64
_MAX_TRANSFORM_PARAMS = 16
_MAX_TRANSFORM_PARAM = 1 << 31
_MAX_BATCH_SIZE = 1 << 20
_MAX_INDEX = 1 << 62
_LAYOUT_KEYS = {
    "batched": frozenset({"keep_on_cpu"}),
    "flat": frozenset({"keep_on_cpu", "slices", "dim"}),
    "shared": frozenset({"keep_on_cpu", "batch_size"}),
}


# --------------------------------------------------------------------------- encoding


def _tensor_to_wire(arr: np.ndarray) -> list[Any]:
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    name = wire_dtype_name(arr.dtype)
    # ravel() copies only when the array is not C-contiguous; the uint8 view lets bfloat16
    # (which has no buffer-protocol format) be exported as plain bytes.
    raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    return [name, list(arr.shape), msgspec.msgpack.Ext(RAW_TENSOR_EXT, raw.data)]


def _nested_to_wire(data: NestedTensors) -> Any:
    if isinstance(data, np.ndarray):
        return _tensor_to_wire(data)
    if isinstance(data, np.generic):
        return data.item()
    if isinstance(data, (int, float)):
        return data
    if isinstance(data, (list, tuple)):
        return [_nested_to_wire(x) for x in data]
    raise TypeError(f"cannot encode {type(data).__name__} as tensor data")


def _slice_to_wire(s: Any) -> Any:
    if isinstance(s, slice):
        # Processors build slices from 0-d tensors (e.g. a cumulative patch count); int() takes
        # any integral scalar, as vLLM's encoder does.
        return [None if v is None else int(v) for v in (s.start, s.stop, s.step)]
    return [_slice_to_wire(x) for x in s]


def _layout_to_wire(layout: FieldLayout) -> list[Any]:
    # Key order follows vLLM's dataclass field order, so our bytes equal its bytes.
    if isinstance(layout, BatchedLayout):
        return ["batched", {"keep_on_cpu": layout.keep_on_cpu}]
    if isinstance(layout, FlatLayout):
        return [
            "flat",
            {
                "keep_on_cpu": layout.keep_on_cpu,
                "slices": _slice_to_wire(layout.slices),
                "dim": layout.dim,
            },
        ]
    if isinstance(layout, SharedLayout):
        return ["shared", {"keep_on_cpu": layout.keep_on_cpu, "batch_size": layout.batch_size}]
    raise TypeError(f"unknown field layout {type(layout).__name__}")


_ENCODER = msgspec.msgpack.Encoder()


def _elem_to_wire(elem: FieldElem) -> dict[str, Any]:
    out = {
        "data": None if elem.data is None else _nested_to_wire(elem.data),
        "field": _layout_to_wire(elem.layout),
    }
    if elem.transform is not None:
        # Params sorted: equal declarations are equal bytes (content ids depend on them).
        out["transform"] = [elem.transform.name, dict(sorted(elem.transform.params.items()))]
    return out


def encode_item(item: KwargsItem) -> bytes:
    """Encode one kwargs item to msgpack bytes (tensor bytes copied once, into the output)."""
    return _ENCODER.encode({key: _elem_to_wire(elem) for key, elem in item.items()})


def encode_item_b64(item: KwargsItem) -> str:
    """Encode one kwargs item as base64 text, the JSON-mode (upstream) form."""
    return pybase64.b64encode(encode_item(item)).decode("ascii")


# --------------------------------------------------------------------------- decoding


def _ext_hook(code: int, data: memoryview) -> Any:
    if code != RAW_TENSOR_EXT:
        # Codes 1 and 2 are vLLM's pickle/cloudpickle: never honoured, whatever the environment.
        raise UnsupportedExtType(f"msgpack extension type {code} is not accepted")
    return data


_DECODER = msgspec.msgpack.Decoder(ext_hook=_ext_hook)
_ELEM_KEYS = (frozenset({"data", "field"}), frozenset({"data", "field", "transform"}))


class _Budget:
    __slots__ = ("limits", "tensors")

    def __init__(self, limits: DecodeLimits) -> None:
        self.limits = limits
        self.tensors = 0


def _is_index(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _tensor_from_wire(obj: list[Any], budget: _Budget) -> np.ndarray:
    limits = budget.limits
    budget.tensors += 1
    if budget.tensors > limits.max_tensors_per_item:
        raise PayloadTooLarge(f"more than {limits.max_tensors_per_item} tensors in one item")
    if len(obj) != 3:
        raise InvalidTensorData("a tensor must be [dtype, shape, data]")
    name, shape, data = obj
    dtype = numpy_dtype(name)
    if not isinstance(shape, list) or not all(_is_index(d) for d in shape):
        raise ShapeMismatch("tensor shape must be a list of integers")
    if len(shape) > limits.max_ndim:
        raise PayloadTooLarge(f"tensor has {len(shape)} dimensions, limit {limits.max_ndim}")
    if any(d < 0 for d in shape):
        raise ShapeMismatch("tensor shape has a negative dimension")
    if not isinstance(data, memoryview):
        # vLLM may also write an index into out-of-band buffers; HTTP bodies carry no such
        # buffers, so only inline Ext(3) bytes are meaningful here.
        raise InvalidTensorData("tensor data must be inline raw bytes (msgpack ext type 3)")
    nbytes = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    if nbytes > limits.max_tensor_bytes:
        raise PayloadTooLarge(f"tensor of {nbytes} bytes exceeds {limits.max_tensor_bytes}")
    if nbytes != data.nbytes:
        raise ShapeMismatch(
            f"tensor {name}{tuple(shape)} needs {nbytes} bytes but {data.nbytes} were sent"
        )
    # Zero-copy: the array is a read-only view into the decoded body, which it keeps alive.
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _nested_from_wire(obj: Any, depth: int, budget: _Budget) -> NestedTensors:
    if isinstance(obj, (int, float)):
        return obj
    if not isinstance(obj, list):
        raise InvalidTensorData(f"tensor data must be lists or numbers, not {_kind(obj)}")
    if obj and isinstance(obj[0], str):
        return _tensor_from_wire(obj, budget)
    if depth >= budget.limits.max_depth:
        raise NestingTooDeep(f"tensor lists nested deeper than {budget.limits.max_depth}")
    return [_nested_from_wire(x, depth + 1, budget) for x in obj]


def _slice_from_wire(obj: Any) -> slice:
    if len(obj) > 3 or not all(v is None or (_is_index(v) and 0 <= v < _MAX_INDEX) for v in obj):
        raise InvalidFieldLayout(
            "a slice must be [start, stop, step] of non-negative integers or null"
        )
    s = slice(*obj)
    if s.step is not None and s.step < 1:
        raise InvalidFieldLayout("a slice's step must be positive")
    if s.start is not None and s.stop is not None and s.start > s.stop:
        raise InvalidFieldLayout("a slice must not start after its stop")
    return s


def _slices_from_wire(obj: Any) -> Any:
    if not isinstance(obj, list) or len(obj) > _MAX_SLICES:
        raise InvalidFieldLayout("flat layout slices must be a (bounded) list")
    out: list[slice | tuple[slice, ...]] = []
    for s in obj:
        if not isinstance(s, list):
            raise InvalidFieldLayout("flat layout slices must be lists")
        if s and isinstance(s[0], list):  # dim > 0: one slice per leading dimension
            if len(s) > 8 or not all(isinstance(x, list) for x in s):
                raise InvalidFieldLayout("nested flat layout slices are malformed")
            out.append(tuple(_slice_from_wire(x) for x in s))
        else:
            out.append(_slice_from_wire(s))
    return tuple(out)


def _layout_from_wire(obj: Any) -> FieldLayout:
    if not (isinstance(obj, list) and len(obj) == 2 and isinstance(obj[1], dict)):
        raise InvalidFieldLayout("a field must be [factory, kwargs]")
    factory, kw = obj
    allowed = _LAYOUT_KEYS.get(factory) if isinstance(factory, str) else None
    if allowed is None:
        raise InvalidFieldLayout("field factory must be one of batched, flat, shared")
    if not set(kw) <= allowed:
        raise InvalidFieldLayout(f"unexpected keys for a {factory} field")
    keep_on_cpu = kw.get("keep_on_cpu", False)
    if not isinstance(keep_on_cpu, bool):
        raise InvalidFieldLayout("keep_on_cpu must be a boolean")
    if factory == "batched":
        return BatchedLayout(keep_on_cpu=keep_on_cpu)
    if factory == "shared":
        batch_size = kw.get("batch_size")
        if not (_is_index(batch_size) and 1 <= batch_size <= _MAX_BATCH_SIZE):
            raise InvalidFieldLayout("shared field batch_size must be a positive integer")
        return SharedLayout(batch_size=batch_size, keep_on_cpu=keep_on_cpu)
    dim = kw.get("dim", 0)
    if not (_is_index(dim) and 0 <= dim < 8):
        raise InvalidFieldLayout("flat field dim must be a small non-negative integer")
    if "slices" not in kw:
        raise InvalidFieldLayout("flat field needs slices")
    return FlatLayout(slices=_slices_from_wire(kw["slices"]), dim=dim, keep_on_cpu=keep_on_cpu)


def _transform_from_wire(obj: Any) -> FieldTransform:
    if not (isinstance(obj, list) and len(obj) == 2 and isinstance(obj[1], dict)):
        raise InvalidTensorData("a field's transform must be [name, {param: int}]")
    name, params = obj
    if not (isinstance(name, str) and 0 < len(name) <= _MAX_TRANSFORM_NAME):
        raise InvalidTensorData("a transform name must be a short non-empty string")
    if len(params) > _MAX_TRANSFORM_PARAMS:
        raise InvalidTensorData(f"a transform takes at most {_MAX_TRANSFORM_PARAMS} params")
    for k, v in params.items():
        if not (isinstance(k, str) and 0 < len(k) <= _MAX_TRANSFORM_NAME):
            raise InvalidTensorData("transform param names must be short non-empty strings")
        if not (_is_index(v) and 0 <= v < _MAX_TRANSFORM_PARAM):
            raise InvalidTensorData("transform params must be non-negative integers")
    return FieldTransform(name=name, params=params)


def _kind(obj: Any) -> str:
    return "null" if obj is None else type(obj).__name__


def decode_item(
    buf: bytes | bytearray | memoryview, limits: DecodeLimits = DEFAULT_LIMITS
) -> KwargsItem:
    """Decode and validate one msgpack kwargs item from untrusted bytes.

    Tensors are zero-copy, read-only views into ``buf`` (they keep it alive). A field's
    declared transform is read, not applied: its ``data`` is as sent and ``transform`` names
    what the receiver must undo (or refuse). Every failure raises a WireError subclass;
    nothing else escapes for any input.
    """
    size = memoryview(buf).nbytes
    if size > limits.max_item_bytes:
        raise PayloadTooLarge(f"item of {size} bytes exceeds {limits.max_item_bytes}")
    try:
        raw = _DECODER.decode(buf)
    except WireError:
        raise
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise MalformedBody(f"kwargs item is not valid msgpack: {exc}") from None
    except RecursionError:
        raise NestingTooDeep("kwargs item nests too deeply") from None
    if not isinstance(raw, dict):
        raise InvalidTensorData(f"a kwargs item must be a map, not {_kind(raw)}")
    if len(raw) > limits.max_keys_per_item:
        raise PayloadTooLarge(f"more than {limits.max_keys_per_item} keys in one item")
    budget = _Budget(limits)
    item: KwargsItem = {}
    for key, elem in raw.items():
        if not isinstance(key, str):
            raise InvalidTensorData("kwargs item keys must be strings")
        if not (isinstance(elem, dict) and set(elem) in _ELEM_KEYS):
            raise InvalidTensorData(f"item key {key[:64]!r} must map to {{data, field}}")
        data = elem["data"]
        try:
            nested = None if data is None else _nested_from_wire(data, 0, budget)
        except RecursionError:
            raise NestingTooDeep("kwargs item nests too deeply") from None
        transform = elem.get("transform")
        item[key] = FieldElem(
            data=nested,
            layout=_layout_from_wire(elem["field"]),
            transform=None if transform is None else _transform_from_wire(transform),
        )
    return item


def b64decode_item_bytes(
    text: str | bytes | memoryview, limits: DecodeLimits = DEFAULT_LIMITS
) -> bytes:
    """Strict base64 decode of one JSON-mode item, size-checked before decoding."""
    size = len(text) // 4 * 3
    if size > limits.max_item_bytes:
        raise PayloadTooLarge(f"item of ~{size} bytes exceeds {limits.max_item_bytes}")
    try:
        return pybase64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedBase64("kwargs item is not valid base64") from None


def decode_item_b64(text: str, limits: DecodeLimits = DEFAULT_LIMITS) -> KwargsItem:
    """Decode one base64 (JSON-mode) kwargs item; see decode_item."""
    return decode_item(b64decode_item_bytes(text, limits), limits)
