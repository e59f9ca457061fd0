"""Model-aware wire transforms: exact, smaller wire forms of processor outputs, by processor.

A transform knows one processor's output layout well enough to send less of it and rebuild the
very same tensor (bitwise) on receipt. Render applies one to a field only where it is exact for
that item's data, and only when the caller accepts it (``tandem_wire.WIRE_TRANSFORMS_HEADER``);
the field then declares it (``tandem_wire.FieldTransform``) and generate undoes it before the
item is checked against the model. Models add theirs with ``register``, keyed by the class name
of their HF processor, so render and generate bind the same transforms from the same model.

A field can have several, in order of preference: render applies the first one accepted and
exact. Some only pay under a content coding (a delta makes pixels compressible, not smaller):
``*`` grants those only to callers that compress (``WireTransforms.accepted``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from tandem_wire import (
    ANY_WIRE_TRANSFORM,
    FieldElem,
    FieldTransform,
    KwargsItem,
    UnsupportedWireTransform,
)

__all__ = [
    "PatchRowDelta",
    "TemporalDedup",
    "TransformMismatch",
    "WireTransform",
    "WireTransforms",
    "register",
    "wire_transforms_for",
]


class TransformMismatch(ValueError):
    """A declared transform whose params or data disagree with this model's processor (the
    generate service answers it as an invalid item)."""


class WireTransform(Protocol):
    """One field's wire form: ``encode`` on render, ``decode`` on generate."""

    name: ClassVar[str]
    """Declared on the wire; a new layout is a new name (``.../v2``), never a changed one."""

    for_coded_bodies: ClassVar[bool]
    """Whether it shrinks a body only under a content coding (``*`` grants it only then)."""

    def encode(self, data: np.ndarray) -> tuple[np.ndarray, dict[str, int]] | None:
        """The wire form of ``data`` and the params that undo it; None where the transform is
        not exact for this data (the field then goes as it is)."""
        ...

    def decode(self, data: np.ndarray, params: Mapping[str, int]) -> np.ndarray:
        """The processor's tensor again, as a new array; TransformMismatch when ``params`` or
        ``data`` disagree with this model. The result is at most a small, fixed factor (bound
        to the model, not to ``params``) larger than ``data``."""
        ...

    def rebuilt_nbytes(self, data: np.ndarray, params: Mapping[str, int]) -> int:
        """The bytes ``decode`` will allocate for this data, known before it runs (the
        receiver charges them first); at most that small factor times ``data.nbytes``."""
        ...


def _patch_rows(data: np.ndarray, patch_elems: int) -> tuple[int, int] | None:
    """(rows, channels) of a tensor of patch rows, ``patch_elems`` per channel, else None."""
    if data.ndim != 2 or data.shape[1] == 0 or data.shape[1] % patch_elems:
        return None
    return data.shape[0], data.shape[1] // patch_elems


@dataclass(frozen=True)
class TemporalDedup:
    """Qwen-VL patches without their repeated temporal copies.

    Each row of ``pixel_values`` is one patch laid out ``(channels, temporal_patch_size,
    patch_size**2)`` (vLLM's patch embedding views it so). A still image has one frame, which
    the processor repeats ``temporal_patch_size`` times, so the copies are byte-identical and
    one is sent; rows stay rows, so the field's flat layout is unchanged. A video's copies are
    consecutive frames: elided only in the rare item where they are identical.
    """

    temporal_patch_size: int
    patch_size: int
    name: ClassVar[str] = "qwen_vl.temporal_dedup/v1"
    for_coded_bodies: ClassVar[bool] = False

    def encode(self, data: np.ndarray) -> tuple[np.ndarray, dict[str, int]] | None:
        t, area = self.temporal_patch_size, self.patch_size**2
        split = _patch_rows(data, t * area)
        if split is None:
            return None
        n, channels = split
        # Compared as bytes, so exact whatever the dtype (NaN payloads, -0.0, bfloat16), in the
        # widest words a patch's bytes divide into (numpy compares words, not bytes, faster).
        span = area * data.dtype.itemsize
        word = next(w for w in (8, 4, 2, 1) if span % w == 0)
        patches = np.ascontiguousarray(data).reshape(n, channels, t, area)
        words = patches.view(np.uint8).reshape(n, channels, t, span).view(f"<u{word}")
        first = words[:, :, 0]
        for k in range(1, t):  # the first row alone refuses most videos at once
            if not np.array_equal(first[:1], words[:1, :, k]):
                return None
        sent = np.ascontiguousarray(first)  # compared against from here: one strided read less
        for k in range(1, t):
            if not np.array_equal(sent, words[:, :, k]):
                return None
        out = sent.view(np.uint8).view(data.dtype).reshape(n, channels * area)
        return out, {"channels": channels, "temporal_patch_size": t}

    def decode(self, data: np.ndarray, params: Mapping[str, int]) -> np.ndarray:
        if set(params) != {"channels", "temporal_patch_size"}:
            raise TransformMismatch(f"{self.name} takes channels and temporal_patch_size")
        t, channels = params["temporal_patch_size"], params["channels"]
        if t != self.temporal_patch_size:
            raise TransformMismatch(
                f"temporal_patch_size {t}; this model's processor uses {self.temporal_patch_size}"
            )
        area = self.patch_size**2
        if data.ndim != 2 or channels < 1 or data.shape[1] != channels * area:
            raise TransformMismatch(
                f"{list(data.shape)} is not rows of {channels} channels of "
                f"{self.patch_size}x{self.patch_size} patches"
            )
        n = data.shape[0]
        # One copy into a new array, contiguous runs of a patch each (memcpy-class; measured
        # faster than a broadcast assignment into np.empty).
        rebuilt = np.repeat(data.reshape(n, channels, 1, area), t, axis=2)
        return rebuilt.reshape(n, channels * t * area)

    def rebuilt_nbytes(self, data: np.ndarray, params: Mapping[str, int]) -> int:
        return data.nbytes * self.temporal_patch_size  # every patch's one frame, t times


@dataclass(frozen=True)
class PatchRowDelta:
    """Qwen-VL uint8 patches as row deltas, without repeated temporal copies where exact.

    Each patch plane (``patch_size`` rows of ``patch_size`` pixels, per channel and frame) is
    sent as its first row and then each row minus the one above it, modulo 256: the same bytes,
    but a photograph's become mostly small numbers, which zstd packs into 0.45-0.68x of them
    (the sample photos) where it packs the pixels themselves into 0.63-0.94x. Worth its two
    passes only under a content coding. The temporal copies of a still image are sent once
    (``frames`` 1), as ``TemporalDedup`` does; a video's differing frames all go (``frames``
    ``temporal_patch_size``). Only for uint8 pixels (vLLM's Qwen-VL processors leave rescaling
    to the model); float tensors are left to ``TemporalDedup``.
    """

    temporal_patch_size: int
    patch_size: int
    name: ClassVar[str] = "qwen_vl.patch_row_delta/v1"
    for_coded_bodies: ClassVar[bool] = True

    def encode(self, data: np.ndarray) -> tuple[np.ndarray, dict[str, int]] | None:
        if data.dtype != np.uint8:
            return None
        t, p = self.temporal_patch_size, self.patch_size
        deduped = TemporalDedup(t, p).encode(data)
        if deduped is not None:
            pixels, frames, channels = deduped[0], 1, deduped[1]["channels"]
        else:
            split = _patch_rows(data, t * p * p)
            if split is None:
                return None
            pixels, frames, channels = data, t, split[1]
        planes = pixels.reshape(len(pixels), channels, frames, p, p)
        delta = np.empty(planes.shape, np.uint8)
        delta[..., 0, :] = planes[..., 0, :]
        np.subtract(planes[..., 1:, :], planes[..., :-1, :], out=delta[..., 1:, :])  # wraps
        params = {"channels": channels, "temporal_patch_size": t, "frames": frames}
        return delta.reshape(pixels.shape), params

    def decode(self, data: np.ndarray, params: Mapping[str, int]) -> np.ndarray:
        if set(params) != {"channels", "temporal_patch_size", "frames"}:
            raise TransformMismatch(f"{self.name} takes channels, temporal_patch_size and frames")
        t, p = self.temporal_patch_size, self.patch_size
        channels, frames = params["channels"], params["frames"]
        if params["temporal_patch_size"] != t:
            raise TransformMismatch(
                f"temporal_patch_size {params['temporal_patch_size']}; this model's processor "
                f"uses {t}"
            )
        if frames not in (1, t):
            raise TransformMismatch(f"frames {frames}: 1 (a still image) or {t}")
        if (
            data.dtype != np.uint8
            or data.ndim != 2
            or channels < 1
            or data.shape[1] != channels * frames * p * p
        ):
            raise TransformMismatch(
                f"{data.dtype}{list(data.shape)} is not uint8 rows of {channels} channels of "
                f"{frames} {p}x{p} patch frames"
            )
        n = data.shape[0]
        delta = data.reshape(n, channels, frames, p, p)
        rebuilt = np.empty((n, channels, t, p, p), np.uint8)
        sums = rebuilt[:, :, :frames]
        sums[..., 0, :] = delta[..., 0, :]
        for row in range(1, p):  # a row at a time over every patch: p vector adds in all
            np.add(sums[..., row - 1, :], delta[..., row, :], out=sums[..., row, :])
        if frames == 1:
            rebuilt[:, :, 1:] = sums
        return rebuilt.reshape(n, channels * t * p * p)

    def rebuilt_nbytes(self, data: np.ndarray, params: Mapping[str, int]) -> int:
        # Every frame, from the ``frames`` sent (``decode`` refuses any other count).
        frames = params.get("frames", 1)
        t = self.temporal_patch_size
        return data.nbytes * t // frames if frames in (1, t) else data.nbytes * t


@dataclass(frozen=True)
class WireTransforms:
    """The transforms one model's items can travel in, by item key, in order of preference
    (none for most models)."""

    by_key: Mapping[str, tuple[WireTransform, ...]] = field(default_factory=dict)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(t.name for ts in self.by_key.values() for t in ts)

    def accepted(self, asked: frozenset[str], coded: bool = False) -> frozenset[str]:
        """Ours that a caller's ``WIRE_TRANSFORMS_HEADER`` names accept. ``*`` accepts all ours
        but, unless the caller compresses (``coded``), those that only pay under a coding."""
        if ANY_WIRE_TRANSFORM not in asked:
            return self.names & asked
        return frozenset(
            t.name for ts in self.by_key.values() for t in ts if coded or not t.for_coded_bodies
        )

    def encode_item(self, item: KwargsItem, names: frozenset[str]) -> KwargsItem:
        """The item with each field in the first of its transforms that ``names`` holds and
        that is exact for its data, declared; every other field as it is."""
        out = dict(item)
        for key, transforms in self.by_key.items():
            elem = item.get(key)
            if elem is None or elem.transform is not None or not isinstance(elem.data, np.ndarray):
                continue
            for transform in transforms:
                encoded = transform.encode(elem.data) if transform.name in names else None
                if encoded is not None:
                    data, params = encoded
                    out[key] = FieldElem(data, elem.layout, FieldTransform(transform.name, params))
                    break
        return out

    def rebuilt_nbytes(self, item: KwargsItem) -> int:
        """The bytes ``decode_item`` will allocate for this item's declared transforms, from
        its (checked) tensor sizes, before any is undone; 0 for a field it will refuse."""
        total = 0
        for key, elem in item.items():
            declared = elem.transform
            if declared is None or not isinstance(elem.data, np.ndarray):
                continue
            for transform in self.by_key.get(key, ()):
                if transform.name == declared.name:
                    total += transform.rebuilt_nbytes(elem.data, declared.params)
        return total

    def decode_item(self, item: KwargsItem) -> tuple[KwargsItem, int]:
        """The item with every declared transform undone, and the bytes the rebuilt tensors
        take. UnsupportedWireTransform for a transform this model has not for that key;
        TransformMismatch for params or data that disagree with the model."""
        out: KwargsItem | None = None
        made = 0
        for key, elem in item.items():
            declared = elem.transform
            if declared is None:
                continue
            transform = next((t for t in self.by_key.get(key, ()) if t.name == declared.name), None)
            if transform is None:
                raise UnsupportedWireTransform(
                    f"{key[:40]!r}: wire transform {declared.name!r} is not one this model's "
                    "processor has for it"
                )
            if not isinstance(elem.data, np.ndarray):
                raise TransformMismatch(f"{key[:40]!r}: a transformed field must be one tensor")
            data = transform.decode(elem.data, declared.params)
            out = dict(item) if out is None else out
            out[key] = FieldElem(data, elem.layout)
            made += data.nbytes
        return (item if out is None else out), made


TransformFactory = Callable[[Any], Mapping[str, tuple[WireTransform, ...]]]
"""HF processor -> its transforms by item key, preferred first (bound to that processor's
sizes)."""

_REGISTRY: dict[str, TransformFactory] = {}


def register(*processor_classes: str) -> Callable[[TransformFactory], TransformFactory]:
    """Register a factory for the HF processors of these class names. By exact name: a
    subclass may lay its tensors out otherwise, so it registers its own."""

    def add(factory: TransformFactory) -> TransformFactory:
        for name in processor_classes:
            _REGISTRY[name] = factory
        return factory

    return add


def wire_transforms_for(hf_processor: Any) -> WireTransforms:
    """The transforms of a model, from its HF processor (none when it has no factory)."""
    factory = _REGISTRY.get(type(hf_processor).__name__) if hf_processor is not None else None
    return WireTransforms(dict(factory(hf_processor)) if factory is not None else {})


@register("Qwen2VLProcessor", "Qwen2_5_VLProcessor", "Qwen3VLProcessor")
def _qwen_vl(hf_processor: Any) -> dict[str, tuple[WireTransform, ...]]:
    out: dict[str, tuple[WireTransform, ...]] = {}
    for key, sub in (
        ("pixel_values", "image_processor"),
        ("pixel_values_videos", "video_processor"),
    ):
        proc = getattr(hf_processor, sub, None)
        t, p = getattr(proc, "temporal_patch_size", None), getattr(proc, "patch_size", None)
        if isinstance(t, int) and isinstance(p, int) and t > 1 and p > 0:
            out[key] = (PatchRowDelta(t, p), TemporalDedup(t, p))
    return out
