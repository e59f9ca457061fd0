"""What a request's media will cost once decoded, judged from their headers before any decode."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tandem_http import PromptTooLong

from .errors import MediaTooLarge

__all__ = [
    "BUDGET_FLAG",
    "RGB_BYTES",
    "MAX_DEFAULT_REQUEST_BYTES",
    "MediaSize",
    "check_context_fit",
    "check_decoded_budget",
    "default_request_budget",
]

BUDGET_FLAG = "--max-decoded-request-bytes"
RGB_BYTES = 3
"""Bytes per decoded pixel: vLLM's image and video IO hand the processor RGB."""
MAX_DEFAULT_REQUEST_BYTES = 1024 * 1024 * 1024
"""The derived default never exceeds this: the processor's working copies multiply it
(measured: a worker grew ~3.4 bytes per decoded byte), and workers share the machine."""


@dataclass(frozen=True)
class MediaSize:
    """One media item as its header states it."""

    modality: str
    decoded_bytes: int
    """What decoding it holds: RGB pixels (every sampled frame), or float32 audio samples."""
    width: int = 0
    """Image width in pixels; 0 for other modalities."""
    height: int = 0


def default_request_budget(
    model_max_pixels: int | None, max_images: int, max_image_pixels: int
) -> int:
    """The model's own largest image (its ``max_pixels``) times the images a prompt may hold,
    in RGB bytes, capped at ``MAX_DEFAULT_REQUEST_BYTES``; never below one image at the
    per-image limit, so any single image admitted alone is admitted by the budget too."""
    one_image = max_image_pixels * RGB_BYTES
    derived = (model_max_pixels or max_image_pixels) * max(max_images, 1) * RGB_BYTES
    return max(one_image, min(derived, MAX_DEFAULT_REQUEST_BYTES))


def check_decoded_budget(sizes: Sequence[MediaSize], budget: int) -> None:
    """Refuse a request whose media, all decoded at once, would take more than ``budget``."""
    total = sum(s.decoded_bytes for s in sizes)
    if total > budget:
        raise MediaTooLarge(
            f"the request's {len(sizes)} media item(s) decode to {total} bytes, more than the "
            f"per-request budget of {budget} bytes ({BUDGET_FLAG})"
        )


ImageTokens = Callable[[int, int, Mapping[str, Any]], "int | None"]
"""(width, height, request mm_processor_kwargs) -> placeholder tokens (None: no known rule)."""


def check_context_fit(
    sizes: Sequence[MediaSize],
    image_tokens: ImageTokens,
    mm_kwargs: Mapping[str, Any],
    max_model_len: int,
) -> None:
    """Refuse, as the context check would after decoding, images whose placeholder tokens
    alone (the processor's own resize rule, from header sizes) exceed the context."""
    total = 0
    images = 0
    for s in sizes:
        if s.modality != "image":
            continue
        tokens = image_tokens(s.width, s.height, mm_kwargs)
        if tokens is None:
            return
        total += tokens
        images += 1
    if total > max_model_len:
        # Worded as vLLM's own refusal ("context length"), so it maps to the same type.
        raise PromptTooLong(
            f"the request's {images} image(s) alone take {total} tokens, more than the "
            f"model's context length ({max_model_len})"
        )
