"""Checked wire inputs -> the prompt vLLM's engine takes (token ids, items, hashes, ranges)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vllm.inputs import mm_input
from vllm.multimodal.inputs import MultiModalKwargsItem, MultiModalKwargsItems

from tandem_wire import PlaceholderRange as WirePlaceholder

from .items import placeholder_to_vllm

__all__ = ["engine_prompt"]


def engine_prompt(
    token_ids: list[int],
    items: dict[str, list[MultiModalKwargsItem]],
    hashes: dict[str, list[str]],
    placeholders: Mapping[str, Sequence[WirePlaceholder]],
    *,
    cache_salt: str | None = None,
) -> Any:
    """vLLM's engine prompt: a multimodal input carrying processed items (so the engine's
    input processor skips the HF processor), or a token prompt when there are no items.

    ``hashes`` are the identities the engine caches items under; ``placeholders`` are
    parallel to ``items`` per modality.
    """
    if not items:
        prompt: dict[str, Any] = {"type": "token", "prompt_token_ids": token_ids}
        if cache_salt is not None:
            prompt["cache_salt"] = cache_salt
        return prompt
    return mm_input(
        prompt_token_ids=token_ids,
        mm_kwargs=MultiModalKwargsItems(items),
        mm_hashes=hashes,
        mm_placeholders={m: [placeholder_to_vllm(p) for p in ps] for m, ps in placeholders.items()},
        cache_salt=cache_salt,
    )
