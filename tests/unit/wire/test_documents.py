"""Whole documents: negotiation, JSON/msgpack round trips and the structural checks."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pybase64
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem_wire import (
    DecodeLimits,
    ErrorBody,
    ErrorInfo,
    GenerateChoice,
    GenerateRequest,
    GenerateResponse,
    InvalidDocument,
    MalformedBase64,
    MalformedBody,
    MultiModalFeatures,
    PayloadTooLarge,
    PlaceholderRange,
    UsageInfo,
    WireFormat,
    check_placeholder_embeds,
    decode_document,
    decode_generate_request,
    decode_generate_requests,
    encode_document,
    encode_generate_request,
    encode_generate_request_parts,
    encode_generate_requests,
    format_for_accept,
    format_of_content_type,
    msgpack_fields,
    msgpack_pieces_with,
)

from .test_golden import golden_request

FORMATS = [WireFormat.JSON, WireFormat.MSGPACK]


@pytest.mark.parametrize("fmt", FORMATS)
def test_request_roundtrip(fmt):
    req = golden_request()
    back = decode_generate_request(encode_generate_request(req, fmt), fmt)
    assert back.token_ids == req.token_ids
    assert back.sampling_params == req.sampling_params
    assert bytes(back.features.kwargs_data["image"][0]) == req.features.kwargs_data["image"][0]
    assert back.features.mm_placeholders == req.features.mm_placeholders


@pytest.mark.parametrize("fmt", FORMATS)
def test_structured_outputs_roundtrip(fmt):
    # vLLM's StructuredOutputsParams fields, as render and upstream's generate write them.
    structured = [
        {"json": {"type": "object", "properties": {"a": {"$ref": "#"}}}, "_backend": None},
        {"json": '{"type": "string"}', "disable_any_whitespace": True},
        {"regex": "[a-c]{2,5}-\\d{3}", "whitespace_pattern": None},
        {"choice": ["red", "grün", ""]},
        {"grammar": 'root ::= "yes" | "no"'},
        {"json_object": True},
        {"structural_tag": '{"structures": [], "triggers": []}'},
    ]
    for so in structured:
        req = msgspec.structs.replace(
            golden_request(), sampling_params={"temperature": 0.0, "structured_outputs": so}
        )
        back = decode_generate_request(encode_generate_request(req, fmt), fmt)
        assert back.sampling_params == req.sampling_params


@pytest.mark.parametrize("fmt", FORMATS)
def test_request_list_roundtrip(fmt):
    reqs = [golden_request(), golden_request()]
    back = decode_generate_requests(encode_generate_requests(reqs, fmt), fmt)
    assert [r.token_ids for r in back] == [r.token_ids for r in reqs]


def test_msgpack_entries_are_views_into_the_body():
    body = encode_generate_request(golden_request(), WireFormat.MSGPACK)
    entry = decode_generate_request(body, WireFormat.MSGPACK).features.kwargs_data["image"][0]
    assert isinstance(entry, memoryview) and entry.obj is body


def test_upstream_shape_json_parses():
    # What upstream's render emits: every field present, placeholders without is_embed.
    doc = json.loads(encode_generate_request(golden_request(), WireFormat.JSON))
    assert set(doc["features"]) == {"mm_hashes", "mm_placeholders", "kwargs_data", "mm_metadata"}
    assert doc["features"]["mm_placeholders"]["image"][0] == {"offset": 1, "length": 2}
    doc["unknown_future_field"] = {"x": 1}
    req = decode_generate_request(json.dumps(doc).encode(), WireFormat.JSON)
    assert req.request_id == "r1"


def test_defaults_when_fields_are_missing():
    req = decode_generate_request(b'{"token_ids": [1, 2]}', WireFormat.JSON)
    assert req.features is None and req.sampling_params == {} and len(req.request_id) == 32


def _doc(**changes):
    doc = json.loads(encode_generate_request(golden_request(), WireFormat.JSON))
    for path, value in changes.items():
        target = doc
        keys = path.split("__")
        for k in keys[:-1]:
            target = target[int(k)] if isinstance(target, list) else target[k]
        target[keys[-1]] = value
    return json.dumps(doc).encode()


BAD = [
    ("empty", b"", MalformedBody),
    ("not json", b"{token_ids", MalformedBody),
    ("invalid utf8", b'{"token_ids": [1], "model": "\xff"}', MalformedBody),
    ("array", b"[]", InvalidDocument),
    ("no tokens", b'{"token_ids": []}', InvalidDocument),
    ("negative token", b'{"token_ids": [-1]}', InvalidDocument),
    ("string token", b'{"token_ids": ["a"]}', InvalidDocument),
    ("bad output mode", b'{"token_ids": [1], "output_mode": "x"}', InvalidDocument),
    ("modalities differ", _doc(features__mm_placeholders={"video": []}), InvalidDocument),
    ("lengths differ", _doc(features__mm_hashes={"image": ["a", "b"]}), InvalidDocument),
    (
        "placeholder past end",
        _doc(features__mm_placeholders={"image": [{"offset": 3, "length": 2}]}),
        InvalidDocument,
    ),
    (
        "zero length placeholder",
        _doc(features__mm_placeholders={"image": [{"offset": 0, "length": 0}]}),
        InvalidDocument,
    ),
    (
        "is_embed wrong length",
        _doc(features__mm_placeholders={"image": [{"offset": 1, "length": 2, "is_embed": [True]}]}),
        InvalidDocument,
    ),
    ("kwargs not base64", _doc(features__kwargs_data={"image": ["%%%%"]}), MalformedBase64),
    ("kwargs entry number", _doc(features__kwargs_data={"image": [5]}), InvalidDocument),
    ("kwargs entry object", _doc(features__kwargs_data={"image": [{"a": 1}]}), InvalidDocument),
    ("kwargs entry escaped", _doc(features__kwargs_data={"image": ["QUJ\u00e9"]}), MalformedBase64),
    ("kwargs wrong modality", _doc(features__kwargs_data={"video": [None]}), InvalidDocument),
    ("kwargs too many", _doc(features__kwargs_data={"image": [None, None]}), InvalidDocument),
    ("content parts too", _doc(content_parts=[{"type": "text"}]), InvalidDocument),
]


@pytest.mark.parametrize(("name", "body", "err"), BAD, ids=[b[0] for b in BAD])
def test_bad_documents(name, body, err):
    with pytest.raises(err) as info:
        decode_generate_request(body, WireFormat.JSON)
    assert len(info.value.message) < 400


def _two_ranges(image, video):
    doc = json.loads(_doc())
    doc["token_ids"] = [1] * 10
    doc["features"]["mm_hashes"] = {"image": ["a"], "video": ["b"]}
    doc["features"]["mm_placeholders"] = {"image": [image], "video": [video]}
    doc["features"]["kwargs_data"] = None
    return json.dumps(doc).encode()


def test_placeholders_sharing_an_embed_position_are_refused():
    body = _two_ranges(
        {"offset": 2, "length": 4, "is_embed": [False, True, True, True]},
        {"offset": 5, "length": 2, "is_embed": [True, False]},
    )
    with pytest.raises(InvalidDocument, match="share embed positions"):
        decode_generate_request(body, WireFormat.JSON)


def test_placeholders_may_share_a_token_that_is_no_embed_of_either():
    # Gemma 3's two adjacent images: the "\n\n" token that closes one opens the next.
    body = _two_ranges(
        {"offset": 2, "length": 4, "is_embed": [False, True, True, False]},
        {"offset": 5, "length": 3, "is_embed": [False, True, False]},
    )
    req = decode_generate_request(body, WireFormat.JSON)
    assert [p.offset for p in req.features.mm_placeholders["video"]] == [5]


def test_overlapping_ranges_without_masks_are_left_to_the_model():
    # Upstream render sends no is_embed: generate decides from the tokens.
    body = _two_ranges({"offset": 2, "length": 4}, {"offset": 5, "length": 2})
    decode_generate_request(body, WireFormat.JSON)
    with pytest.raises(InvalidDocument, match="share embed positions"):
        check_placeholder_embeds(
            [PlaceholderRange(offset=2, length=4), PlaceholderRange(offset=5, length=2)]
        )


def test_a_range_inside_another_is_refused():
    body = _two_ranges({"offset": 1, "length": 6}, {"offset": 2, "length": 2})
    with pytest.raises(InvalidDocument, match="contain one another"):
        decode_generate_request(body, WireFormat.JSON)


def test_msgpack_entry_must_be_bin():
    doc = msgspec.json.decode(_doc())
    body = msgspec.msgpack.encode(doc)  # kwargs entries stay base64 *strings*
    with pytest.raises(InvalidDocument):
        decode_generate_request(body, WireFormat.MSGPACK)


def test_body_limit():
    with pytest.raises(PayloadTooLarge):
        decode_generate_request(_doc(), WireFormat.JSON, DecodeLimits(max_body_bytes=64))


def test_item_limit_in_msgpack_mode():
    body = encode_generate_request(golden_request(), WireFormat.MSGPACK)
    with pytest.raises(PayloadTooLarge):
        decode_generate_request(body, WireFormat.MSGPACK, DecodeLimits(max_item_bytes=10))


@pytest.mark.parametrize(
    ("header", "fmt"),
    [
        (None, WireFormat.JSON),
        ("application/json; charset=utf-8", WireFormat.JSON),
        ("application/vnd.msgpack", WireFormat.MSGPACK),
        ("Application/MsgPack", WireFormat.MSGPACK),
    ],
)
def test_content_type(header, fmt):
    assert format_of_content_type(header) is fmt


def test_unknown_content_type():
    with pytest.raises(InvalidDocument):
        format_of_content_type("text/xml")


def test_accept():
    assert format_for_accept(None) is WireFormat.JSON
    assert format_for_accept("*/*") is WireFormat.JSON
    assert (
        format_for_accept("application/json, application/vnd.msgpack;q=0.9") is WireFormat.MSGPACK
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_response_and_error_documents(fmt):
    resp = GenerateResponse(
        request_id="r",
        choices=[GenerateChoice(index=0, token_ids=[3, 4], finish_reason="length")],
        usage=UsageInfo(prompt_tokens=2, completion_tokens=2, total_tokens=4),
    )
    assert decode_document(encode_document(resp, fmt), GenerateResponse, fmt) == resp
    err = ErrorBody(ErrorInfo(type="mm_cache_miss", message="m", code=409))
    assert decode_document(encode_document(err, fmt), ErrorBody, fmt) == err
    if fmt is WireFormat.JSON:
        assert json.loads(encode_document(err, fmt)) == {
            "error": {"type": "mm_cache_miss", "message": "m", "code": 409}
        }


def _many_entries_request(request_id: str = 'r\x00"\\1') -> GenerateRequest[Any]:
    # Two modalities, metadata, a null entry (held by the generate node), an entry already in
    # base64 text, and NUL / quote / backslash in strings the encoder has to escape.
    return GenerateRequest(
        token_ids=[1, 5, 5, 2, 7, 7, 7, 3],
        request_id=request_id,
        features=MultiModalFeatures(
            mm_hashes={"image": ["ab" * 32, "cd" * 32], "video": ["ef" * 32]},
            mm_placeholders={
                "image": [
                    PlaceholderRange(offset=1, length=2),
                    PlaceholderRange(offset=3, length=1),
                ],
                "video": [PlaceholderRange(offset=4, length=3)],
            },
            kwargs_data={"image": [b"\x00item-0\x00", None], "video": ["aXRlbS0y"]},
            mm_metadata={"image": [b"meta-0", b"meta-1"], "video": [b"\x00"]},
        ),
        sampling_params={"stop": ["\x00"]},
    )


def test_json_parts_join_to_the_document_with_entries_as_their_own_pieces():
    req = _many_entries_request()
    parts = encode_generate_request_parts(req, WireFormat.JSON)
    binary_entries = [b"\x00item-0\x00", b"meta-0", b"meta-1", b"\x00"]
    assert parts[1::2] == [pybase64.b64encode(e) for e in binary_entries]
    doc = json.loads(b"".join(parts))
    assert doc["request_id"] == req.request_id and doc["sampling_params"] == {"stop": ["\x00"]}
    feats = doc["features"]
    assert feats["kwargs_data"] == {
        "image": [pybase64.b64encode(b"\x00item-0\x00").decode(), None],
        "video": ["aXRlbS0y"],
    }
    assert feats["mm_metadata"]["video"] == [pybase64.b64encode(b"\x00").decode()]
    back = decode_generate_request(b"".join(parts), WireFormat.JSON)
    assert bytes(back.features.kwargs_data["video"][0]) == b"item-2"


@pytest.mark.parametrize("fmt", FORMATS)
def test_parts_of_a_list_equal_the_list_encoding(fmt):
    reqs = [_many_entries_request("a"), golden_request(), _many_entries_request("b")]
    joined = b"".join(encode_generate_request_parts(reqs, fmt))
    assert joined == encode_generate_requests(reqs, fmt)
    assert [r.request_id for r in decode_generate_requests(joined, fmt)] == ["a", "r1", "b"]


@settings(max_examples=60, deadline=None)
@given(
    request_id=st.text(max_size=20),
    entries=st.lists(st.one_of(st.none(), st.binary(max_size=40)), min_size=1, max_size=5),
)
def test_json_parts_round_trip_any_strings_and_entries(request_id, entries):
    n = len(entries)
    req = GenerateRequest(
        token_ids=list(range(n)),
        request_id=request_id,
        features=MultiModalFeatures(
            mm_hashes={"image": ["ab" * 32] * n},
            mm_placeholders={"image": [PlaceholderRange(offset=i, length=1) for i in range(n)]},
            kwargs_data={"image": entries},
        ),
    )
    parts = encode_generate_request_parts(req, WireFormat.JSON)
    reserved: list[int] = []
    back = decode_generate_request(b"".join(parts), WireFormat.JSON, reserve=reserved.append)
    assert back.request_id == request_id
    got = back.features.kwargs_data["image"]
    assert [None if e is None else bytes(e) for e in got] == entries
    # What the entries decode to, exactly, from their base64 lengths (padding and all).
    assert reserved == [sum(len(e) for e in entries if e is not None)]


class _Refused(Exception):
    pass


def test_json_entries_are_reserved_once_before_any_is_decoded():
    body = encode_generate_request(_many_entries_request(), WireFormat.JSON)
    sizes = len(b"\x00item-0\x00") + len(b"item-2") + len(b"meta-0meta-1") + 1
    reserved: list[int] = []
    decode_generate_request(body, WireFormat.JSON, reserve=reserved.append)
    assert reserved == [sizes]

    def refuse(nbytes: int) -> None:
        raise _Refused(nbytes)

    with pytest.raises(_Refused):  # the caller's refusal stops the decode
        decode_generate_request(body, WireFormat.JSON, reserve=refuse)
    # msgpack entries are views into the body: nothing to reserve.
    binary = encode_generate_request(_many_entries_request(), WireFormat.MSGPACK)
    decode_generate_request(binary, WireFormat.MSGPACK, reserve=refuse)


def _changed(req: GenerateRequest[Any], changes: dict[str, Any]) -> GenerateRequest[Any]:
    return msgspec.structs.replace(req, **changes)


@settings(max_examples=80, deadline=None)
@given(
    request_id=st.text(max_size=20),
    big=st.integers(min_value=0, max_value=200_000),
    entries=st.lists(st.one_of(st.none(), st.binary(max_size=40)), min_size=1, max_size=5),
    changes=st.fixed_dictionaries(
        {},
        optional={
            "request_id": st.text(max_size=20),
            "sampling_params": st.dictionaries(
                st.sampled_from(["max_tokens", "seed"]), st.integers(0, 99)
            ),
            "stream": st.booleans(),
            "stream_options": st.none(),
            "return_token_ids": st.booleans(),
        },
    ),
)
def test_a_relayed_request_with_changes_is_the_changed_request(request_id, big, entries, changes):
    n = len(entries)
    entries = [b"\x07" * big, *entries]  # one item past the size that goes out as a view
    req = GenerateRequest(
        token_ids=list(range(n + 1)),
        request_id=request_id,
        features=MultiModalFeatures(
            mm_hashes={"image": ["ab" * 32] * (n + 1)},
            mm_placeholders={"image": [PlaceholderRange(offset=i, length=1) for i in range(n + 1)]},
            kwargs_data={"image": entries},
        ),
        sampling_params={"temperature": 0.0},
    )
    body = encode_generate_request(req, WireFormat.MSGPACK)
    (fields,) = msgpack_fields(body)
    pieces = msgpack_pieces_with(fields, changes)
    relayed = b"".join(pieces)
    want = _changed(req, changes)
    assert decode_generate_request(relayed, WireFormat.MSGPACK) == decode_generate_request(
        encode_generate_request(want, WireFormat.MSGPACK), WireFormat.MSGPACK
    )
    # The items are not copied: large features go out as a view into the body they came
    # from (large as a whole: small items beside a big one may carry it past the size).
    views = [p for p in pieces if isinstance(p, memoryview)]
    large = memoryview(fields["features"]).nbytes >= 64 * 1024
    assert [v.obj for v in views] == ([fields["features"]] if large else [])


def test_each_request_of_a_relayed_list_keeps_its_own_fields():
    reqs = [_many_entries_request("a"), golden_request()]
    body = encode_generate_requests(reqs, WireFormat.MSGPACK)
    fields = msgpack_fields(body, many=True)
    relayed = [b"".join(msgpack_pieces_with(f, {"stream": True})) for f in fields]
    got = [decode_generate_request(r, WireFormat.MSGPACK) for r in relayed]
    assert [g.request_id for g in got] == ["a", "r1"] and all(g.stream for g in got)
    assert got[1].token_ids == golden_request().token_ids


def test_a_body_that_is_not_a_msgpack_map_is_refused():
    with pytest.raises(MalformedBody):
        msgpack_fields(b"\x93\x01\x02\x03")
