"""Conversion between tandem_wire kwargs items / placeholders and vLLM's own types."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np
import torch
from vllm.multimodal.inputs import (
    BaseMultiModalField,
    MultiModalBatchedField,
    MultiModalFieldElem,
    MultiModalFlatField,
    MultiModalKwargsItem,
    MultiModalSharedField,
    PlaceholderRange,
)

from tandem_wire import (
    BatchedLayout,
    FieldElem,
    FieldLayout,
    FlatLayout,
    KwargsItem,
    NestedTensors,
    SharedLayout,
)
from tandem_wire import PlaceholderRange as WirePlaceholder

__all__ = [
    "tensor_to_numpy",
    "numpy_to_tensor",
    "item_from_vllm",
    "item_to_vllm",
    "placeholder_from_vllm",
    "placeholder_to_vllm",
]

_BF16 = np.dtype(ml_dtypes.bfloat16)


def tensor_to_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor (bfloat16 as ml_dtypes.bfloat16), copying only off-CPU."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_BF16)
    return t.numpy()


def numpy_to_tensor(a: np.ndarray) -> torch.Tensor:
    """A zero-copy tensor over a numpy array (bfloat16 included)."""
    bf16 = a.dtype == _BF16
    if bf16:
        a = a.view(np.int16)
    if a.flags.writeable:
        t = torch.from_numpy(a)
    else:
        # Decoded items are read-only views into the request body; the engine only reads
        # them, so sharing the memory is safe and the copy is not worth paying.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            t = torch.from_numpy(a)
    return t.view(torch.bfloat16) if bf16 else t


def _nested_to_torch(data: NestedTensors) -> Any:
    if isinstance(data, np.ndarray):
        return numpy_to_tensor(data)
    if isinstance(data, list):
        return [_nested_to_torch(x) for x in data]
    return data


def _nested_from_torch(data: Any) -> NestedTensors:
    if isinstance(data, torch.Tensor):
        return tensor_to_numpy(data)
    if isinstance(data, (list, tuple)):
        return [_nested_from_torch(x) for x in data]
    return data  # type: ignore[no-any-return]


def _field_to_vllm(layout: FieldLayout) -> BaseMultiModalField:
    if isinstance(layout, BatchedLayout):
        return MultiModalBatchedField(keep_on_cpu=layout.keep_on_cpu)
    if isinstance(layout, FlatLayout):
        # Lists, as vLLM's own msgpack decoder builds them: flat slices, or one list per item.
        slices: list[Any] = [s if isinstance(s, slice) else list(s) for s in layout.slices]
        return MultiModalFlatField(slices=slices, dim=layout.dim, keep_on_cpu=layout.keep_on_cpu)
    return MultiModalSharedField(batch_size=layout.batch_size, keep_on_cpu=layout.keep_on_cpu)


def _field_from_vllm(field: BaseMultiModalField) -> FieldLayout:
    if isinstance(field, MultiModalBatchedField):
        return BatchedLayout(keep_on_cpu=field.keep_on_cpu)
    if isinstance(field, MultiModalFlatField):
        slices: Sequence[Any] = field.slices
        wire_slices: tuple[Any, ...] = tuple(
            s if isinstance(s, slice) else tuple(s) for s in slices
        )
        return FlatLayout(
            slices=wire_slices,
            dim=field.dim,
            keep_on_cpu=field.keep_on_cpu,
        )
    if isinstance(field, MultiModalSharedField):
        return SharedLayout(batch_size=field.batch_size, keep_on_cpu=field.keep_on_cpu)
    raise TypeError(f"unsupported vLLM field type {type(field).__name__}")


def item_to_vllm(item: KwargsItem) -> MultiModalKwargsItem:
    """A vLLM kwargs item sharing memory with the wire item's arrays (wire transforms already
    undone: ``WireTransforms.decode_item``)."""
    for key, elem in item.items():
        if elem.transform is not None:
            # A caller's bug, not input: every receiving path undoes transforms first.
            raise ValueError(f"{key!r} is still in wire transform {elem.transform.name!r}")
    return MultiModalKwargsItem(
        {
            key: MultiModalFieldElem(
                # None: the engine holds the data (vLLM documents it; its annotation omits it).
                data=_nested_to_torch(elem.data) if elem.data is not None else None,  # type: ignore[arg-type]
                field=_field_to_vllm(elem.layout),
            )
            for key, elem in item.items()
        }
    )


def item_from_vllm(item: MultiModalKwargsItem) -> KwargsItem:
    """A wire item viewing the vLLM item's CPU tensors."""
    return {
        key: FieldElem(
            data=None if elem.data is None else _nested_from_torch(elem.data),
            layout=_field_from_vllm(elem.field),
        )
        for key, elem in item.items()
    }


def placeholder_from_vllm(p: PlaceholderRange) -> WirePlaceholder:
    """The wire range; ``is_embed`` only when some token of the run gets no embedding."""
    mask = p.is_embed
    if mask is None or bool(mask.all()):
        return WirePlaceholder(offset=p.offset, length=p.length)
    return WirePlaceholder(offset=p.offset, length=p.length, is_embed=mask.tolist())


def placeholder_to_vllm(p: WirePlaceholder) -> PlaceholderRange:
    """vLLM's range, with the ``is_embed`` mask as a bool tensor when given."""
    mask = None if p.is_embed is None else torch.tensor(p.is_embed, dtype=torch.bool)
    return PlaceholderRange(offset=p.offset, length=p.length, is_embed=mask)
