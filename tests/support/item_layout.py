"""What generate hands vLLM's engine for an item, against what vLLM's own processor made of it.

``vllm serve``'s processor output goes from its API process to the engine core and the worker;
ours crosses the wire first: render encodes the item (``encode_vllm_item``, in every wire
transform the model has, as a binary answer does), generate decodes it (``decode_item``),
undoes the transforms and rebuilds vLLM's item (``item_to_vllm``). From there both take the
same vLLM path, so an item that arrives with the same fields, field kinds, dtypes, shapes,
strides and values costs the engine the same work. vLLM's serializer hands the engine core a
contiguous, aligned copy on both sides, so a strided view of the processor's may arrive as its
contiguous copy.
"""

from __future__ import annotations

from typing import Any

__all__ = ["assert_engine_gets_processor_items"]


def assert_engine_gets_processor_items(hf_processor: Any, processed: Any) -> int:
    """Every item of ``processed`` (vLLM's ``processor.apply`` output) arrives in generate as
    vLLM made it, through each wire form render sends; the number of tensors compared.

    (vLLM is imported here: the modules calling this skip their vLLM tests without it.)"""
    from tandem_vllm.features import encode_vllm_item
    from tandem_vllm.items import item_to_vllm
    from tandem_vllm.wire_transforms import wire_transforms_for
    from tandem_wire import decode_item

    transforms = wire_transforms_for(hf_processor)
    compared = 0
    for modality, items in processed["mm_kwargs"].items():
        for index, item in enumerate(items):
            for names in {frozenset(), transforms.names}:
                sent = encode_vllm_item(item, transforms, names)
                wire, _ = transforms.decode_item(decode_item(sent))
                received = item_to_vllm(wire)
                where = f"{modality}[{index}] ({', '.join(sorted(names)) or 'plain'})"
                compared += _assert_same_item(item, received, where)
    return compared


def _assert_same_item(made: Any, received: Any, where: str) -> int:
    assert sorted(received) == sorted(made), where
    compared = 0
    for key in made:
        mine, theirs = received[key], made[key]
        assert _field(mine.field) == _field(theirs.field), f"{where} {key}: field"
        compared += _assert_same_data(mine.data, theirs.data, f"{where} {key}")
    return compared


def _field(field: Any) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """A field's kind and parameters, slice bounds as ints (vLLM's processor leaves some as
    0-d tensors, the wire carries ints: the same slices)."""
    import dataclasses

    return type(field).__name__, tuple(
        (f.name, _plain(getattr(field, f.name))) for f in dataclasses.fields(field)
    )


def _plain(value: Any) -> Any:
    if isinstance(value, slice):
        return ("slice", _plain(value.start), _plain(value.stop), _plain(value.step))
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return value.item()
    return value


def _assert_same_data(mine: Any, theirs: Any, where: str) -> int:
    import torch

    if isinstance(theirs, torch.Tensor):
        assert isinstance(mine, torch.Tensor), where
        assert mine.dtype == theirs.dtype, f"{where}: dtype {mine.dtype} != {theirs.dtype}"
        assert mine.shape == theirs.shape, f"{where}: shape"
        # A strided view of the processor's (Qwen2-Audio's feature mask) arrives as its
        # contiguous copy, as vLLM's own serializer hands it to the engine core.
        assert mine.is_contiguous(), f"{where}: not contiguous"
        if theirs.is_contiguous():
            assert mine.stride() == theirs.stride(), f"{where}: strides"
        assert mine.device == theirs.device, f"{where}: device"
        assert torch.equal(mine, theirs), f"{where}: values"
        return 1
    if isinstance(theirs, (list, tuple)):
        assert len(mine) == len(theirs), where
        return sum(_assert_same_data(m, t, where) for m, t in zip(mine, theirs, strict=True))
    assert mine == theirs, where
    return 0
