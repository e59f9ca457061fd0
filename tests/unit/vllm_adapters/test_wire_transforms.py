"""Model-aware wire transforms: exact (bitwise) on any still-image patch tensor and on the real
Qwen-VL processors' output, never applied where inexact, preferred in order, and refusing lying
declarations; row deltas make photographs compress smaller."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem_vllm.wire_transforms import (
    PatchRowDelta,
    TemporalDedup,
    TransformMismatch,
    WireTransforms,
    wire_transforms_for,
)
from tandem_wire import (
    FieldElem,
    FieldTransform,
    FlatLayout,
    UnsupportedWireTransform,
    compress_zstd,
    decode_item,
    encode_item,
)

pytestmark = pytest.mark.vllm

DEDUP = TemporalDedup(temporal_patch_size=2, patch_size=14)
NAME = TemporalDedup.name
DELTA = PatchRowDelta(temporal_patch_size=2, patch_size=14)
DELTA_NAME = PatchRowDelta.name
DTYPES = [np.uint8, np.float32, np.float16, np.dtype(ml_dtypes.bfloat16)]


def still_patches(rng, n, channels=3, t=2, patch=14, dtype=np.uint8):
    """Rows (channels, t, patch * patch) whose t copies are identical, as for a still image."""
    frame = rng.integers(0, 256, (n, channels, 1, patch * patch)).astype(dtype)
    return np.ascontiguousarray(np.repeat(frame, t, axis=2)).reshape(n, channels * t * patch**2)


def bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


PATCH_TENSORS = {
    "seed": st.integers(0, 2**32 - 1),
    "n": st.integers(0, 40),
    "channels": st.integers(1, 4),
    "t": st.integers(2, 4),
    "patch": st.integers(1, 16),
}
"""Patch tensors of any shape a Qwen-VL-like processor could make."""


@settings(max_examples=60, deadline=None)
@given(**PATCH_TENSORS, dtype=st.sampled_from(DTYPES))
def test_still_patches_round_trip_bitwise_at_1_over_t_the_bytes(seed, n, channels, t, patch, dtype):
    rng = np.random.default_rng(seed)
    data = still_patches(rng, n, channels, t, patch, dtype)
    transform = TemporalDedup(temporal_patch_size=t, patch_size=patch)
    encoded = transform.encode(data)
    assert encoded is not None
    sent, params = encoded
    assert params == {"channels": channels, "temporal_patch_size": t}
    assert sent.nbytes * t == data.nbytes and sent.shape == (n, channels * patch * patch)
    back = transform.decode(sent, params)
    assert back.dtype == data.dtype and back.shape == data.shape
    assert bits(back) == bits(data)
    assert transform.rebuilt_nbytes(sent, params) == back.nbytes  # charged before it is made


def test_float_copies_are_compared_as_bits():
    rng = np.random.default_rng(0)
    data = still_patches(rng, 4, dtype=np.float32)
    view = data.reshape(4, 3, 2, 196)
    view[0, 0, 0, 0], view[0, 0, 1, 0] = 0.0, -0.0  # equal as floats, not as bits
    assert DEDUP.encode(data) is None
    view[0, 0, 0, 0] = view[0, 0, 1, 0] = np.nan  # unequal as floats, equal as bits
    sent, params = DEDUP.encode(data)
    assert bits(DEDUP.decode(sent, params)) == bits(data)


@pytest.mark.parametrize("where", [(0, 0, 1, 0), (7, 2, 1, 195), (3, 1, 1, 100)])
def test_one_differing_byte_anywhere_keeps_the_tensor_as_it_is(where):
    data = still_patches(np.random.default_rng(1), 8)
    data.reshape(8, 3, 2, 196)[where] ^= 1
    assert DEDUP.encode(data) is None


@pytest.mark.parametrize("shape", [(1176,), (4, 1176, 1), (4, 1175), (4, 0), (4, 196)])
def test_tensors_of_another_layout_are_left_alone(shape):
    assert DEDUP.encode(np.zeros(shape, np.uint8)) is None


def test_non_contiguous_input_encodes_from_its_values():
    data = still_patches(np.random.default_rng(2), 6)
    strided = np.asfortranarray(data)
    sent, params = DEDUP.encode(strided)
    assert bits(DEDUP.decode(sent, params)) == bits(data)


@pytest.mark.parametrize(
    ("shape", "params"),
    [
        ((4, 588), {"channels": 3, "temporal_patch_size": 3}),  # another factor
        ((4, 588), {"channels": 3, "temporal_patch_size": 1}),
        ((4, 588), {"channels": 2, "temporal_patch_size": 2}),  # rows of another width
        ((4, 588), {"channels": 0, "temporal_patch_size": 2}),
        ((4, 588), {"channels": 3}),
        ((4, 588), {"channels": 3, "temporal_patch_size": 2, "extra": 1}),
        ((4, 3, 196), {"channels": 3, "temporal_patch_size": 2}),
        ((588,), {"channels": 3, "temporal_patch_size": 2}),
    ],
)
def test_lying_declarations_are_refused(shape, params):
    with pytest.raises(TransformMismatch):
        DEDUP.decode(np.zeros(shape, np.uint8), params)


def test_decode_allocates_no_more_than_the_model_factor():
    # The factor is the model's, never the sender's: a huge declared factor is refused first.
    with pytest.raises(TransformMismatch):
        DEDUP.decode(np.zeros((4, 588), np.uint8), {"channels": 3, "temporal_patch_size": 2**30})


def item(data, transform=None):
    return {
        "pixel_values": FieldElem(data, FlatLayout(slices=(slice(0, len(data)),)), transform),
        "image_grid_thw": FieldElem(np.array([1, 2, 2]), FlatLayout(slices=(slice(0, 3),))),
    }


SET = WireTransforms({"pixel_values": (DEDUP,)})
BOTH = WireTransforms({"pixel_values": (DELTA, DEDUP)})


def test_item_round_trip_through_the_codec():
    data = still_patches(np.random.default_rng(3), 16)
    wire = SET.encode_item(item(data), frozenset({NAME}))
    assert wire["pixel_values"].transform == FieldTransform(
        NAME, {"channels": 3, "temporal_patch_size": 2}
    )
    received = decode_item(encode_item(wire))
    back, rebuilt = SET.decode_item(received)
    assert bits(back["pixel_values"].data) == bits(data) and rebuilt == data.nbytes
    assert back["pixel_values"].transform is None
    assert back["image_grid_thw"] is received["image_grid_thw"]


def test_nothing_is_applied_unless_asked():
    data = still_patches(np.random.default_rng(4), 4)
    assert SET.encode_item(item(data), frozenset())["pixel_values"].transform is None
    assert SET.encode_item(item(data), frozenset({"other/v1"}))["pixel_values"].transform is None
    assert SET.accepted(frozenset({"*"})) == {NAME} == SET.accepted(frozenset({NAME, "x/v1"}))
    assert SET.accepted(frozenset({"x/v1"})) == frozenset()


@pytest.mark.parametrize(
    ("key", "name"),
    [("pixel_values", "qwen_vl.temporal_dedup/v9"), ("image_grid_thw", NAME)],
)
def test_a_transform_the_model_has_not_for_that_key_is_unsupported(key, name):
    data = still_patches(np.random.default_rng(5), 4)
    it = item(data)
    it[key] = FieldElem(it[key].data, it[key].layout, FieldTransform(name, {}))
    with pytest.raises(UnsupportedWireTransform):
        SET.decode_item(it)
    with pytest.raises(UnsupportedWireTransform):
        WireTransforms().decode_item(it)  # a model with no transforms at all


def test_a_transformed_field_must_hold_one_tensor():
    it = item(np.zeros((4, 588), np.uint8))
    layout = it["pixel_values"].layout
    it["pixel_values"] = FieldElem([np.zeros(3)], layout, FieldTransform(NAME, {}))
    with pytest.raises(TransformMismatch):
        SET.decode_item(it)


# -- the real processors ------------------------------------------------------------------


def processed(model_config, modality, sample):
    from vllm.multimodal import MULTIMODAL_REGISTRY

    from tandem_generate.engine import process_one
    from tandem_vllm.items import item_from_vllm

    proc = MULTIMODAL_REGISTRY.create_processor(model_config)
    out = process_one(proc, modality, sample)

    return proc.info.get_hf_processor(), item_from_vllm(out["mm_kwargs"][modality][0])


def noise_image(seed, w, h):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


@pytest.mark.parametrize(("renderer", "patch"), [("qwen2_renderer", 14), ("qwen3_renderer", 16)])
def test_real_processor_images_elide_exactly_to_half(renderer, patch, request):
    model_config = request.getfixturevalue(renderer).model_config
    for seed, (w, h) in enumerate([(448, 448), (1024, 768), (61, 97)]):
        hf, wire = processed(model_config, "image", noise_image(seed, w, h))
        transforms = wire_transforms_for(hf)
        assert transforms.by_key["pixel_values"] == (
            PatchRowDelta(2, patch),
            TemporalDedup(2, patch),
        )
        sent = transforms.encode_item(wire, frozenset({NAME}))
        pixels = wire["pixel_values"].data
        assert sent["pixel_values"].data.nbytes * 2 == pixels.nbytes
        back, _ = transforms.decode_item(decode_item(encode_item(sent)))
        assert bits(back["pixel_values"].data) == bits(pixels)
        assert bits(back["image_grid_thw"].data) == bits(wire["image_grid_thw"].data)


def test_real_processor_videos_elide_only_where_frames_repeat(qwen2_renderer):
    rng = np.random.default_rng(7)
    moving = rng.integers(0, 256, (4, 64, 64, 3), dtype=np.uint8)
    still = np.repeat(moving[:1], 4, axis=0)
    for video, elided in ((moving, False), (still, True)):
        hf, wire = processed(qwen2_renderer.model_config, "video", video)
        transforms = wire_transforms_for(hf)
        pixels = wire["pixel_values_videos"].data
        sent = transforms.encode_item(wire, frozenset({NAME}))["pixel_values_videos"]
        assert (sent.transform is not None) is elided
        assert sent.data.nbytes == (pixels.nbytes // 2 if elided else pixels.nbytes)
        received = decode_item(encode_item({"pixel_values_videos": sent}))
        back, _ = transforms.decode_item(received)
        assert bits(back["pixel_values_videos"].data) == bits(pixels)


def test_processors_without_a_factory_get_no_transforms(qwen2_renderer):
    class Qwen2VLProcessorSubclass:  # by exact class name: a subclass registers its own
        image_processor = object()

    assert wire_transforms_for(Qwen2VLProcessorSubclass()).by_key == {}
    assert wire_transforms_for(None).names == frozenset()


# -- row deltas ----------------------------------------------------------------------------


def moving_patches(rng, n, channels=3, t=2, patch=14):
    """Rows whose t frames differ, as in a video."""
    return rng.integers(0, 256, (n, channels * t * patch * patch), dtype=np.uint8)


@settings(max_examples=60, deadline=None)
@given(**PATCH_TENSORS, still=st.booleans())
def test_row_deltas_round_trip_bitwise(seed, n, channels, t, patch, still):
    rng = np.random.default_rng(seed)
    data = (still_patches if still else moving_patches)(rng, n, channels, t, patch)
    transform = PatchRowDelta(temporal_patch_size=t, patch_size=patch)
    sent, params = transform.encode(data)
    # A still image's copies go once (unless n is 0, where every frame is "the same").
    frames = 1 if still or n == 0 else t
    assert params == {"channels": channels, "temporal_patch_size": t, "frames": frames}
    assert sent.dtype == np.uint8 and sent.nbytes * t == data.nbytes * frames
    back = transform.decode(sent, params)
    assert bits(back) == bits(data)
    assert transform.rebuilt_nbytes(sent, params) == back.nbytes  # charged before it is made


def test_row_deltas_are_the_rows_minus_the_row_above():
    data = still_patches(np.random.default_rng(8), 5)
    sent, _ = DELTA.encode(data)
    planes = data.reshape(5, 3, 2, 14, 14)[:, :, 0].astype(np.int64)
    expected = planes.copy()
    expected[..., 1:, :] = (planes[..., 1:, :] - planes[..., :-1, :]) % 256
    assert bits(sent) == bits(expected.astype(np.uint8).reshape(5, -1))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.dtype(ml_dtypes.bfloat16)])
def test_row_deltas_leave_floats_to_the_plain_elision(dtype):
    data = still_patches(np.random.default_rng(9), 4, dtype=dtype)
    assert DELTA.encode(data) is None
    wire = BOTH.encode_item(item(data), frozenset({DELTA_NAME, NAME}))
    assert wire["pixel_values"].transform.name == NAME


@pytest.mark.parametrize(
    ("data", "params"),
    [
        (np.zeros((4, 588), np.uint8), {"channels": 3, "temporal_patch_size": 2, "frames": 3}),
        (np.zeros((4, 588), np.uint8), {"channels": 3, "temporal_patch_size": 2, "frames": 0}),
        (np.zeros((4, 588), np.uint8), {"channels": 3, "temporal_patch_size": 2, "frames": 2}),
        (np.zeros((4, 588), np.uint8), {"channels": 3, "temporal_patch_size": 4, "frames": 1}),
        (np.zeros((4, 588), np.uint8), {"channels": 3, "temporal_patch_size": 2}),
        (np.zeros((4, 588), np.float32), {"channels": 3, "temporal_patch_size": 2, "frames": 1}),
        (np.zeros((4, 3, 196), np.uint8), {"channels": 3, "temporal_patch_size": 2, "frames": 1}),
        (np.zeros((4, 588), np.uint8), {"channels": 0, "temporal_patch_size": 2, "frames": 1}),
    ],
)
def test_lying_delta_declarations_are_refused(data, params):
    with pytest.raises(TransformMismatch):
        DELTA.decode(data, params)


def test_the_first_accepted_exact_transform_wins():
    data = still_patches(np.random.default_rng(10), 4)
    for names, expected in [
        ({DELTA_NAME, NAME}, DELTA_NAME),
        ({NAME}, NAME),
        ({DELTA_NAME}, DELTA_NAME),
        (set(), None),
    ]:
        elem = BOTH.encode_item(item(data), frozenset(names))["pixel_values"]
        assert (elem.transform.name if elem.transform else None) == expected
        back, _ = BOTH.decode_item(decode_item(encode_item({"pixel_values": elem})))
        assert bits(back["pixel_values"].data) == bits(data)


def test_star_grants_coding_only_transforms_to_callers_that_compress():
    assert BOTH.accepted(frozenset({"*"})) == {NAME}
    assert BOTH.accepted(frozenset({"*"}), coded=True) == {NAME, DELTA_NAME}
    assert BOTH.accepted(frozenset({DELTA_NAME})) == {DELTA_NAME}  # named: granted as asked


def test_real_photographs_compress_smaller_as_row_deltas(qwen2_renderer):
    import skimage.data
    from PIL import Image

    for name in ("astronaut", "coffee"):
        image = Image.fromarray(getattr(skimage.data, name)())
        hf, wire = processed(qwen2_renderer.model_config, "image", image)
        transforms = wire_transforms_for(hf)
        pixels = wire["pixel_values"].data
        sizes = {}
        for chosen in (NAME, DELTA_NAME):
            sent = transforms.encode_item(wire, frozenset({chosen}))["pixel_values"]
            assert sent.transform.name == chosen
            sizes[chosen] = len(compress_zstd(sent.data.tobytes(), 1))
            back, _ = transforms.decode_item(decode_item(encode_item({"pixel_values": sent})))
            assert bits(back["pixel_values"].data) == bits(pixels)
        # Measured 0.69-0.72x on these two; a delta that stopped predicting would be ~1x.
        assert sizes[DELTA_NAME] < 0.8 * sizes[NAME], (name, sizes)


def test_real_processor_videos_travel_as_row_deltas_of_every_frame(qwen2_renderer):
    moving = np.random.default_rng(11).integers(0, 256, (4, 64, 64, 3), dtype=np.uint8)
    hf, wire = processed(qwen2_renderer.model_config, "video", moving)
    transforms = wire_transforms_for(hf)
    pixels = wire["pixel_values_videos"].data
    sent = transforms.encode_item(wire, transforms.names)["pixel_values_videos"]
    assert sent.transform.params["frames"] == 2 and sent.data.nbytes == pixels.nbytes
    back, _ = transforms.decode_item(decode_item(encode_item({"pixel_values_videos": sent})))
    assert bits(back["pixel_values_videos"].data) == bits(pixels)
