"""Generate's binary stream (``tandem_wire.streams``): golden frame bytes, round trips cut at
any chunk boundary, the Accept negotiation, and hostile frames refused with typed errors."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem_wire import (
    ChoiceLogprobs,
    DecodeLimits,
    ErrorBody,
    ErrorInfo,
    GenerateStreamChoice,
    GenerateStreamResponse,
    MalformedFrame,
    PayloadTooLarge,
    TokenLogprob,
    TokenLogprobContent,
    UsageInfo,
    WireFormat,
    encode_document,
    error_types,
)
from tandem_wire.streams import (
    END_FRAME,
    STREAM_CONTENT_TYPE,
    FrameReader,
    StreamFrameKind,
    accepts_stream_frames,
    decode_error,
    decode_event,
    encode_error_frame,
    encode_event_frame,
    is_stream_frames,
)


def golden_event() -> GenerateStreamResponse:
    return GenerateStreamResponse(
        request_id="r1",
        choices=[GenerateStreamChoice(index=0, token_ids=[7], finish_reason="length")],
    )


GOLDEN = Path(__file__).parent / "golden"
# The event above: kind 1 (EVENT), a 166-byte payload (00 00 00 a6), then the msgpack map of
# the SSE event's document (86: six fields, in the struct's order).
GOLDEN_EVENT = bytes.fromhex((GOLDEN / "stream_event.frame.hex").read_text().strip())


def test_an_event_frame_is_its_golden_bytes():
    assert encode_event_frame(golden_event()) == GOLDEN_EVENT
    assert GOLDEN_EVENT[:5] == b"\x01\x00\x00\x00\xa6"
    # The payload is the SSE event's own document, as msgpack.
    sse = encode_document(golden_event(), WireFormat.JSON)
    assert msgspec.msgpack.decode(GOLDEN_EVENT[5:]) == msgspec.json.decode(sse)


def test_the_end_and_error_frames_are_their_golden_bytes():
    assert END_FRAME == b"\x03\x00\x00\x00\x00"
    error = ErrorBody(ErrorInfo(type="unavailable", message="m", code=503))
    frame = encode_error_frame(error)
    # Kind 2 (ERROR), a 43-byte payload: {"error": {"type", "message", "code"}} as msgpack.
    assert frame == bytes.fromhex((GOLDEN / "stream_error.frame.hex").read_text().strip())
    assert frame[:5] == b"\x02\x00\x00\x00\x2b"
    assert decode_error(frame[5:]) == error


def test_a_dict_document_frames_as_its_struct_does():
    # Generate's chunks are dicts holding structs; the frame is the same map either way.
    as_dict = {"request_id": "r1", "choices": golden_event().choices, "output_mode": "tokens"}
    got = decode_event(encode_event_frame(as_dict)[5:], GenerateStreamResponse)
    assert got == golden_event()


# -- round trips -----------------------------------------------------------------------------

logprob = st.floats(min_value=-9999.0, max_value=0.0, allow_nan=False)
token = st.integers(min_value=0, max_value=2**31 - 1)
contents = st.builds(
    TokenLogprobContent,
    token_id=token,
    logprob=logprob,
    rank=st.none() | st.integers(min_value=1, max_value=100),
    top_logprobs=st.lists(
        st.builds(
            TokenLogprob, token_id=token, logprob=logprob, rank=st.none() | st.integers(1, 9)
        ),
        max_size=3,
    ),
)
choices = st.builds(
    GenerateStreamChoice,
    index=st.integers(min_value=0, max_value=7),
    token_ids=st.none() | st.lists(token, max_size=6),
    logprobs=st.none() | st.builds(ChoiceLogprobs, content=st.lists(contents, max_size=3)),
    finish_reason=st.sampled_from([None, "stop", "length", "abort"]),
    stop_reason=st.none() | token | st.text(max_size=8),
)
stream_events = st.builds(
    GenerateStreamResponse,
    request_id=st.text(max_size=40),
    choices=st.lists(choices, max_size=3),
    usage=st.none()
    | st.builds(
        UsageInfo, prompt_tokens=st.integers(0, 9999), completion_tokens=st.integers(0, 99)
    ),
    prompt_token_ids=st.none() | st.lists(token, max_size=5),
)


@settings(max_examples=200, deadline=None)
@given(events=st.lists(stream_events, max_size=6), cuts=st.lists(st.integers(0, 4096), max_size=8))
def test_any_events_cut_anywhere_read_back_as_sent(events, cuts):
    body = b"".join(encode_event_frame(e) for e in events) + END_FRAME
    reader = FrameReader()
    frames = []
    at = 0
    for cut in sorted(c % (len(body) + 1) for c in cuts) + [len(body)]:
        frames += reader.feed(body[at:cut])
        at = max(at, cut)
    reader.finish()
    assert [k for k, _ in frames] == [StreamFrameKind.EVENT] * len(events) + [StreamFrameKind.END]
    assert [decode_event(p, GenerateStreamResponse) for _, p in frames[:-1]] == events
    # The same documents as the SSE events carry.
    for (_, payload), event in zip(frames, events, strict=False):
        sse = msgspec.json.decode(encode_document(event, WireFormat.JSON))
        assert msgspec.msgpack.decode(payload) == sse


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_only_raise_typed_errors(blob):
    reader = FrameReader(DecodeLimits(max_body_bytes=1024))
    try:
        for kind, payload in reader.feed(blob):
            if kind is StreamFrameKind.EVENT:
                decode_event(payload, GenerateStreamResponse)
            elif kind is StreamFrameKind.ERROR:
                decode_error(payload)
        reader.finish()
    except (MalformedFrame, PayloadTooLarge):
        pass


# -- hostile frames --------------------------------------------------------------------------


def _read(body: bytes, limits: DecodeLimits | None = None) -> list[tuple[StreamFrameKind, bytes]]:
    reader = FrameReader(limits or DecodeLimits())
    frames = reader.feed(body)
    reader.finish()
    return frames


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"\x09\x00\x00\x00\x00", "unknown kind 9"),
        (b"\x00\x00\x00\x00\x00", "unknown kind 0"),
        (GOLDEN_EVENT[:-1], "inside a frame"),
        (GOLDEN_EVENT[:3], "inside a frame"),
        (GOLDEN_EVENT, "before its last frame"),
        (b"", "before its last frame"),
        (END_FRAME + b"\x01", "after the stream's last frame"),
        (b"\x03\x00\x00\x00\x01x", "END frame carries a payload"),
    ],
)
def test_a_malformed_stream_is_a_typed_error(body, says):
    with pytest.raises(MalformedFrame, match=says) as caught:
        _read(body)
    assert caught.value.type == error_types.MALFORMED_STREAM_FRAME
    assert caught.value.status_code == 400


def test_bytes_fed_after_the_last_frame_are_refused():
    reader = FrameReader()
    assert reader.feed(END_FRAME) == [(StreamFrameKind.END, b"")]
    with pytest.raises(MalformedFrame):
        reader.feed(b"\x01")


def test_a_frame_past_the_limit_is_refused_before_its_bytes_arrive():
    reader = FrameReader(DecodeLimits(max_body_bytes=100))
    with pytest.raises(PayloadTooLarge):
        reader.feed(b"\x01\x00\x00\x00\x65")  # 101 bytes declared, none sent


@pytest.mark.parametrize(
    "payload",
    [b"\xc1", msgspec.msgpack.encode([1, 2]), msgspec.msgpack.encode({"choices": "x"})],
    ids=["not-msgpack", "not-a-map", "wrong-field"],
)
def test_a_payload_that_is_not_its_document_is_a_malformed_frame(payload):
    with pytest.raises(MalformedFrame):
        decode_event(payload, GenerateStreamResponse)
    with pytest.raises(MalformedFrame):
        decode_error(payload)


def test_a_frame_never_unpickles():
    # msgpack ext types (pickle's codes 1/2 in vLLM's serde) are no document here.
    payload = b"\xc7\x03\x01abc"
    with pytest.raises(MalformedFrame):
        decode_event(payload, GenerateStreamResponse)


# -- negotiation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept", "framed"),
    [
        (None, False),
        ("", False),
        ("*/*", False),
        ("text/event-stream", False),
        ("application/vnd.msgpack", False),
        (STREAM_CONTENT_TYPE, True),
        (f"{STREAM_CONTENT_TYPE}, application/vnd.msgpack", True),
        ("application/json, Application/VND.Tandem.Stream+Msgpack; q=0.9", True),
    ],
)
def test_only_a_caller_that_names_the_binary_stream_gets_it(accept, framed):
    assert accepts_stream_frames(accept) is framed


def test_a_stream_answer_is_recognised_by_its_content_type():
    assert is_stream_frames(STREAM_CONTENT_TYPE)
    assert not is_stream_frames("text/event-stream; charset=utf-8")
    assert not is_stream_frames(None)
