"""Decode limits: the bounds checked on untrusted wire data before anything is allocated."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DecodeLimits", "DEFAULT_LIMITS"]


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """Upper bounds for one decoded kwargs item (and, for ``max_body_bytes``, one document)."""

    max_body_bytes: int = 256 * 1024 * 1024
    """Largest request document accepted, in bytes (JSON text or msgpack body)."""

    max_item_bytes: int = 128 * 1024 * 1024
    """Largest encoded kwargs item, in bytes (after base64 decoding)."""

    max_tensor_bytes: int = 128 * 1024 * 1024
    """Largest single tensor payload, in bytes."""

    max_tensors_per_item: int = 64
    """Most tensors in one kwargs item, over all its keys and nesting."""

    max_keys_per_item: int = 64
    """Most keys (``pixel_values``, ``image_grid_thw``, ...) in one kwargs item."""

    max_ndim: int = 8
    """Most dimensions of one tensor."""

    max_depth: int = 8
    """Deepest nesting of lists of tensors (and of flat-layout slices)."""


DEFAULT_LIMITS = DecodeLimits()
