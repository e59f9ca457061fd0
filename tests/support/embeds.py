"""Precomputed-embedding content parts for tests: seeded tensors, in each form render takes."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pybase64

from tandem_wire import encode_safetensors

BF16 = np.dtype(ml_dtypes.bfloat16)


def random_embeds(rows: int, hidden: int = 128, seed: int = 0, dtype: Any = BF16) -> np.ndarray:
    """Seeded embeddings of a plausible scale (the tiny model's token embeddings are ~0.02)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, hidden)) * 0.05).astype(np.float32).astype(dtype)


def embeds_part(
    values: np.ndarray, grid: Any, *, form: str = "file", binary: bool = False
) -> dict[str, Any]:
    """An ``image_embeds`` part: ``form="file"`` one safetensors file with both tensors,
    ``"dict"`` upstream's dict form (one file per tensor, the grid as a JSON list); base64
    text unless ``binary`` (raw bytes, for msgpack bodies)."""

    def wrap(blob: bytes) -> Any:
        return blob if binary else pybase64.b64encode(blob).decode("ascii")

    grid = np.asarray(grid, np.int64)
    if form == "file":
        payload: Any = wrap(encode_safetensors({"image_embeds": values, "image_grid_thw": grid}))
    else:
        payload = {
            "image_embeds": wrap(encode_safetensors({"embeds": values})),
            "image_grid_thw": grid.reshape(-1).tolist(),
        }
    return {"type": "image_embeds", "image_embeds": payload}


def embeds_chat(model: str, *parts: dict[str, Any], text: str = "Describe.", **extra: Any) -> dict:
    """A chat request whose user turn holds these parts, then the text."""
    content = [*parts, {"type": "text", "text": text}]
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}
