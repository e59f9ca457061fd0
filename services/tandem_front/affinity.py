"""The routing key of a generate body, read without decoding its tensors or re-encoding it."""

from __future__ import annotations

import msgspec

from tandem_client.routing import affinity_key
from tandem_wire import WireFormat, new_request_id

__all__ = ["routing_key", "request_id_of_body"]


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
        return None


def request_id_of_body(body: bytes, fmt: WireFormat) -> str | None:
    """The body's ``request_id``, if it parses and has one."""
    head = _head(body, fmt)
    return None if head is None else head.request_id


def routing_key(body: bytes, fmt: WireFormat) -> str:
    """The first item hash (modalities in name order), as tandem_client routes, else the
    request id; a random key when the body names neither or does not parse (the generate node
    answers the typed error for a bad body)."""
    head = _head(body, fmt)
    if head is None:
        return new_request_id()
    feats = head.features
    return affinity_key(feats.mm_hashes if feats else None, head.request_id) or new_request_id()
