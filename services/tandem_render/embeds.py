"""Precomputed-embedding content parts: decode their safetensors, check them against the model.

A caller with its own vision encoder sends ``{"type": "image_embeds", "image_embeds": ...}``
instead of pixels. The tensors travel as safetensors (base64 text in JSON, raw bytes in a
msgpack body), never pickle or ``torch.load``; everything vLLM's embedding path would trust
(hidden size, rows against the grid, the grid against the merge size) is checked here, so a
bad part is a typed 400 before vLLM sees it (vLLM's own parser checks neither for Qwen-VL).
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import pybase64

from tandem_wire import MalformedBase64, PayloadTooLarge, decode_safetensors

from .errors import InvalidEmbeds

__all__ = ["EmbedsSpec", "decode_embeds_part"]

EMBED_DTYPES = frozenset({np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)})
"""What an embedding may be sent in; the engine casts it to its own dtype, as vLLM does."""

_GRID_DTYPES = frozenset({np.dtype(np.int64), np.dtype(np.int32)})


@dataclass(frozen=True)
class EmbedsSpec:
    """How this model takes one precomputed embedding of a media item (Qwen-VL family)."""

    values_key: str
    """The embedding tensor's name, e.g. ``image_embeds``: ``(rows, hidden_size)``."""

    grid_key: str
    """The grid tensor's name, e.g. ``image_grid_thw``: ``(t, h, w)`` patches, which sizes the
    placeholder run (``t * h * w / merge_size**2`` tokens, one per row)."""

    hidden_size: int
    """The language model's input embedding size."""

    merge_size: int
    """Patches merged per token along each of h and w."""

    max_rows: int
    """Most rows one item may have: the context length (each row takes one token)."""

    @property
    def max_bytes(self) -> int:
        """Largest safetensors file of one part: ``max_rows`` float32 rows, plus headers."""
        return self.max_rows * self.hidden_size * 4 + 64 * 1024


def decode_embeds_part(payload: Any, spec: EmbedsSpec, where: str) -> dict[str, np.ndarray]:
    """``{values_key: (rows, hidden) float, grid_key: (3,) int64}`` from a content part's value:
    one safetensors file holding both tensors by name, or upstream's dict form ``{name: file}``
    with one tensor per file (the grid may also be a JSON list of integers)."""
    if isinstance(payload, dict):
        if set(payload) != {spec.values_key, spec.grid_key}:
            raise InvalidEmbeds(
                f"{where}: takes exactly {spec.values_key!r} and {spec.grid_key!r}, got "
                f"{sorted(str(k)[:40] for k in payload)[:4]}"
            )
        tensors = {k: _one_tensor(v, spec, f"{where}.{k}") for k, v in payload.items()}
    else:
        tensors = _file(payload, spec, where)
        if set(tensors) != {spec.values_key, spec.grid_key}:
            raise InvalidEmbeds(
                f"{where}: the file must hold exactly the tensors {spec.values_key!r} and "
                f"{spec.grid_key!r}, got {sorted(n[:40] for n in tensors)[:4]}"
            )
    return _checked(tensors[spec.values_key], tensors[spec.grid_key], spec, where)


def _one_tensor(value: Any, spec: EmbedsSpec, where: str) -> np.ndarray:
    if isinstance(value, list):  # metadata as JSON, as upstream allows for the grid
        if not (0 < len(value) <= 8 and all(_is_small_int(v) for v in value)):
            raise InvalidEmbeds(f"{where}: a JSON list must hold 1 to 8 integers in [0, 2**31)")
        return np.array(value, np.int64)
    tensors = _file(value, spec, where)
    if len(tensors) != 1:
        raise InvalidEmbeds(f"{where}: the file must hold exactly one tensor, not {len(tensors)}")
    return next(iter(tensors.values()))


def _is_small_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31


def _file(value: Any, spec: EmbedsSpec, where: str) -> dict[str, np.ndarray]:
    if isinstance(value, str):
        if len(value) // 4 * 3 > spec.max_bytes:
            raise PayloadTooLarge(f"{where}: more than {spec.max_bytes} bytes of embeddings")
        try:
            value = pybase64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise MalformedBase64(f"{where}: not valid base64") from None
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise InvalidEmbeds(
            f"{where}: expected a safetensors file (base64 text, or bytes in a msgpack body)"
        )
    if memoryview(value).nbytes > spec.max_bytes:
        raise PayloadTooLarge(f"{where}: more than {spec.max_bytes} bytes of embeddings")
    return decode_safetensors(value, max_tensors=4, max_tensor_bytes=spec.max_bytes)


def _checked(
    values: np.ndarray, grid: np.ndarray, spec: EmbedsSpec, where: str
) -> dict[str, np.ndarray]:
    if values.dtype not in EMBED_DTYPES:
        raise InvalidEmbeds(
            f"{where}: {spec.values_key} is {values.dtype}; send float32, float16 or bfloat16"
        )
    if values.ndim != 2 or values.shape[1] != spec.hidden_size or values.shape[0] == 0:
        raise InvalidEmbeds(
            f"{where}: {spec.values_key} has shape {list(values.shape)}; this model takes "
            f"(rows, {spec.hidden_size})"
        )
    if values.shape[0] > spec.max_rows:
        raise InvalidEmbeds(
            f"{where}: {values.shape[0]} rows are more than the context ({spec.max_rows} tokens)"
        )
    if grid.dtype not in _GRID_DTYPES or grid.shape not in ((3,), (1, 3)):
        raise InvalidEmbeds(
            f"{where}: {spec.grid_key} must be 3 integers (t, h, w), "
            f"not {grid.dtype}{list(grid.shape)}"
        )
    t, h, w = (int(x) for x in grid.reshape(3))
    m = spec.merge_size
    if min(t, h, w) < 1 or h % m or w % m:
        raise InvalidEmbeds(
            f"{where}: {spec.grid_key} {[t, h, w]} must be positive, with h and w multiples of "
            f"the merge size {m}"
        )
    if t * h * w != values.shape[0] * m * m:
        raise InvalidEmbeds(
            f"{where}: {spec.grid_key} {[t, h, w]} takes {t * h * w // (m * m)} rows of "
            f"embeddings, but {values.shape[0]} were sent"
        )
    return {spec.values_key: values, spec.grid_key: np.array([t, h, w], np.int64)}
