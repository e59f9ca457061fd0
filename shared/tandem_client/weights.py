"""New weights from a trainer to every generate node, through a shared folder.

The trainer writes the tensors as one safetensors file into the folder the generate nodes
were started with (``--weight-transfer-dir``, backend ``tandem_file``): the trainer and the
nodes must see the same filesystem (one machine, or a shared mount). Then each node is driven
through vLLM's start/update/finish calls naming that file, and the file is removed once every
node has copied it in.

Tensors are numpy arrays (``ml_dtypes.bfloat16`` for bf16) or anything with
``.detach().cpu()`` (a torch tensor: read through its bytes, bf16 included, without this
module importing torch). The file format is written here directly (an 8-byte header length,
a JSON header, the raw bytes), so the client needs neither torch nor the safetensors package.
"""

from __future__ import annotations

import json
import os
import secrets
import struct
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["as_array", "write_safetensors"]

_TAGS = {
    np.dtype(np.float64): "F64",
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(np.int64): "I64",
    np.dtype(np.int32): "I32",
    np.dtype(np.int16): "I16",
    np.dtype(np.int8): "I8",
    np.dtype(np.uint8): "U8",
    np.dtype(np.bool_): "BOOL",
}


def as_array(tensor: Any) -> np.ndarray[Any, Any]:
    """A C-contiguous little-endian numpy array holding the tensor's values."""
    if hasattr(tensor, "detach"):  # a torch tensor, without importing torch here
        t = tensor.detach().cpu().contiguous()
        if str(t.dtype) == "torch.bfloat16":
            torch = sys.modules["torch"]  # loaded: a torch tensor exists
            return np.asarray(t.view(torch.int16).numpy()).view(ml_dtypes.bfloat16)
        tensor = t.numpy()
    arr = np.ascontiguousarray(tensor)
    if arr.dtype not in _TAGS:
        raise ValueError(f"tensors of dtype {arr.dtype} cannot be sent")
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False)


def write_safetensors(
    weights: Mapping[str, Any] | Iterable[tuple[str, Any]], folder: str | os.PathLike[str]
) -> Path:
    """Write the tensors as a new safetensors file in ``folder``; returns its path. Written
    under a temporary name and renamed, so a node never reads a partial file."""
    items = weights.items() if isinstance(weights, Mapping) else weights
    arrays = [(str(name), as_array(t)) for name, t in items]
    if not arrays:
        raise ValueError("no tensors to send")
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, arr in arrays:
        header[name] = {
            "dtype": _TAGS[arr.dtype],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned
    final = Path(folder) / f"tandem-weights-{secrets.token_hex(8)}.safetensors"
    partial = final.with_suffix(".partial")
    with open(partial, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for _, arr in arrays:
            f.write(arr.reshape(-1).view(np.uint8).data)
    partial.rename(final)
    return final
