"""What the start-up probe learns from one processed item, and the request-body bound it gives
(pure: synthetic items in the layouts vLLM's processors produce, no engine)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from services.tandem_generate.model_spec import ModelSpec, modality_spec
from tandem_wire import BatchedLayout, FieldElem, FlatLayout, PlaceholderRange, SharedLayout

CONTEXT = 4096
IMAGE, START, END = 1014, 1012, 1013
TILE_TOKENS = 64
TILE_BYTES = 3 * 224 * 224 * 2  # one bf16 224-px tile
BF16 = np.dtype(ml_dtypes.bfloat16)


def tiled_spec(tiles: int) -> ModelSpec:
    """An InternVL-style image (vLLM's ``flat_from_sizes`` over ``image_num_patches``): its
    tiles, 64 embedding tokens each, between non-embedding ``<img>`` ``</img>`` tokens."""
    item = {
        "pixel_values_flat": FieldElem(
            np.zeros((tiles, 3, 224, 224), BF16), FlatLayout(slices=(slice(0, tiles),))
        ),
        "image_num_patches": FieldElem(np.array(tiles), BatchedLayout(keep_on_cpu=True)),
        "image_token_id": FieldElem(np.array(IMAGE), SharedLayout(1, keep_on_cpu=True)),
    }
    run = [START] + [IMAGE] * (tiles * TILE_TOKENS) + [END]
    mask = [False] + [True] * (tiles * TILE_TOKENS) + [False]
    placeholder = PlaceholderRange(offset=2, length=len(run), is_embed=mask)
    spec = modality_spec(item, [1, 2, *run, 3], [placeholder])
    return ModelSpec(modalities={"image": spec})


@pytest.mark.parametrize("tiles", [1, 7])
@pytest.mark.parametrize("max_items", [2, 32])
def test_a_tiled_image_bound_holds_the_most_tiles_the_context_admits(tiles, max_items):
    # 4096 tokens hold 64 tiles, however many the probe's image had and however many items
    # a prompt may carry: as base64 JSON, plus small change.
    most = CONTEXT // TILE_TOKENS * TILE_BYTES * 4 // 3
    bound = tiled_spec(tiles).max_request_bytes(CONTEXT, max_items)
    assert most < bound < most + 2 * 2**20


def test_the_tile_field_is_tied_to_tokens_but_not_checked_against_them():
    spec = tiled_spec(7).modalities["image"]
    tiles = spec.fields["pixel_values_flat"]
    assert (tiles.cells_per_row, tiles.rows_per_cell) == (TILE_TOKENS, None)
    assert (spec.grid_key, spec.grid_cells_per_token) == (None, None)
    assert spec.fields["image_num_patches"].cells_per_row is None


def test_a_grid_item_keeps_its_exact_rows_per_cell():
    # Qwen2-VL-style: a (1, 4, 6) grid of 1176-value patches, 4 cells per token.
    item = {
        "pixel_values": FieldElem(np.zeros((24, 1176), np.uint8), FlatLayout((slice(0, 24),))),
        "image_grid_thw": FieldElem(np.array([[1, 4, 6]]), BatchedLayout(keep_on_cpu=True)),
    }
    spec = modality_spec(item, [7, *[9] * 6, 8], [PlaceholderRange(offset=1, length=6)])
    assert (spec.grid_key, spec.grid_cells_per_token) == ("image_grid_thw", 4)
    assert spec.fields["pixel_values"].rows_per_cell == 1
    pixels = CONTEXT * 4 * 1176 * 4 // 3
    bound = ModelSpec(modalities={"image": spec}).max_request_bytes(CONTEXT, 32)
    assert pixels < bound < pixels + 2 * 2**20
