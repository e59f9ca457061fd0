"""What this model's processor produces, learned once at start-up (never on the request path).

A synthetic image, video and audio clip (those the model takes) go through vLLM's processor
when the service starts; the items it yields fix, per modality, the keys, dtypes, ranks and
field layouts a caller's item must have, the placeholder token, and how a grid maps to a token
count. The processor also fixes which wire transforms items may arrive in, and the model's item
rule where it has one (``tandem_vllm.item_rules``: e.g. an audio window's shape and token
count).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tandem_vllm.item_rules import ItemRule
from tandem_vllm.wire_transforms import WireTransforms
from tandem_wire import BatchedLayout, FieldLayout, FlatLayout, SharedLayout

__all__ = ["FieldSpec", "ModalitySpec", "ModelSpec"]


@dataclass(frozen=True)
class FieldSpec:
    """One key of an item as the processor declares it."""

    kind: type[FieldLayout]
    keep_on_cpu: bool
    dtype: np.dtype
    shape: tuple[int, ...]
    flat_dim: int = 0
    rows_per_cell: int | None = None
    """For a flat field: rows along ``flat_dim`` per cell, a grid cell (patches) or, for a
    model with no grid, an embedding token."""
    cells_per_row: int | None = None
    """For a flat field: cells per row (embeddings: one row per token; tiles: a tile's tokens)."""


@dataclass(frozen=True)
class ModalitySpec:
    """What items of one modality look like for this model."""

    fields: dict[str, FieldSpec]
    """The tensor-valued keys."""
    keys: frozenset[str]
    """Every key of the item, tensor-valued or not."""
    placeholder_token: int
    grid_key: str | None = None
    """A ``*_grid_thw``-style key whose product over ``tokens_per_grid_cell`` is the number of
    embedding tokens (Qwen-VL family); None when the model has no such key."""
    grid_cells_per_token: int | None = None
    embeds_key: str | None = None
    """For the embedding form of a modality: the key holding the embeddings, which may arrive
    in any float dtype the engine casts from (``EMBED_DTYPES``) and is cast to the model's."""
    rule: ItemRule | None = None
    """The model's own rule for these items (shapes the encoder needs, embedding tokens)."""


@dataclass
class ModelSpec:
    """Per modality specs, plus what the prompt side needs."""

    modalities: dict[str, ModalitySpec] = field(default_factory=dict)
    unlearned: dict[str, str] = field(default_factory=dict)
    """Modalities the model takes whose probe failed at start-up -> the error's type name."""
    wire_transforms: WireTransforms = field(default_factory=WireTransforms)
    """The wire transforms this model's processor has (undone before items are checked)."""
    embeds: dict[str, ModalitySpec] = field(default_factory=dict)
    """Per modality, items carrying precomputed embeddings instead of pixels (vLLM's
    ``enable_mm_embeds`` path: the engine skips the vision tower for them)."""

    def max_request_bytes(self, max_model_len: int, max_items: int) -> int:
        """The largest generate request this model can take, as JSON (base64 items).

        Every embedding token of every item sits in the context, so all items together hold
        at most ``max_model_len`` tokens' worth of cells (grid cells, or embedding tokens for
        a model with no grid), and so of the flat fields' rows (patches, tiles, crops); fields
        that do not grow with the cells (grids, sizes) cost what the probe's item did, per item.
        """
        tokens = max_model_len * 12  # "123456, " per token id, JSON
        items = 0
        for spec in [*self.modalities.values(), *self.embeds.values()]:
            per_token = spec.grid_cells_per_token or 1
            grown, fixed = 0.0, 0
            for key, f in spec.fields.items():
                itemsize = max(f.dtype.itemsize, 4) if key == spec.embeds_key else f.dtype.itemsize
                row = itemsize * math.prod(n for i, n in enumerate(f.shape) if i != f.flat_dim)
                if f.rows_per_cell:
                    grown += row * f.rows_per_cell
                elif f.cells_per_row:
                    grown += row / f.cells_per_row
                else:
                    fixed += row * (f.shape[f.flat_dim] if f.shape else 1)
            total = int(max_model_len * per_token * grown) + max_items * (fixed + 4096)
            items = max(items, total)
        return tokens + items * 4 // 3 + (1 << 20)  # base64, and a MiB for everything else


def grid_cells(grid: Any) -> int:
    """Patches in a grid tensor such as ``image_grid_thw`` (t * h * w)."""
    return int(math.prod(int(x) for x in np.asarray(grid).reshape(-1)))


def layout_kind(layout: Any) -> type[FieldLayout]:
    for kind in (BatchedLayout, FlatLayout, SharedLayout):
        if isinstance(layout, kind):
            return kind
    raise TypeError(f"unknown layout {type(layout).__name__}")


def modality_spec(
    wire_item: dict[str, Any], token_ids: list[int], ranges: list[Any]
) -> ModalitySpec:
    """Derive the spec from one processed item, its prompt and its placeholder range."""
    fields = {}
    for key, elem in wire_item.items():
        data = elem.data
        if not isinstance(data, np.ndarray):
            continue
        fields[key] = FieldSpec(
            kind=layout_kind(elem.layout),
            keep_on_cpu=elem.layout.keep_on_cpu,
            dtype=data.dtype,
            shape=tuple(data.shape),
            flat_dim=elem.layout.dim if isinstance(elem.layout, FlatLayout) else 0,
        )
    (rng,) = ranges
    window = token_ids[rng.offset : rng.offset + rng.length]
    mask = rng.is_embed if rng.is_embed is not None else [True] * rng.length
    embed_tokens = [t for t, m in zip(window, mask, strict=True) if m]
    placeholder = embed_tokens[0]
    grid_key = next((k for k in fields if k.endswith("grid_thw")), None)
    per_token = None
    cells = len(embed_tokens)
    if grid_key is not None:
        grid = grid_cells(wire_item[grid_key].data)
        if grid % cells == 0:
            cells, per_token = grid, grid // cells
    for key, f in fields.items():
        rows = f.shape[f.flat_dim] if f.kind is FlatLayout and f.shape else 0
        fields[key] = _tie_rows(f, rows, cells, exact=per_token is not None)
    return ModalitySpec(
        fields=fields,
        keys=frozenset(wire_item),
        placeholder_token=placeholder,
        grid_key=grid_key if per_token else None,
        grid_cells_per_token=per_token,
    )


def _tie_rows(f: FieldSpec, rows: int, cells: int, *, exact: bool) -> FieldSpec:
    """``f`` with its flat rows tied to the probe item's ``cells``.

    vLLM's flat layout is for fields whose rows vary per item (patches of a grid, an
    InternVL-style image's tiles, crops, audio chunks), and those rows grow with the tokens
    the item puts in the context. A grid's cells fix the rows exactly (items are checked
    against them); with no grid the cells are the embedding tokens and the tie only bounds
    request bytes, so it rounds toward more rows per token.
    """
    if not rows:
        return f
    if rows % cells == 0 or (not exact and rows > cells):
        return replace(f, rows_per_cell=-(-rows // cells))
    if cells % rows == 0 or not exact:
        return replace(f, cells_per_row=cells // rows)
    return f
