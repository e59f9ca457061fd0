"""The front door's own errors (upstreams out of reach, partial fan-outs); errors an upstream
answers are passed through unchanged, never re-raised as these."""

from __future__ import annotations

from tandem_wire import TandemHTTPError, error_types

__all__ = [
    "FrontError",
    "UpstreamUnavailable",
    "UpstreamError",
    "UpstreamTimeout",
    "UpstreamRefused",
    "ControlPartialFailure",
    "DoorBusy",
]


class FrontError(TandemHTTPError):
    """Base of the errors only the front door answers with."""


class UpstreamUnavailable(FrontError):
    """No node of the tier the request needs could be reached, or none is healthy."""

    status_code = 503
    type = error_types.UPSTREAM_UNAVAILABLE


class UpstreamError(FrontError):
    """An upstream answered with something that is not a readable answer or typed error, or
    its connection broke (reset, protocol error) before or during the answer."""

    status_code = 502
    type = error_types.UPSTREAM_ERROR


class UpstreamTimeout(FrontError):
    """An upstream took the request but did not answer within the read timeout."""

    status_code = 504
    type = error_types.UPSTREAM_TIMEOUT


class DoorBusy(FrontError):
    """The door's own connections to the tier were all in use for as long as it waits for
    one (httpx's ``PoolTimeout``): the request never left the door, and no node is blamed."""

    status_code = 503
    type = error_types.OVERLOADED


class UpstreamRefused(FrontError):
    """An upstream's typed refusal (its status, ``type`` and message) where no HTTP answer can
    pass it on unchanged: a background response, which runs on after its request."""

    def __init__(self, status_code: int, type_: str, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.type = type_


class ControlPartialFailure(FrontError):
    """A fanned-out control route failed on some generate nodes (named in ``details``)."""

    status_code = 502
    type = error_types.CONTROL_PARTIAL_FAILURE
