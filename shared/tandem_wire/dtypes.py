"""The tensor dtype allowlist: wire names (torch spelling) to numpy dtypes, bfloat16 included."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .errors import UnsupportedDtype

__all__ = ["WIRE_DTYPES", "numpy_dtype", "wire_dtype_name"]

# Wire names follow torch's spelling (str(tensor.dtype) without "torch."), as vLLM writes them.
# Anything else is refused: the name never reaches getattr() or np.dtype() unchecked.
WIRE_DTYPES: dict[str, np.dtype] = {
    "bool": np.dtype(np.bool_),
    "uint8": np.dtype(np.uint8),
    "int8": np.dtype(np.int8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
}

_NAME_OF: dict[np.dtype, str] = {dt: name for name, dt in WIRE_DTYPES.items()}


def numpy_dtype(name: object) -> np.dtype:
    """The little-endian numpy dtype for a wire dtype name, or UnsupportedDtype."""
    if not isinstance(name, str) or name not in WIRE_DTYPES:
        shown = name if isinstance(name, str) and len(name) <= 32 else type(name).__name__
        raise UnsupportedDtype(f"unsupported tensor dtype {shown!r}")
    return WIRE_DTYPES[name]


def wire_dtype_name(dtype: np.dtype) -> str:
    """The wire name for a numpy dtype; big-endian arrays must be converted by the caller."""
    native = dtype.newbyteorder("=") if dtype.byteorder == "<" else dtype
    try:
        return _NAME_OF[native]
    except KeyError:
        raise UnsupportedDtype(f"dtype {dtype} cannot be sent on the wire") from None
