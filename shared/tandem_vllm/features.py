"""Conversion between vLLM's multimodal engine inputs and wire ``features``."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from vllm.multimodal.inputs import MultiModalKwargsItem

from tandem_wire import MultiModalFeatures, encode_item

from .items import item_from_vllm, placeholder_from_vllm
from .wire_transforms import WireTransforms

__all__ = ["features_from_engine_input", "encode_vllm_item"]


def encode_vllm_item(
    item: MultiModalKwargsItem,
    transforms: WireTransforms | None = None,
    names: frozenset[str] = frozenset(),
) -> bytes:
    """Wire bytes of a vLLM kwargs item, keys sorted; fields in the wire transforms ``names``
    of ``transforms`` where those are exact (binary answers to callers that accept them).

    vLLM's processor cache hands back items with their keys in another order than a fresh
    run; sorting makes equal items equal bytes, so the generate side's content identity (and
    its caches) see one item, not two.
    """
    wire = item_from_vllm(item)
    if transforms is not None and names:
        wire = transforms.encode_item(wire, names)
    return encode_item({k: wire[k] for k in sorted(wire)})


def _metadata_item(
    item: MultiModalKwargsItem, declared: Collection[str]
) -> MultiModalKwargsItem | None:
    # What prefill still needs once embeddings arrive by encoder-cache transfer: grid sizes
    # and other CPU-side fields (upstream's mm_metadata).
    kept = {k: e for k, e in item.items() if e.field.keep_on_cpu or k in declared}
    return MultiModalKwargsItem(kept) if kept else None


def features_from_engine_input(
    engine_input: Any,
    *,
    encode: Callable[[str, MultiModalKwargsItem], bytes],
    metadata_fields_for: Callable[[str], Collection[str]] | None = None,
    with_tensors: bool = True,
) -> MultiModalFeatures[bytes | None] | None:
    """The wire features of a rendered prompt; None for text-only prompts.

    ``encode(mm_hash, item)`` produces each item's bytes, so callers can cache them by hash.
    ``with_tensors=False`` sends hashes and placeholders only (upstream's ``mm_payload="none"``).
    """
    if engine_input.get("type") != "multimodal":
        return None
    hashes: dict[str, list[str]] = {m: list(h) for m, h in engine_input["mm_hashes"].items()}
    placeholders = {
        m: [placeholder_from_vllm(p) for p in ranges]
        for m, ranges in engine_input["mm_placeholders"].items()
    }
    kwargs_data: dict[str, list[bytes | None]] | None = None
    mm_metadata: dict[str, list[bytes | None]] | None = None
    raw = engine_input.get("mm_kwargs") if with_tensors else None
    if raw:
        kwargs_data, metadata = {}, {}
        for modality, items in raw.items():
            declared = set(metadata_fields_for(modality)) if metadata_fields_for else set()
            kwargs_data[modality] = [
                None if item is None else encode(h, item)
                for h, item in zip(hashes[modality], items, strict=True)
            ]
            meta = [None if item is None else _metadata_item(item, declared) for item in items]
            metadata[modality] = [None if m is None else encode_vllm_item(m) for m in meta]
        # All modalities or none: a partial map would fail the parallel-lists check.
        has_metadata = any(x is not None for v in metadata.values() for x in v)
        mm_metadata = metadata if has_metadata else None
    return MultiModalFeatures(
        mm_hashes=hashes,
        mm_placeholders=placeholders,
        kwargs_data=kwargs_data,
        mm_metadata=mm_metadata,
    )
