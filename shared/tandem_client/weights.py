"""New weights from a trainer to every generate node, through a shared folder.

The trainer writes the tensors as one safetensors file into the folder the generate nodes
were started with (``--weight-transfer-dir``, backend ``tandem_file``): the trainer and the
nodes must see the same filesystem (one machine, or a shared mount). Then each node is driven
through vLLM's start/update/finish calls naming that file, and the file is removed once every
node has copied it in.

Tensors are numpy arrays (``ml_dtypes`` types for bf16 and FP8) or anything with
``.detach().cpu()`` (a torch tensor, on any device: read through its bytes, bf16 and FP8
included, without this module importing torch). They are streamed into the file one at a time:
the header is laid out from each tensor's dtype and shape alone, then each tensor is brought to
host memory, written and dropped, so a trainer needs about one tensor of extra memory, not a
host copy of the model. The file format is written here directly (an 8-byte header length, a
JSON header, the raw bytes), so the client needs neither torch nor the safetensors package.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import struct
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import ml_dtypes
import numpy as np

__all__ = ["as_array", "write_safetensors"]

_TAGS = {
    np.dtype(np.float64): "F64",
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3",
    np.dtype(ml_dtypes.float8_e4m3fnuz): "F8_E4M3FNUZ",
    np.dtype(ml_dtypes.float8_e5m2): "F8_E5M2",
    np.dtype(ml_dtypes.float8_e5m2fnuz): "F8_E5M2FNUZ",
    np.dtype(np.uint64): "U64",
    np.dtype(np.int64): "I64",
    np.dtype(np.uint32): "U32",
    np.dtype(np.int32): "I32",
    np.dtype(np.uint16): "U16",
    np.dtype(np.int16): "I16",
    np.dtype(np.int8): "I8",
    np.dtype(np.uint8): "U8",
    np.dtype(np.bool_): "BOOL",
}
"""numpy dtypes -> safetensors tags (the engine reads every one of them into torch)."""

_BY_NAME: dict[str, np.dtype] = {dt.name: dt for dt in _TAGS}
"""torch's dtype names (``str(t.dtype)`` less ``torch.``) are numpy's and ml_dtypes' names."""

_THROUGH_BYTES = frozenset(dt for dt in _TAGS if dt.type.__module__ == "ml_dtypes")
"""bf16 and FP8: numpy has no type of its own for them, so torch hands them over as integers of
their width, viewed as the ml_dtypes type."""
_VIEW_AS = {1: "uint8", 2: "int16"}

_COPY_CHUNK = 64 * 1024 * 1024


def _dtype_of(tensor: Any) -> np.dtype:
    name = str(tensor.dtype).removeprefix("torch.")
    dtype = _BY_NAME.get(name)
    if dtype is None:
        raise ValueError(f"tensors of dtype {name} cannot be sent")
    return dtype


def as_array(tensor: Any) -> np.ndarray[Any, Any]:
    """A C-contiguous little-endian numpy array holding the tensor's values (a host copy only
    where the tensor is elsewhere or not contiguous)."""
    if hasattr(tensor, "detach"):  # a torch tensor, without importing torch here
        dtype = _dtype_of(tensor)
        t = tensor.detach().cpu().contiguous()
        if dtype in _THROUGH_BYTES:
            torch = sys.modules["torch"]  # loaded: a torch tensor exists
            raw = t.view(getattr(torch, _VIEW_AS[dtype.itemsize])).numpy()
            return np.asarray(raw).view(dtype)
        tensor = t.numpy()
    arr = np.ascontiguousarray(tensor)
    if arr.dtype not in _TAGS:
        raise ValueError(f"tensors of dtype {arr.dtype} cannot be sent")
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False)


def _meta(tensor: Any) -> tuple[str, list[int], int]:
    """(tag, shape, bytes) from the tensor's dtype and shape alone: nothing is copied."""
    if hasattr(tensor, "detach") or isinstance(tensor, np.ndarray):
        dtype = _dtype_of(tensor) if hasattr(tensor, "detach") else np.dtype(tensor.dtype)
        if dtype not in _TAGS:
            raise ValueError(f"tensors of dtype {dtype} cannot be sent")
        shape = [int(d) for d in tensor.shape]
    else:
        arr = as_array(tensor)  # a list or a scalar: small, made into an array here
        dtype, shape = arr.dtype, list(arr.shape)
    return _TAGS[dtype.newbyteorder("=")], shape, math.prod(shape) * dtype.itemsize


def write_safetensors(
    weights: Mapping[str, Any] | Iterable[tuple[str, Any]], folder: str | os.PathLike[str]
) -> Path:
    """Write the tensors as a new safetensors file in ``folder``; returns its path. Written
    under a temporary name and renamed, so a node never reads a partial file.

    A mapping (a ``state_dict``) is read twice: its dtypes and shapes for the header, then
    each tensor, written as it comes. Any other iterable is read once: the tensors are
    written behind a space kept for the header, and the header is put in front at the end
    (the file is rewritten in bounded chunks only if the header outgrew that space).
    """
    final = Path(folder) / f"tandem-weights-{secrets.token_hex(8)}.safetensors"
    partial = final.with_suffix(".partial")
    try:
        if isinstance(weights, Mapping):
            names = [str(n) for n in weights]
            header = _header((n, _meta(weights[n])) for n in names)
            with open(partial, "wb") as f:
                f.write(header)
                _write_tensors(f, ((n, weights[n]) for n in names), _entries_of(header))
        else:
            _write_once(weights, partial)
        partial.rename(final)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return final


def _header(entries: Iterable[tuple[str, tuple[str, list[int], int]]], pad_to: int = 0) -> bytes:
    """The 8-byte length and the JSON header, padded with spaces (which the format allows) so
    the data starts 8-byte aligned, at ``pad_to`` bytes if it fits in that."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (tag, shape, nbytes) in entries:
        header[name] = {"dtype": tag, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if len(header) == 1:
        raise ValueError("no tensors to send")
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    if pad_to - 8 > len(head):
        head += b" " * (pad_to - 8 - len(head))
    return struct.pack("<Q", len(head)) + head


def _entries_of(header: bytes) -> dict[str, tuple[str, list[int], int]]:
    table = json.loads(header[8:])
    table.pop("__metadata__")
    return {
        n: (e["dtype"], e["shape"], e["data_offsets"][1] - e["data_offsets"][0])
        for n, e in table.items()
    }


def _write_tensors(
    f: BinaryIO,
    items: Iterable[tuple[str, Any]],
    expected: Mapping[str, tuple[str, list[int], int]] | None = None,
) -> list[tuple[str, tuple[str, list[int], int]]]:
    """Each tensor's bytes, one tensor in host memory at a time; returns what was written."""
    written = []
    for name, tensor in items:
        arr = as_array(tensor)
        meta = (_TAGS[arr.dtype.newbyteorder("=")], list(arr.shape), arr.nbytes)
        if expected is not None and expected.get(name) != meta:
            raise ValueError(f"tensor {name!r} changed its dtype or shape while being written")
        f.write(arr.reshape(-1).view(np.uint8).data)
        written.append((name, meta))
        del arr  # the host copy of a device tensor goes before the next one is made
    return written


_RESERVED_HEADER = 256 * 1024
"""Space kept for the header of an update given as a one-pass iterable (about 1,500 tensors'
entries); a longer header costs one rewrite of the file."""


def _write_once(items: Iterable[tuple[str, Any]], partial: Path) -> None:
    with open(partial, "w+b") as f:
        f.seek(_RESERVED_HEADER)
        written = _write_tensors(f, ((str(n), t) for n, t in items))
        header = _header(written, pad_to=_RESERVED_HEADER)
        if len(header) == _RESERVED_HEADER:
            f.seek(0)
            f.write(header)
            return
        # The header outgrew its space: a new file, the data copied behind it in chunks.
        moved = partial.with_suffix(".moving")
        try:
            with open(moved, "wb") as out:
                out.write(header)
                f.seek(_RESERVED_HEADER)
                shutil.copyfileobj(f, out, _COPY_CHUNK)
            moved.replace(partial)
        except BaseException:
            moved.unlink(missing_ok=True)
            raise
