"""Whole wire documents: content negotiation, JSON/msgpack encode and checked decode."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

import msgspec
import pybase64

from .codec import b64decode_item_bytes
from .errors import InvalidDocument, MalformedBase64, MalformedBody, PayloadTooLarge
from .limits import DEFAULT_LIMITS, DecodeLimits
from .protocol import GenerateRequest, PlaceholderRange

__all__ = [
    "JSON_CONTENT_TYPE",
    "MSGPACK_CONTENT_TYPE",
    "ItemBytes",
    "WireFormat",
    "format_of_content_type",
    "format_for_accept",
    "WIRE_TRANSFORMS_HEADER",
    "WEIGHT_VERSIONS_HEADER",
    "PROMPT_TOKENS_DETAILS_HEADER",
    "ANY_WIRE_TRANSFORM",
    "BODY_CODING_HEADER",
    "accepted_wire_transforms",
    "decode_generate_request",
    "decode_generate_requests",
    "encode_generate_request",
    "encode_generate_requests",
    "encode_generate_request_parts",
    "msgpack_fields",
    "msgpack_pieces_with",
    "encode_document",
    "decode_document",
    "check_features",
]

JSON_CONTENT_TYPE = "application/json"
MSGPACK_CONTENT_TYPE = "application/vnd.msgpack"
_MSGPACK_ALIASES = frozenset({MSGPACK_CONTENT_TYPE, "application/msgpack", "application/x-msgpack"})

ItemBytes: TypeAlias = bytes | bytearray | memoryview
"""A msgpack-encoded kwargs item: what ``kwargs_data`` entries hold once decoded."""

T = TypeVar("T")


class WireFormat(enum.Enum):
    """The two body encodings: upstream-compatible JSON, and our msgpack extension."""

    JSON = JSON_CONTENT_TYPE
    MSGPACK = MSGPACK_CONTENT_TYPE

    @property
    def content_type(self) -> str:
        return self.value


def _media_type(header: str | None) -> str:
    return (header or "").split(";", 1)[0].strip().lower()


def format_of_content_type(content_type: str | None) -> WireFormat:
    """The format of a request body by its Content-Type (JSON when absent)."""
    media = _media_type(content_type)
    if media in _MSGPACK_ALIASES:
        return WireFormat.MSGPACK
    if media in ("", JSON_CONTENT_TYPE) or media.endswith("+json"):
        return WireFormat.JSON
    raise InvalidDocument(f"unsupported content type {media[:64]!r}; send JSON or msgpack")


def format_for_accept(accept: str | None) -> WireFormat:
    """The response format for an Accept header: msgpack only when the client asks for it."""
    for part in (accept or "").split(","):
        if _media_type(part) in _MSGPACK_ALIASES:
            return WireFormat.MSGPACK
    return WireFormat.JSON


WIRE_TRANSFORMS_HEADER = "x-tandem-wire-transforms"
"""Request header to render: the wire transforms (``FieldTransform`` names, comma-separated, or
``*`` for any the model has) the caller's generate nodes undo. Render applies them only to a
binary (msgpack) answer; JSON answers stay upstream's bytes whatever this says."""

SYSTEM_FINGERPRINT_HEADER = "x-tandem-system-fingerprint"
"""Response header of generate's ``/inference/v1/generate``: the engine's ``system_fingerprint``
as ``vllm serve`` computes it (vLLM's ``get_system_fingerprint``), which the front door writes
into its OpenAI answers where ``vllm serve`` does. Absent when the engine has none."""

WEIGHT_VERSIONS_HEADER = "x-tandem-weight-versions"
"""Request header to the front door's OpenAI routes (``/v1/chat/completions``,
``/v1/completions``): ``true`` puts generate's ``weight_versions`` (``WeightVersionSpan``s over
the choice's output tokens) on each choice of the answer, streamed on the chunk that finishes
it. Absent (or anything else), the answer is ``vllm serve``'s, field for field."""

PROMPT_TOKENS_DETAILS_HEADER = "x-tandem-prompt-tokens-details"
"""Request header to generate's ``/inference/v1/generate``: ``true`` puts the engine's
prefix-cache hits in the answer's usage (``prompt_tokens_details.cached_tokens``, when there
are any; streamed, in the usage chunk ``stream_options.include_usage`` asks for), as every
answer of a node started with ``--enable-prompt-tokens-details`` (upstream's flag) has them.
The front door asks it for the Responses API, whose usage always counts them."""

ANY_WIRE_TRANSFORM = "*"
"""In ``WIRE_TRANSFORMS_HEADER``: every transform the render node has for its model (those
that only pay under compression only with ``BODY_CODING_HEADER``)."""

BODY_CODING_HEADER = "x-tandem-body-coding"
"""Request header to render: the content coding (``zstd``) the generate bodies the caller makes
of the answer travel in. With ``*`` it also grants the transforms that shrink a body only under
a coding (row deltas); ``Accept-Encoding`` says nothing of the next hop, so it cannot."""

_MAX_ACCEPTED_TRANSFORMS = 32


def accepted_wire_transforms(header: str | None) -> frozenset[str]:
    """The transform names a ``WIRE_TRANSFORMS_HEADER`` value accepts (empty when absent);
    ``ANY_WIRE_TRANSFORM`` stays in the set as itself."""
    names = (n.strip() for n in (header or "").split(",")[:_MAX_ACCEPTED_TRANSFORMS])
    return frozenset(n for n in names if n)


# Decoders are built once (msgspec compiles the schema); binary mode decodes bins as
# memoryviews into the body, so item bytes are never copied out of the request.
# JSON entries arrive as Raw spans of the body (a quoted string or null), so megabytes of
# base64 are decoded straight from the body instead of through an intermediate str.
_JSON_REQUEST = msgspec.json.Decoder(GenerateRequest[msgspec.Raw])
_JSON_REQUESTS = msgspec.json.Decoder(list[GenerateRequest[msgspec.Raw]])
_MSGPACK_REQUEST = msgspec.msgpack.Decoder(GenerateRequest[memoryview | None])
_MSGPACK_REQUESTS = msgspec.msgpack.Decoder(list[GenerateRequest[memoryview | None]])
_JSON_ENCODER = msgspec.json.Encoder()
_MSGPACK_ENCODER = msgspec.msgpack.Encoder()


def _run_decoder(decoder: Any, body: ItemBytes, limits: DecodeLimits) -> Any:
    size = memoryview(body).nbytes
    if size > limits.max_body_bytes:
        raise PayloadTooLarge(f"body of {size} bytes exceeds {limits.max_body_bytes}")
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise InvalidDocument(_short(str(exc))) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise MalformedBody(f"body is not valid {_fmt_name(decoder)}: {_short(str(exc))}") from None
    except RecursionError:
        raise MalformedBody("body nests too deeply") from None


def _fmt_name(decoder: Any) -> str:
    return "JSON" if isinstance(decoder, msgspec.json.Decoder) else "msgpack"


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _map_entries(
    entries: dict[str, list[Any]] | None, fn: Callable[[Any], Any]
) -> dict[str, list[Any]] | None:
    if entries is None:
        return None
    return {m: [None if e is None else fn(e) for e in items] for m, items in entries.items()}


_NULL = b"null"


def _raw_json_entry(raw: msgspec.Raw, limits: DecodeLimits) -> ItemBytes | None:
    span = memoryview(raw)
    if span == _NULL:
        return None
    if span.nbytes < 2 or span[0] != 0x22 or span[-1] != 0x22:  # 0x22 is '"'
        raise InvalidDocument("kwargs entries must be base64 strings or null")
    # A string with JSON escapes in it is not base64 either: strict decoding refuses it.
    return b64decode_item_bytes(span[1:-1], limits)


def _json_entries_bytes(req: GenerateRequest[Any]) -> int:
    """What a JSON document's base64 entries decode to, from their lengths (strict base64:
    three bytes per four characters, less its padding); nothing is decoded."""
    feats = req.features
    total = 0
    if feats is None:
        return total
    for entries in (feats.kwargs_data, feats.mm_metadata):
        for items in (entries or {}).values():
            for raw in items:
                whole = memoryview(raw)
                if whole == _NULL:
                    continue
                span = whole[1:-1]  # inside the quotes (checked when decoded)
                pad = sum(1 for c in span[-2:] if c == 0x3D)  # 0x3D is '='
                total += max(0, span.nbytes // 4 * 3 - pad)
    return total


def _with_entries(req: GenerateRequest[Any], fn: Callable[[Any], Any]) -> GenerateRequest[Any]:
    feats = req.features
    if feats is None or (feats.kwargs_data is None and feats.mm_metadata is None):
        return req
    new = msgspec.structs.replace(
        feats,
        kwargs_data=_map_entries(feats.kwargs_data, fn),
        mm_metadata=_map_entries(feats.mm_metadata, fn),
    )
    return msgspec.structs.replace(req, features=new)


def check_features(req: GenerateRequest[Any]) -> None:
    """Model-independent checks of ``features`` (upstream's validators, plus ``is_embed``).

    Same modalities everywhere, lists parallel to ``mm_hashes``, placeholders inside
    ``token_ids`` whose embed positions never overlap, ``is_embed`` as long as its range.
    """
    feats = req.features
    if feats is None:
        return
    if req.content_parts:
        raise InvalidDocument("content_parts and features are mutually exclusive")
    modalities = set(feats.mm_hashes)
    if set(feats.mm_placeholders) != modalities:
        raise InvalidDocument("mm_hashes and mm_placeholders must use the same modalities")
    for name, entries in (("kwargs_data", feats.kwargs_data), ("mm_metadata", feats.mm_metadata)):
        if entries is not None and set(entries) != modalities:
            raise InvalidDocument(f"{name} must use the same modalities as mm_hashes")
    n_tokens = len(req.token_ids)
    ranges: list[PlaceholderRange] = []
    for modality in modalities:
        count = len(feats.mm_hashes[modality])
        if len(feats.mm_placeholders[modality]) != count:
            raise InvalidDocument(f"{modality}: mm_placeholders and mm_hashes differ in length")
        for name, entries in (
            ("kwargs_data", feats.kwargs_data),
            ("mm_metadata", feats.mm_metadata),
        ):
            if entries is not None and len(entries[modality]) != count:
                raise InvalidDocument(f"{modality}: {name} and mm_hashes differ in length")
        for p in feats.mm_placeholders[modality]:
            if p.offset + p.length > n_tokens:
                raise InvalidDocument("mm_placeholders must remain within the token_ids sequence")
            if p.is_embed is not None and len(p.is_embed) != p.length:
                raise InvalidDocument("is_embed must have one flag per placeholder token")
            ranges.append(p)
    # Upstream render sends no is_embed: where it is missing the model decides (generate
    # checks again with the masks it computes from the tokens).
    check_placeholder_embeds(ranges, missing_mask_means_all=False)


def check_placeholder_embeds(
    ranges: list[PlaceholderRange], *, missing_mask_means_all: bool = True
) -> None:
    """Placeholders may touch and share tokens that are no embed position of either (Gemma 3
    merges the ``\\n\\n`` around adjacent images into one token both ranges cover), as vLLM's
    engine takes them; an embed position claimed twice, or a range inside another, is refused.
    A range without ``is_embed`` counts as all embeds when ``missing_mask_means_all``, else as
    unknown (refused nothing but containment).

    Sorted by offset, the ranges' ends never decrease, so any overlap of two ranges lies within
    the overlaps of neighbours: checking neighbours checks every pair.
    """
    ranges = sorted(ranges, key=lambda p: (p.offset, p.offset + p.length))
    for a, b in zip(ranges, ranges[1:], strict=False):
        a_end, b_end = a.offset + a.length, b.offset + b.length
        if b.offset >= a_end:
            continue
        if b_end < a_end:
            raise InvalidDocument("mm_placeholders must not contain one another")
        if any(_embeds_in(p, b.offset, a_end, missing_mask_means_all) for p in (a, b)):
            raise InvalidDocument("mm_placeholders must not share embed positions")


def _embeds_in(p: PlaceholderRange, start: int, end: int, missing_mask_means_all: bool) -> bool:
    """Whether any of ``p``'s embed positions lies in ``[start, end)``."""
    if p.is_embed is None:
        return missing_mask_means_all
    return any(p.is_embed[start - p.offset : end - p.offset])


def decode_generate_request(
    body: ItemBytes,
    fmt: WireFormat,
    limits: DecodeLimits = DEFAULT_LIMITS,
    reserve: Callable[[int], None] | None = None,
) -> GenerateRequest[ItemBytes | None]:
    """Decode and check one generate request; kwargs entries come back as item bytes.

    JSON entries are base64-decoded (strictly); msgpack entries are zero-copy views into
    ``body``. ``reserve`` is called once with the bytes the JSON entries decode to, before any
    is decoded (a server charges them to the request, and may refuse by raising); msgpack
    entries allocate nothing. Raises a WireError for any malformed or invalid input.
    """
    if fmt is WireFormat.JSON:
        req = _run_decoder(_JSON_REQUEST, body, limits)
        if reserve is not None:
            reserve(_json_entries_bytes(req))
        req = _with_entries(req, lambda raw: _raw_json_entry(raw, limits))
    else:
        req = _run_decoder(_MSGPACK_REQUEST, body, limits)
        _check_entry_sizes(req, limits)
    check_features(req)
    return req  # type: ignore[no-any-return]


def decode_generate_requests(
    body: ItemBytes, fmt: WireFormat, limits: DecodeLimits = DEFAULT_LIMITS
) -> list[GenerateRequest[ItemBytes | None]]:
    """Decode a list of generate requests (the ``/v1/completions/render`` answer)."""
    if fmt is WireFormat.JSON:
        reqs = _run_decoder(_JSON_REQUESTS, body, limits)
        reqs = [_with_entries(r, lambda raw: _raw_json_entry(raw, limits)) for r in reqs]
    else:
        reqs = _run_decoder(_MSGPACK_REQUESTS, body, limits)
        for r in reqs:
            _check_entry_sizes(r, limits)
    for r in reqs:
        check_features(r)
    return reqs  # type: ignore[no-any-return]


def _check_entry_sizes(req: GenerateRequest[Any], limits: DecodeLimits) -> None:
    feats = req.features
    if feats is None:
        return
    for entries in (feats.kwargs_data, feats.mm_metadata):
        for items in (entries or {}).values():
            for e in items:
                if e is not None and e.nbytes > limits.max_item_bytes:
                    raise PayloadTooLarge(
                        f"item of {e.nbytes} bytes exceeds {limits.max_item_bytes}"
                    )


# Stands for one base64 entry in the encoded JSON: msgspec escapes NUL in every string it
# encodes, so the only NUL bytes in its output are these marks.
_ENTRY_MARK = msgspec.Raw(b'"\x00"')


def _json_parts(doc: GenerateRequest[Any] | list[GenerateRequest[Any]]) -> list[bytes]:
    encoded: list[bytes] = []

    def mark(entry: ItemBytes | str) -> str | msgspec.Raw:
        if isinstance(entry, str):
            return entry
        # Base64 goes out as its own piece: msgspec would scan megabytes of it for characters
        # to escape (6x slower, measured; base64 has none) and copy it into its buffer.
        encoded.append(pybase64.b64encode(entry))
        return _ENTRY_MARK

    # Entries are marked in the order msgspec writes them (field, then key, then list order).
    frame = _JSON_ENCODER.encode(_with_doc_entries(doc, mark)).split(b"\x00")
    parts = [frame[0]]
    for data, text in zip(encoded, frame[1:], strict=True):
        parts += (data, text)
    return parts


def encode_generate_request_parts(
    req: GenerateRequest[Any] | list[GenerateRequest[Any]], fmt: WireFormat
) -> list[bytes]:
    """A generate request (or a list of them) encoded as pieces whose concatenation is
    ``encode_generate_request(s)``: a server can send them one after the other, so megabytes
    of base64 are never copied into one buffer."""
    if fmt is WireFormat.JSON:
        return _json_parts(req)
    return [_MSGPACK_ENCODER.encode(_with_doc_entries(req, _as_bytes_entry))]


def _with_doc_entries(
    doc: GenerateRequest[Any] | list[GenerateRequest[Any]], fn: Callable[[Any], Any]
) -> Any:
    if isinstance(doc, list):
        return [_with_entries(r, fn) for r in doc]
    return _with_entries(doc, fn)


_VIEW_AT_LEAST = 64 * 1024
"""A field value at least this large goes out as a view into its source, not copied into the
head pieces around it (smaller ones are copied: one write per field would cost more)."""

_MSGPACK_FIELDS = msgspec.msgpack.Decoder(dict[str, msgspec.Raw])
_MSGPACK_FIELDS_LIST = msgspec.msgpack.Decoder(list[dict[str, msgspec.Raw]])


def msgpack_fields(body: ItemBytes, many: bool = False) -> list[dict[str, msgspec.Raw]]:
    """The top-level fields of a msgpack generate request (``many``: of each request of a
    list), each value still encoded: a view into ``body``, nothing decoded or copied. For a
    body already checked with ``decode_generate_request(s)``; raises WireError otherwise."""
    try:
        return _MSGPACK_FIELDS_LIST.decode(body) if many else [_MSGPACK_FIELDS.decode(body)]
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MalformedBody(f"not a msgpack generate request: {exc}") from None


def msgpack_pieces_with(
    fields: dict[str, msgspec.Raw], changes: dict[str, Any]
) -> list[bytes | memoryview]:
    """One msgpack generate request: ``fields`` (from ``msgpack_fields``) with ``changes``
    set, as pieces whose concatenation is the document. Large unchanged values (the items)
    are views into the body they came from: a relay that sets a request's id and sampling
    neither re-encodes nor copies the megabytes it passes on."""
    merged: dict[str, Any] = {**fields, **changes}
    pieces: list[bytes | memoryview] = []
    head = bytearray(_map_header(len(merged)))
    for name, value in merged.items():
        head += _MSGPACK_ENCODER.encode(name)
        if name in changes:
            head += _MSGPACK_ENCODER.encode(value)
            continue
        view = memoryview(value)
        if view.nbytes < _VIEW_AT_LEAST:
            head += view
            continue
        pieces += (bytes(head), view)
        head = bytearray()
    if head:
        pieces.append(bytes(head))
    return pieces


def _map_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x80 | n])
    if n < 1 << 16:
        return b"\xde" + n.to_bytes(2, "big")
    return b"\xdf" + n.to_bytes(4, "big")


def encode_generate_request(req: GenerateRequest[Any], fmt: WireFormat) -> bytes:
    """Encode a generate request whose kwargs entries are item bytes (or already base64 text)."""
    return b"".join(encode_generate_request_parts(req, fmt))


def encode_generate_requests(reqs: list[GenerateRequest[Any]], fmt: WireFormat) -> bytes:
    """Encode a list of generate requests (the ``/v1/completions/render`` answer)."""
    return b"".join(encode_generate_request_parts(reqs, fmt))


def _as_bytes_entry(entry: ItemBytes | str) -> ItemBytes:
    if isinstance(entry, str):
        try:
            return pybase64.b64decode(entry, validate=True)
        except ValueError:
            raise MalformedBase64("kwargs entry is not valid base64") from None
    return entry


def encode_document(obj: Any, fmt: WireFormat) -> bytes:
    """Encode any wire struct (responses, errors) in the given format."""
    return _JSON_ENCODER.encode(obj) if fmt is WireFormat.JSON else _MSGPACK_ENCODER.encode(obj)


_DOC_DECODERS: dict[tuple[Any, WireFormat], Any] = {}


def decode_document(
    body: ItemBytes, type_: type[T], fmt: WireFormat, limits: DecodeLimits = DEFAULT_LIMITS
) -> T:
    """Decode any wire struct (responses, errors) with a cached typed decoder."""
    key = (type_, fmt)
    decoder = _DOC_DECODERS.get(key)
    if decoder is None:
        mod = msgspec.json if fmt is WireFormat.JSON else msgspec.msgpack
        decoder = _DOC_DECODERS[key] = mod.Decoder(type_)
    return _run_decoder(decoder, body, limits)  # type: ignore[no-any-return]
