"""Wire features -> engine inputs: decode, check against the model, cache, and name items.

An item's identity towards the engine (its encoder-cache and prefix-cache key) and in the item
store is its content id (``tandem_wire.content_id``: a hash of its bytes and the tenant), never
the caller's ``mm_hash``: reusing someone's hash with other pixels yields another identity, so
nobody can poison another request's caches or be served pixels they did not send.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from tandem_http import MmEmbedsDisabled, TokenOutOfVocabulary, TooManyItems
from tandem_vllm.item_rules import ItemRuleMismatch
from tandem_vllm.items import item_to_vllm
from tandem_vllm.wire_transforms import TransformMismatch
from tandem_wire import (
    DecodeLimits,
    FieldElem,
    FlatLayout,
    GenerateRequest,
    InvalidDocument,
    ItemBytes,
    KwargsItem,
    MultiModalFeatures,
    PlaceholderRange,
    check_placeholder_embeds,
    content_id,
    decode_item,
)

from .errors import CacheMiss, InvalidItem, InvalidPlaceholders
from .item_store import ItemStore, StoredItem
from .model_spec import ModalitySpec, ModelSpec, grid_cells, layout_kind

__all__ = ["EMBED_DTYPES", "EngineInputs", "InputBuilder"]

EMBED_DTYPES = frozenset({np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)})
"""What precomputed embeddings may arrive in; cast here to the model's dtype (the one cast
vLLM's model makes of them itself, e.g. Qwen2-VL's ``image_embeds.type(visual.dtype)``)."""


@dataclass
class EngineInputs:
    token_ids: list[int]
    items: dict[str, list[Any]]
    hashes: dict[str, list[str]]
    placeholders: dict[str, list[PlaceholderRange]]
    """Checked ranges, ``is_embed`` computed from the tokens (tandem_vllm converts them)."""
    decoded_bytes: int = 0
    """Bytes this request's items were decoded into, beyond its body and its base64 decoded
    from JSON (copies out of the body, tensors rebuilt or cast): charged before allocated."""


@dataclass(frozen=True)
class _Sent:
    """An item as sent, read in place, and what decoding it will allocate."""

    entry: ItemBytes
    wire: KwargsItem
    """Its fields, tensors as views into ``entry``."""
    body: int
    """The request body's size when the item stays a view into it (the store counts it)."""
    copy: bool
    """Whether its bytes are copied out of the body (a small part of it)."""
    made: int
    """Bytes of the tensors rebuilt from wire transforms or cast to the model's dtype."""
    nbytes: int
    """All it allocates beyond the body: the copy and ``made``."""


def _nothing(nbytes: int) -> None:
    """``build``'s ``take`` where nothing is charged."""


def _cast_nbytes(wire: KwargsItem, spec: ModalitySpec) -> int:
    """The bytes ``rebind`` allocates casting embeddings to the model's dtype (transforms are
    for pixels: an embeddings field's size is as sent)."""
    key = spec.embeds_key
    fspec = spec.fields.get(key) if key is not None else None
    data = wire[key].data if key is not None and key in wire else None
    if fspec is None or not isinstance(data, np.ndarray):
        return 0
    if data.dtype == fspec.dtype or data.dtype not in EMBED_DTYPES:
        return 0
    return int(data.size) * np.dtype(fspec.dtype).itemsize


class InputBuilder:
    """Checks one request's tokens and features and turns them into engine inputs."""

    def __init__(
        self,
        spec: ModelSpec,
        store: ItemStore,
        *,
        vocab_size: int,
        max_items: int,
        limits: DecodeLimits,
        mm_limits: dict[str, int] | None = None,
        accept_embeds: bool = False,
    ) -> None:
        self.spec = spec
        self.store = store
        self.vocab_size = vocab_size
        self.max_items = max_items
        self.limits = limits
        self.mm_limits = mm_limits or {}
        self.accept_embeds = accept_embeds
        """The engine's ``enable_mm_embeds``: items carrying embeddings are refused without."""

    def build(
        self,
        req: GenerateRequest[ItemBytes | None],
        tenant: str,
        principal: str = "",
        take: Callable[[int], None] = _nothing,
    ) -> EngineInputs:
        """``tenant`` (cache_salt) goes into content ids; held items are looked up and kept
        per tenant and API key (``principal``), so no key resolves another key's items.
        ``take`` is given what the sent items will allocate beyond the body (copies out of
        it, rebuilt and cast tensors), from their checked sizes, before any is allocated;
        it refuses by raising (the request's admission slot)."""
        scope = f"{principal}\x00{tenant}"
        ids = req.token_ids
        if max(ids) >= self.vocab_size:
            bad = next(t for t in ids if t >= self.vocab_size)
            raise TokenOutOfVocabulary(
                f"token id {bad} is outside the vocabulary (size {self.vocab_size})",
                param="token_ids",
            )
        feats = req.features
        out = EngineInputs(token_ids=list(ids), items={}, hashes={}, placeholders={})
        if feats is None:
            return out
        _refuse_metadata_only(feats, bool(req.ec_transfer_params))
        n_items = sum(len(h) for h in feats.mm_hashes.values())
        if n_items > self.max_items:
            raise TooManyItems(f"{n_items} items in one prompt; the limit is {self.max_items}")
        missing: dict[str, list[str]] = {}
        sent: dict[str, list[_Sent | None]] = {}
        for modality, hashes in feats.mm_hashes.items():
            if modality not in self.spec.modalities:
                if modality in self.spec.unlearned:
                    raise InvalidItem(
                        f"this node could not learn the model's {modality} items at start-up "
                        "(see its log)"
                    )
                raise InvalidItem(f"this model takes no {modality[:32]!r} input")
            limit = self.mm_limits.get(modality)
            if limit is not None and len(hashes) > limit:
                raise TooManyItems(
                    f"At most {limit} {modality}(s) may be provided in one prompt "
                    "(--limit-mm-per-prompt)",
                    param=f"features.mm_hashes.{modality}",
                )
            entries = (feats.kwargs_data or {}).get(modality) or [None] * len(hashes)
            sent[modality] = [None if e is None else self._parse(e, modality) for e in entries]
        # Everything the items will allocate, charged at once before any of it is (so a
        # request that could never fit is told 413, not to retry).
        out.decoded_bytes = sum(s.nbytes for ss in sent.values() for s in ss if s is not None)
        take(out.decoded_bytes)
        for modality, hashes in feats.mm_hashes.items():
            stored_items = []
            for mm_hash, item in zip(hashes, sent[modality], strict=True):
                if item is None:
                    # A null's mm_hash is the content id of bytes its sender sent before.
                    stored = self.store.get(scope, mm_hash)
                    if stored is None:
                        missing.setdefault(modality, []).append(mm_hash)
                        continue
                else:
                    stored = self._decode(item, tenant, modality)
                    self.store.put(scope, stored)
                stored_items.append(stored)
            if modality in missing:
                continue
            self._check_metadata(feats.mm_metadata, modality, stored_items)
            out.items[modality] = [s.item for s in stored_items]
            out.hashes[modality] = [s.content_id for s in stored_items]
            out.placeholders[modality] = [
                self._check_range(ids, p, s.wire, self._spec_of(s.wire, modality), modality)
                for p, s in zip(feats.mm_placeholders[modality], stored_items, strict=True)
            ]
        if missing:
            count = sum(len(v) for v in missing.values())
            raise CacheMiss(
                f"{count} item(s) sent as null are not held by this node; resend their data",
                details={"missing": missing},
            )
        _check_embeds_disjoint(out.placeholders)
        return out

    def _parse(self, entry: ItemBytes, modality: str) -> _Sent:
        """The item read in place (its tensors views into ``entry``: nothing allocated yet)
        and the bytes decoding it will take beyond the request body. JSON's entries were
        decoded from base64 by the codec, which charged them (``decode_generate_request``)."""
        body = 0  # the request body's size, when the item is kept as a view into it
        copy = False
        if isinstance(entry, memoryview):
            body = memoryview(entry.obj).nbytes
            # A view into the whole request body: stored as it is, it would keep the body's
            # other items alive too, past the store's byte budget (one memcpy). Else nearly
            # the whole body is this item: kept as a view, it holds little more than itself,
            # the body already charged (the copy cost ~5% of API CPU per image request).
            copy = entry.nbytes * 10 < body * 9
        wire = decode_item(entry, self.limits)
        spec = self._spec_of(wire, modality)
        made = self.spec.wire_transforms.rebuilt_nbytes(wire) + _cast_nbytes(wire, spec)
        return _Sent(
            entry=entry,
            wire=wire,
            body=0 if copy else body,
            copy=copy,
            made=made,
            nbytes=(memoryview(entry).nbytes if copy else 0) + made,
        )

    def _decode(self, sent: _Sent, tenant: str, modality: str) -> StoredItem:
        """The item, its bytes out of the body where they must be, transforms undone, checked
        against the model (what it allocates was charged by ``build``)."""
        entry, wire = sent.entry, sent.wire
        if sent.copy:
            entry = bytes(entry)
            wire = decode_item(entry, self.limits)  # views into the copy this time
        try:
            # Undone first: the rebuilt tensors face the same checks as any item's.
            wire, _ = self.spec.wire_transforms.decode_item(wire)
        except TransformMismatch as exc:
            raise InvalidItem(f"{modality} item: {exc}") from None
        spec = self._spec_of(wire, modality)
        wire = rebind(wire, spec, modality)
        expected_embeds(wire, spec, modality)  # the model's rule, once, before the store
        data = memoryview(entry)
        return StoredItem(
            # Of the bytes as sent, transform declaration included: what the sender names.
            content_id=content_id(tenant, data),
            item=item_to_vllm(wire),
            wire=wire,
            nbytes=max(data.nbytes, sent.body) + sent.made,
        )

    def _check_metadata(
        self,
        metadata: dict[str, list[ItemBytes | None]] | None,
        modality: str,
        stored: list[StoredItem],
    ) -> None:
        """Each ``mm_metadata`` entry describes its item: every field it names is the item's,
        equal in data and layout (a grid that disagrees with the pixels is refused, not
        silently dropped; ``_same_layout`` says what of a layout counts)."""
        entries = (metadata or {}).get(modality)
        if not entries:
            return
        for i, (entry, item) in enumerate(zip(entries, stored, strict=True)):
            if entry is None:
                continue
            where = f"features.mm_metadata.{modality}[{i}]"
            for key, elem in decode_item(entry, self.limits).items():
                have = item.wire.get(key)
                if (
                    have is None
                    or not _same_layout(have.layout, elem.layout)
                    or not _same(have.data, elem.data)
                ):
                    raise InvalidItem(
                        f"{where}: {key[:64]!r} disagrees with the item's kwargs_data",
                        param=where,
                    )

    def _spec_of(self, wire: KwargsItem, modality: str) -> ModalitySpec:
        """The spec an item is checked against: its modality's embedding form when it carries
        that form's embeddings key (refused unless the engine takes embeddings), else pixels."""
        embeds = self.spec.embeds.get(modality)
        if embeds is not None and embeds.embeds_key in wire:
            if not self.accept_embeds:
                raise MmEmbedsDisabled(
                    f"{modality} items carrying {embeds.embeds_key} need a generate server "
                    "started with --enable-mm-embeds",
                    param=f"features.kwargs_data.{modality}",
                )
            return embeds
        return self.spec.modalities[modality]

    def _check_range(
        self,
        ids: list[int],
        p: PlaceholderRange,
        wire: KwargsItem,
        spec: ModalitySpec,
        modality: str,
    ) -> PlaceholderRange:
        window = np.asarray(ids[p.offset : p.offset + p.length])
        mask = window == spec.placeholder_token
        if p.is_embed is not None and not np.array_equal(mask, np.asarray(p.is_embed, bool)):
            raise InvalidPlaceholders(
                f"{modality} range at {p.offset}: is_embed disagrees with the prompt's tokens"
            )
        n_embed = int(mask.sum())
        if n_embed == 0:
            raise InvalidPlaceholders(
                f"{modality} range at {p.offset} holds no {modality} placeholder token"
            )
        expected = expected_embeds(wire, spec, modality)
        if expected is not None and expected != n_embed:
            raise InvalidPlaceholders(
                f"{modality} range at {p.offset} has {n_embed} placeholder tokens but the "
                f"item's grid needs {expected}"
            )
        # Computed from the tokens rather than trusted: upstream render does not send it.
        is_embed = None if bool(mask.all()) else mask.tolist()
        return PlaceholderRange(offset=p.offset, length=p.length, is_embed=is_embed)


def _check_embeds_disjoint(placeholders: dict[str, list[PlaceholderRange]]) -> None:
    """The wire's rule again, now that every range's embed positions are known from the
    tokens (upstream render sends no ``is_embed``)."""
    try:
        check_placeholder_embeds([p for ranges in placeholders.values() for p in ranges])
    except InvalidDocument as exc:
        raise InvalidPlaceholders(exc.message) from None


def expected_embeds(wire: KwargsItem, spec: ModalitySpec, modality: str) -> int | None:
    """The embedding tokens the model makes of the item; None where only the placeholder
    token itself says (no grid, no rule). InvalidItem when the model's rule refuses it."""
    if spec.rule is not None:
        try:
            return spec.rule.embed_tokens(wire)
        except ItemRuleMismatch as exc:
            raise InvalidItem(f"{modality} item: {exc}") from None
    if spec.grid_key is None or spec.grid_cells_per_token is None:
        return None
    grid = wire[spec.grid_key].data
    return grid_cells(grid) // spec.grid_cells_per_token


def rebind(wire: KwargsItem, spec: ModalitySpec, modality: str) -> KwargsItem:
    """The item with the layouts this model declares; refuses keys, dtypes and shapes it
    does not produce, and tensor sizes that disagree with the item's grid."""
    if set(wire) != spec.keys:
        missing, extra = sorted(spec.keys - set(wire)), sorted(set(wire) - spec.keys)
        raise InvalidItem(
            f"{modality} item keys differ from this model's: missing {missing[:8]}, "
            f"unexpected {[k[:40] for k in extra[:8]]}"
        )
    cells = None
    if spec.grid_key is not None:
        grid = wire[spec.grid_key].data
        if not isinstance(grid, np.ndarray) or grid.size == 0 or (grid <= 0).any():
            raise InvalidItem(f"{modality} item grid is malformed")
        cells = grid_cells(grid)
        _check_merge(grid, spec, modality)
    out: KwargsItem = dict(wire)  # non-tensor fields pass as they are
    for key, fspec in spec.fields.items():
        data = wire[key].data
        if not isinstance(data, np.ndarray):
            raise InvalidItem(f"{modality}.{key} must be a tensor")
        if key == spec.embeds_key and data.dtype != fspec.dtype and data.dtype in EMBED_DTYPES:
            data = data.astype(fspec.dtype)
        if data.dtype != fspec.dtype or data.ndim != len(fspec.shape):
            raise InvalidItem(
                f"{modality}.{key} is {data.dtype}{list(data.shape)}; this model takes "
                f"{fspec.dtype} with {len(fspec.shape)} dimensions"
            )
        if layout_kind(wire[key].layout) is not fspec.kind:
            raise InvalidItem(f"{modality}.{key} has a layout this model does not use")
        if fspec.kind is FlatLayout:
            d = fspec.flat_dim
            if data.shape[:d] + data.shape[d + 1 :] != fspec.shape[:d] + fspec.shape[d + 1 :]:
                raise InvalidItem(f"{modality}.{key} has shape {list(data.shape)}")
            rows = data.shape[d]
            if cells is not None and (
                (fspec.rows_per_cell and rows != cells * fspec.rows_per_cell)
                or (fspec.cells_per_row and rows * fspec.cells_per_row != cells)
            ):
                raise InvalidItem(f"{modality}.{key} size disagrees with the item's grid")
            layout: Any = FlatLayout(
                slices=(slice(0, data.shape[d]),), dim=d, keep_on_cpu=fspec.keep_on_cpu
            )
        else:
            if data.shape != fspec.shape and fspec.kind is not FlatLayout and key == spec.grid_key:
                raise InvalidItem(f"{modality}.{key} has shape {list(data.shape)}")
            layout = type(wire[key].layout)(
                **{**_layout_kwargs(wire[key].layout), "keep_on_cpu": fspec.keep_on_cpu}
            )
        out[key] = FieldElem(data=data, layout=layout)
    return out


def _layout_kwargs(layout: Any) -> dict[str, Any]:
    return {name: getattr(layout, name) for name in layout.__slots__}


def _check_merge(grid: np.ndarray, spec: ModalitySpec, modality: str) -> None:
    """A (t, h, w) grid whose h and w the model's spatial merge divides: the engine lays out
    M-RoPE positions and merges patches in ``merge x merge`` blocks, and a grid it cannot
    divide would take it down instead of being refused."""
    per_token = spec.grid_cells_per_token
    merge = math.isqrt(per_token) if per_token else 0
    if merge < 2 or merge * merge != per_token or grid.size != 3:
        return
    _, h, w = (int(x) for x in grid.reshape(3))
    if h % merge or w % merge:
        raise InvalidItem(
            f"{modality} item grid {[int(x) for x in grid.reshape(3)]}: h and w must be "
            f"multiples of the merge size {merge}"
        )


def _refuse_metadata_only(feats: MultiModalFeatures[Any], ec_transfer: bool) -> None:
    """Upstream's rule: an item sent as metadata alone (its ``mm_metadata`` entry without
    ``kwargs_data``) needs ``ec_transfer_params``, whose connector brings its embeddings."""
    if not feats.mm_metadata:
        return
    for modality, entries in feats.mm_metadata.items():
        data = (feats.kwargs_data or {}).get(modality) or [None] * len(entries)
        if any(m is not None and d is None for m, d in zip(entries, data, strict=True)):
            raise InvalidItem(
                # With the params: their embeddings would come by encoder-cache transfer,
                # which this node does not do (the engine would get no pixels at all).
                "metadata-only multimodal items are not served here (no encoder-cache "
                "transfer): send their kwargs_data"
                if ec_transfer
                else "metadata-only multimodal items require ec_transfer_params",
                param=f"features.mm_metadata.{modality}",
            )


def _same_layout(have: Any, sent: Any) -> bool:
    """The item's layout (as ``rebind`` made it) and one sent for it: the same kind, and for
    a flat field the same dimension, both with the same ``keep_on_cpu``. A flat field's
    ``slices`` are not the item's own: vLLM gives every item cut from a processor batch the
    whole batch's slices (LFM2-VL's ``spatial_shapes`` arrives so), and ``rebind`` replaces
    them with the item's extent, which its data's shape already says."""
    if isinstance(have, FlatLayout) and isinstance(sent, FlatLayout):
        return have.dim == sent.dim and have.keep_on_cpu == sent.keep_on_cpu
    return bool(have == sent)


def _same(a: Any, b: Any) -> bool:
    """Equal nested tensors: dtype, shape and values."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(np.array_equal(a, b))
        )
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
