"""The routing key of a generate body, read without decoding its tensors or re-encoding it."""

from __future__ import annotations

import asyncio

import msgspec

from tandem_client.routing import affinity_key
from tandem_http import Slot, decoded
from tandem_wire import IDENTITY, MalformedBody, WireFormat, new_request_id

__all__ = ["INLINE_HEAD_BYTES", "generate_route"]

INLINE_HEAD_BYTES = 1024 * 1024
"""Plain bodies up to this size have their head read on the event loop; larger ones, and every
compressed one, are read in a worker thread: zstd releases the GIL while it inflates, and a
long JSON scan (~0.25 ms per MB) at least yields at the interpreter's switch interval."""


class _Features(msgspec.Struct):
    mm_hashes: dict[str, list[str]] = {}


class _Head(msgspec.Struct):
    # Only what routing reads: every other field (kwargs_data above all) is skipped by the
    # decoder without being materialized.
    request_id: str | None = None
    features: _Features | None = None


_JSON = msgspec.json.Decoder(_Head)
_MSGPACK = msgspec.msgpack.Decoder(_Head)


def _head(body: bytes, fmt: WireFormat) -> _Head | None:
    try:
        return _JSON.decode(body) if fmt is WireFormat.JSON else _MSGPACK.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None  # the node judges it, and answers why
    except RecursionError:
        # Even skipped values are walked: a body nested past the interpreter's depth is
        # refused here as the nodes' decoder refuses it (tandem_wire's documents).
        raise MalformedBody("body nests too deeply") from None


async def generate_route(
    route_key: str | None,
    body: bytes,
    coding: str,
    fmt: WireFormat,
    max_bytes: int,
    slot: Slot | None = None,
) -> tuple[str, str | None]:
    """(routing key, ``request_id``) of a generate request, with the least work on its body.

    The route-key header marks a Tandem client (TRL's ``VLLMClient`` never sends it, nor
    compresses): its key is taken as is and the body is not touched at all, not even decoded,
    so its id is not read (None: not a TRL request). Without the header the body's head gives
    both (decoded first if compressed, capped at ``max_bytes`` and charged to ``slot`` while
    it is read, see ``tandem_http.decoded``); msgspec skips the tensors.
    """
    if route_key:
        return route_key, None
    if coding == IDENTITY and len(body) <= INLINE_HEAD_BYTES:
        return _route_of_head(_head(body, fmt))
    plain = await decoded(slot, body, coding, max_bytes)
    try:
        return _route_of_head(await asyncio.to_thread(_head, plain, fmt))
    finally:
        if slot is not None and plain is not body:
            slot.give_back(len(plain))  # only the head was wanted: the copy is dropped now


def _route_of_head(head: _Head | None) -> tuple[str, str | None]:
    if head is None:
        return new_request_id(), None
    feats = head.features
    key = affinity_key(feats.mm_hashes if feats else None, head.request_id)
    return key or new_request_id(), head.request_id
