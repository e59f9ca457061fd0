"""One error vocabulary: each type string defined once, every service error uses one, and the
client maps each to the exception a caller expects."""

from __future__ import annotations

from pathlib import Path

import pytest

import tandem_client as tc
import tandem_front.errors as front
import tandem_generate.errors as gen
import tandem_http as http
import tandem_render.errors as render
import tandem_wire as wire
from tandem_client.errors import error_from_response
from tandem_wire import TandemHTTPError, error_types

CONSTANTS = {
    name: value
    for name, value in vars(error_types).items()
    if name.isupper() and not name.startswith("_")
}

# Every error a service raises -> the client exception it becomes. A new error class must be
# added here (test_every_service_error_is_listed), which is when its client mapping gets decided.
EXPECTED: dict[type[TandemHTTPError], type[tc.ServiceError]] = {
    # tandem_wire (the codec) and tandem_http's body limit
    wire.MalformedBody: tc.BadRequestError,
    wire.MalformedFrame: tc.BadRequestError,
    wire.MalformedBase64: tc.BadRequestError,
    wire.InvalidDocument: tc.BadRequestError,
    wire.UnsupportedExtType: tc.BadRequestError,
    wire.UnsupportedDtype: tc.BadRequestError,
    wire.ShapeMismatch: tc.BadRequestError,
    wire.InvalidFieldLayout: tc.BadRequestError,
    wire.InvalidTensorData: tc.BadRequestError,
    wire.NestingTooDeep: tc.BadRequestError,
    wire.UnsupportedWireTransform: tc.BadRequestError,
    wire.UnsupportedContentEncoding: tc.BadRequestError,
    wire.PayloadTooLarge: tc.PayloadTooLargeError,
    http.BodyTooLarge: tc.PayloadTooLargeError,
    http.BodyTimeout: tc.BadRequestError,
    # shared by both services
    http.BadRequest: tc.BadRequestError,
    http.VllmBadRequest: tc.BadRequestError,
    http.ModelNotFound: tc.ModelNotFoundError,
    http.PromptTooLong: tc.BadRequestError,
    http.TokenOutOfVocabulary: tc.BadRequestError,
    http.TooManyItems: tc.BadRequestError,
    http.MmEmbedsDisabled: tc.BadRequestError,
    http.Overloaded: tc.OverloadedError,
    http.AdminRequired: tc.AuthenticationError,
    http.ControlRoutesDisabled: tc.BadRequestError,
    # render
    render.MediaError: tc.MediaError,
    render.MediaSchemeNotAllowed: tc.MediaError,
    render.MediaUrlForbidden: tc.MediaError,
    render.MediaFetchFailed: tc.MediaError,
    render.MediaTooLarge: tc.PayloadTooLargeError,
    render.MediaNotFound: tc.MediaError,
    render.InvalidImage: tc.MediaError,
    render.ImageTooLarge: tc.PayloadTooLargeError,
    render.InvalidEmbeds: tc.BadRequestError,
    # generate
    gen.CacheMiss: tc.CacheMissError,
    gen.InvalidPlaceholders: tc.BadRequestError,
    gen.InvalidItem: tc.BadRequestError,
    gen.UnsupportedSamplingParams: tc.BadRequestError,
    gen.StructuredOutputsDisabled: tc.BadRequestError,
    gen.StructuredOutputTooLarge: tc.BadRequestError,
    gen.InvalidStructuredOutput: tc.BadRequestError,
    gen.EngineNotReady: tc.ServerError,
    gen.InvalidWeightUpdate: tc.WeightUpdateError,
    gen.WeightPathNotAllowed: tc.WeightUpdateError,
    gen.WeightUpdateConflict: tc.WeightUpdateError,
    gen.WeightUpdateIncomplete: tc.WeightUpdateError,
    gen.WeightUpdateSeqSeen: tc.WeightUpdateError,
    gen.WeightTransferNotConfigured: tc.WeightUpdateError,
    gen.WeightCheckpointUnavailable: tc.WeightUpdateError,
    gen.PrefixCacheNotReset: tc.ServerError,
    gen.RenderRefused: tc.BadRequestError,
    gen.RenderUnavailable: tc.ServerError,
    gen.RenderFailed: tc.ServerError,
    # front door
    front.UpstreamUnavailable: tc.ServerError,
    front.UpstreamError: tc.ServerError,
    front.UpstreamTimeout: tc.ServerError,
    front.DoorBusy: tc.OverloadedError,
    front.ControlPartialFailure: tc.FleetPartialFailure,
}

# Package bases: never raised themselves.
BASES = {
    TandemHTTPError,
    wire.WireError,
    render.RenderError,
    gen.GenerateError,
    front.FrontError,
}
# Errors that carry another service's refusal (its status and type, already listed above), so
# they have no type of their own to map.
PASSED_ON = {front.UpstreamRefused}
PACKAGES = ("tandem_wire", "tandem_http", "tandem_render", "tandem_generate", "tandem_front")


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


def test_every_type_constant_is_unique_and_named_after_its_value() -> None:
    assert CONSTANTS
    assert len(set(CONSTANTS.values())) == len(CONSTANTS)
    for name, value in CONSTANTS.items():
        # vLLM's own types keep vLLM's spelling (CamelCase), every other one is snake_case.
        camel = "".join(word.capitalize() for word in name.split("_"))
        assert isinstance(value, str) and value in (name.lower(), camel), name


def test_every_service_error_is_listed() -> None:
    ours = {c for c in _subclasses(TandemHTTPError) if c.__module__.startswith(PACKAGES)}
    assert ours - BASES - PASSED_ON == set(EXPECTED)


def test_a_passed_on_refusal_maps_as_the_refusal_it_carries() -> None:
    refused = front.UpstreamRefused(http.Overloaded.status_code, http.Overloaded.type, "m")
    body = {"error": {"type": refused.type, "message": "m", "code": refused.status_code}}
    exc = error_from_response(refused.status_code, body)
    assert type(exc) is EXPECTED[http.Overloaded] and exc.status_code == 429


@pytest.mark.parametrize("error", list(EXPECTED), ids=lambda c: c.__name__)
def test_service_error_uses_a_constant_and_maps_to_its_client_exception(
    error: type[TandemHTTPError],
) -> None:
    assert error.type in CONSTANTS.values()
    body = {"error": {"type": error.type, "message": "m", "code": error.status_code}}
    exc = error_from_response(error.status_code, body)
    assert type(exc) is EXPECTED[error]
    assert exc.type == error.type and exc.status_code == error.status_code


@pytest.mark.parametrize(
    ("status", "type_", "cls"),
    [
        (401, error_types.UNAUTHORIZED, tc.AuthenticationError),
        (404, error_types.NOT_FOUND, tc.BadRequestError),
        (405, error_types.METHOD_NOT_ALLOWED, tc.BadRequestError),
        (400, error_types.INVALID_REQUEST, tc.BadRequestError),
        (413, error_types.PAYLOAD_TOO_LARGE, tc.PayloadTooLargeError),
        (429, error_types.OVERLOADED, tc.OverloadedError),
        (503, error_types.UNAVAILABLE, tc.ServerError),
        (500, error_types.INTERNAL_ERROR, tc.ServerError),
    ],
)
def test_handler_types_map_to_client_exceptions(
    status: int, type_: str, cls: type[tc.ServiceError]
) -> None:
    # The types tandem_http answers with itself (API key, routing, validation, bugs).
    exc = error_from_response(status, {"error": {"type": type_, "message": "m"}})
    assert type(exc) is cls


def test_every_type_is_documented():
    # A caller who meets a type finds it in the docs (the wire, service and RL pages).
    docs = Path(__file__).resolve().parents[2] / "docs"
    text = " ".join(p.read_text() for p in docs.rglob("*.md"))
    assert sorted(v for v in CONSTANTS.values() if f"`{v}`" not in text) == []
