"""Kwargs items as plain data: named (nested) numpy tensors plus the field layout of each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

import numpy as np

__all__ = [
    "BatchedLayout",
    "FlatLayout",
    "SharedLayout",
    "FieldLayout",
    "FieldElem",
    "FieldTransform",
    "KwargsItem",
    "NestedTensors",
    "FlatSlices",
]

NestedTensors: TypeAlias = "np.ndarray | int | float | list[NestedTensors]"
"""A tensor, a scalar, or a list of them (vLLM's ``NestedTensors``, with numpy for torch)."""

FlatSlices: TypeAlias = "tuple[slice, ...] | tuple[tuple[slice, ...], ...]"
"""Per item, a slice along ``dim`` (dim 0) or a tuple of slices, one per leading dimension."""


@dataclass(frozen=True, slots=True)
class BatchedLayout:
    """Each item contributes one entry along a new leading batch dimension (vLLM "batched")."""

    keep_on_cpu: bool = False
    """Whether the engine keeps this field on the CPU (e.g. grid sizes for M-RoPE)."""


@dataclass(frozen=True, slots=True)
class FlatLayout:
    """Items are concatenated along ``dim``; ``slices`` cut them apart again (vLLM "flat")."""

    slices: FlatSlices
    """Where each item's data lies in the concatenated tensor."""

    dim: int = 0
    """The dimension along which items are concatenated."""

    keep_on_cpu: bool = False
    """Whether the engine keeps this field on the CPU."""


@dataclass(frozen=True, slots=True)
class SharedLayout:
    """One tensor shared by ``batch_size`` items (vLLM "shared")."""

    batch_size: int
    """How many items share this data."""

    keep_on_cpu: bool = False
    """Whether the engine keeps this field on the CPU."""


FieldLayout: TypeAlias = BatchedLayout | FlatLayout | SharedLayout


@dataclass(frozen=True, slots=True)
class FieldTransform:
    """A model-aware transform its sender applied to a field's data, to be undone on receipt.

    Binary wire only, and only when the receiver asked for it: ``data`` is then not the
    processor's tensor but the transform's smaller form of it (e.g. Qwen-VL patches with their
    identical temporal copies sent once). The transforms themselves are model code and live
    with the vLLM adapters (``tandem_vllm.wire_transforms``); this is only their declaration.
    """

    name: str
    """The transform and its version, e.g. ``qwen_vl.temporal_dedup/v1``."""

    params: dict[str, int]
    """What undoing it needs (factors, sizes), each checked by the receiver against its model."""


@dataclass(slots=True)
class FieldElem:
    """One keyword argument of one item: its data and how the engine batches it."""

    data: NestedTensors | None
    """The tensor(s); None when the sender omitted the data (the receiver holds it)."""

    layout: FieldLayout
    """How this field is combined with other items' (batched / flat / shared)."""

    transform: FieldTransform | None = None
    """The wire transform ``data`` is in; None (always, in upstream's JSON) means ``data`` is
    the processor's tensor itself."""


KwargsItem: TypeAlias = dict[str, FieldElem]
"""One multimodal item's processor outputs by keyword (``pixel_values``, ``image_grid_thw``...)."""
