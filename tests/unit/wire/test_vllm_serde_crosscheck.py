"""Cross-checks against vLLM's own kwargs-item serializer, in both directions.

vLLM is always installed in this project's environment, so its serializer is imported plainly:
if vLLM moves the module, collecting this file errors (never a skip), so the byte-compatibility
checks cannot silently stop running.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vllm.entrypoints.scale_out.token_in_token_out import mm_serde
from vllm.multimodal.inputs import (
    MultiModalBatchedField,
    MultiModalFieldElem,
    MultiModalFlatField,
    MultiModalKwargsItem,
    MultiModalSharedField,
)

from tandem_vllm.items import item_from_vllm, item_to_vllm, tensor_to_numpy
from tandem_wire import decode_item, decode_item_b64, encode_item, encode_item_b64

pytestmark = pytest.mark.vllm


def _elem(data, field):
    return MultiModalFieldElem(data=data, field=field)


def _items():
    g = torch.Generator().manual_seed(7)
    pixels = torch.randn(64, 1176, generator=g)
    yield (
        "qwen_like",
        MultiModalKwargsItem(
            {
                "pixel_values": _elem(pixels, MultiModalFlatField(slices=[slice(0, 64)], dim=0)),
                "image_grid_thw": _elem(
                    torch.tensor([1, 8, 8]), MultiModalBatchedField(keep_on_cpu=True)
                ),
            }
        ),
    )
    yield (
        "uint8_patches",
        MultiModalKwargsItem(
            {
                "pixel_values": _elem(
                    torch.randint(0, 255, (16, 588), dtype=torch.uint8, generator=g),
                    MultiModalBatchedField(),
                )
            }
        ),
    )
    yield (
        "bfloat16",
        MultiModalKwargsItem(
            {
                "x": _elem(
                    torch.randn(5, 7, generator=g).to(torch.bfloat16), MultiModalBatchedField()
                )
            }
        ),
    )
    yield (
        "non_contiguous",
        MultiModalKwargsItem(
            {"x": _elem(torch.randn(6, 8, generator=g).t(), MultiModalBatchedField())}
        ),
    )
    yield (
        "empty_and_scalar",
        MultiModalKwargsItem(
            {
                "empty": _elem(torch.zeros(0, 3), MultiModalBatchedField()),
                "scalar": _elem(torch.tensor(2.5), MultiModalBatchedField()),
            }
        ),
    )
    yield (
        "flat_dim1",
        MultiModalKwargsItem(
            {
                "x": _elem(
                    torch.arange(24, dtype=torch.int32).reshape(2, 12),
                    MultiModalFlatField(
                        slices=[[slice(0, 2), slice(0, 6)], [slice(0, 2), slice(6, 12)]], dim=1
                    ),
                )
            }
        ),
    )
    yield (
        "shared_and_nested",
        MultiModalKwargsItem(
            {
                "shared": _elem(
                    torch.ones(4, dtype=torch.float16), MultiModalSharedField(batch_size=3)
                ),
                "frames": _elem(
                    [torch.zeros(2, 2), torch.ones(3, dtype=torch.int64)], MultiModalBatchedField()
                ),
            }
        ),
    )


ITEMS = dict(_items())


def _assert_same(ours, theirs: MultiModalKwargsItem):
    assert list(ours) == list(theirs)
    for key, elem in theirs.items():
        mine = ours[key]
        _assert_nested(mine.data, elem.data)
        field = elem.field
        assert mine.layout.keep_on_cpu == field.keep_on_cpu
        if isinstance(field, MultiModalFlatField):
            assert mine.layout.dim == field.dim
            assert [tuple(s) if not isinstance(s, slice) else s for s in field.slices] == list(
                mine.layout.slices
            )
        if isinstance(field, MultiModalSharedField):
            assert mine.layout.batch_size == field.batch_size


def _assert_nested(ours, theirs):
    if isinstance(theirs, torch.Tensor):
        ref = tensor_to_numpy(theirs)
        assert ours.dtype == ref.dtype and ours.shape == ref.shape
        assert ours.tobytes() == ref.tobytes()
    elif isinstance(theirs, list):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            _assert_nested(a, b)
    else:
        assert ours == theirs


def _assert_vllm_equal(a: MultiModalKwargsItem, b: MultiModalKwargsItem):
    assert a == b  # vLLM's own equality: tensors equal and field types equal
    for key in a:
        assert a[key].field == b[key].field
        _assert_torch_dtypes(a[key].data, b[key].data)


def _assert_torch_dtypes(a, b):
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
    elif isinstance(a, list):
        for x, y in zip(a, b, strict=True):
            _assert_torch_dtypes(x, y)


@pytest.mark.parametrize("name", sorted(ITEMS))
def test_vllm_encoded_items_decode_with_ours(name):
    item = ITEMS[name]
    _assert_same(decode_item_b64(mm_serde.encode_mm_kwargs_item(item)), item)


@pytest.mark.parametrize("name", sorted(ITEMS))
def test_our_encoded_items_decode_with_vllm(name):
    item = ITEMS[name]
    back = mm_serde.decode_mm_kwargs_item(encode_item_b64(item_from_vllm(item)))
    _assert_vllm_equal(item, back)


@pytest.mark.parametrize("name", sorted(ITEMS))
def test_our_bytes_equal_vllm_bytes(name):
    item = ITEMS[name]
    ours = encode_item(item_from_vllm(item))
    theirs = mm_serde.encode_mm_kwargs_item(item)
    assert encode_item_b64(item_from_vllm(item)) == theirs
    assert len(ours) > 0


@pytest.mark.parametrize("name", sorted(ITEMS))
def test_adapter_roundtrip_through_wire(name):
    item = ITEMS[name]
    back = item_to_vllm(decode_item(encode_item(item_from_vllm(item))))
    _assert_vllm_equal(item, back)


def test_adapter_is_zero_copy():
    arr = np.arange(12, dtype=np.float32)
    buf = encode_item(
        item_from_vllm(
            MultiModalKwargsItem({"x": _elem(torch.from_numpy(arr), MultiModalBatchedField())})
        )
    )
    wire = decode_item(buf)
    t = item_to_vllm(wire)["x"].data
    assert t.data_ptr() == wire["x"].data.ctypes.data


def test_weight_versions_on_choices_read_both_ways():
    """A choice's ``weight_versions`` as upstream's token-mode response shapes it."""
    import json

    from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateTokensResponse
    from vllm.outputs import WeightVersionSpan as VllmSpan

    from tandem_wire import GenerateResponse, WireFormat, decode_document, encode_document

    spans = [VllmSpan("default", 0, 3), VllmSpan("step-1", 3, 5)]
    upstream = GenerateTokensResponse(
        request_id="r",
        choices=[{"index": 0, "token_ids": [1, 2, 3, 4, 5], "weight_versions": spans}],
    )
    ours = decode_document(upstream.model_dump_json().encode(), GenerateResponse, WireFormat.JSON)
    got = ours.choices[0].weight_versions
    assert [(s.version, s.start, s.end) for s in got or []] == [
        ("default", 0, 3),
        ("step-1", 3, 5),
    ]
    back = GenerateTokensResponse.model_validate(json.loads(encode_document(ours, WireFormat.JSON)))
    assert back.choices[0].weight_versions == spans
